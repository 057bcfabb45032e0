package pgque_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pgque "github.com/pgque/pgque/clients/go"
)

// A 0.7.0 schema (before job and event headers and the *_with_headers
// receives): the client detects what the server lacks and keeps working,
// also with tracing on: the plain overloads, dispatch without headers, and
// a consumer that falls back from receive_with_headers once (42883).
func TestA070SchemaKeepsWorking(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := "pgque_go_070_" + strings.TrimPrefix(qname(), "go_")
	admin, err := pgx.Connect(ctx, strings.Replace(dsn, "dbname="+testDB, "dbname=postgres", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)")
	})
	cfg, err := pgxpool.ParseConfig(strings.Replace(dsn, "dbname="+testDB, "dbname="+db, 1))
	if err != nil {
		t.Fatal(err)
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	must(t, p, "CREATE EXTENSION pgque VERSION '0.7.0'")
	eq, jq := qname(), qname()
	must(t, p, "SELECT pgque.create_queue($1)", eq)
	must(t, p, "SELECT pgque.subscribe($1, 'c')", eq)
	must(t, p, "SELECT pgque.create_job_queue($1)", jq)

	f, err := pgque.FeaturesOf(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if f.Headers || f.EventHeaders || !f.Outputs || !f.Flows || !f.JobChannel {
		t.Fatalf("0.7.0 features %+v", f)
	}
	tp, exp := newTracer()
	tr := pgque.TracerProvider(tp)
	var ids []int64
	id, err := pgque.Send(ctx, p, eq, map[string]int{"i": 0}, pgque.PartitionKey("k"), tr)
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, id)
	batch, err := pgque.SendBatch(ctx, p, eq, []string{"a", "b"}, tr)
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, batch...)
	idem, err := pgque.SendIdem(ctx, p, eq, "t", "x", "key-1", tr)
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, idem.EventID)
	if _, err := pgque.SendAt(ctx, p, eq, "t", "later", time.Now().Add(time.Hour), tr); err != nil {
		t.Fatal(err)
	}
	if _, err := pgque.Send(ctx, p, eq, "x", pgque.Headers(map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})); !errors.Is(err, pgque.ErrServerFeatureMissing) {
		t.Fatalf("explicit event headers on 0.7.0: %v", err)
	}
	if len(spansNamed(exp, "send "+eq)) != 4 {
		t.Fatalf("%d send spans", len(spansNamed(exp, "send "+eq)))
	}
	jid, err := pgque.Enqueue(ctx, p, jq, "k", nil, tr)
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var seen []int64
	c, _ := pgque.NewConsumer(p, eq, "c", func(ctx context.Context, m *pgque.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if m.Headers != nil {
			t.Errorf("headers from a 0.7.0 server: %v", m.Headers)
		}
		seen = append(seen, m.MsgID)
		return nil
	}, pgque.PollInterval(200*time.Millisecond), tr)
	running(t, c)
	w, _ := pgque.NewWorker(p, []string{jq}, pgque.PollInterval(200*time.Millisecond), tr)
	w.Handle("k", func(ctx context.Context, j *pgque.Job) (any, error) { return map[string]bool{"ok": true}, nil })
	running(t, w)
	must(t, p, "SELECT pgque.force_tick($1)", eq)
	waitUntil(t, 30*time.Second, "the events handled and the job completed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == len(ids) && w.Stats().Completed == 1
	})
	if o := scalar[map[string]bool](t, p, "SELECT output FROM pgque.get_job($1)", jid); !o["ok"] {
		t.Fatalf("output %v", o)
	}
	if n := len(spansNamed(exp, "process "+eq)); n != len(ids) {
		t.Fatalf("%d event process spans", n)
	}
}
