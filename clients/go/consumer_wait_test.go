package pgque_test

// The Consumer on the waiting receive (docs/waits.md): it waits inside the
// server (an Extension wait event, no LISTEN), gets an event sent by
// another connection quickly, returns promptly when its context ends while
// it waits, caps its wait under statement_timeout, and LISTENs and polls
// with WaitTimeout(0) and on a server without the waits (a 0.8.0 schema).

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pgque "github.com/pgque/pgque/clients/go"
)

// appPool is a pool on db (the test database when "") whose connections
// are named app in pg_stat_activity, with extra runtime parameters.
func appPool(t testing.TB, db, app string, params map[string]string) *pgxpool.Pool {
	t.Helper()
	d := dsn
	if db != "" {
		d = strings.Replace(dsn, "dbname="+testDB, "dbname="+db, 1)
	}
	cfg, err := pgxpool.ParseConfig(d)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

type backend struct {
	state, waitType, query string
}

func backends(t testing.TB, p *pgxpool.Pool, app string) []backend {
	t.Helper()
	rows, err := p.Query(context.Background(),
		"SELECT coalesce(state, ''), coalesce(wait_event_type, ''), query FROM pg_stat_activity WHERE application_name = $1", app)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (backend, error) {
		var b backend
		return b, r.Scan(&b.state, &b.waitType, &b.query)
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func waitingInServer(t testing.TB, p *pgxpool.Pool, app string) bool {
	for _, b := range backends(t, p, app) {
		if b.state == "active" && b.waitType == "Extension" {
			return true
		}
	}
	return false
}

func listening(t testing.TB, p *pgxpool.Pool, app string) bool {
	for _, b := range backends(t, p, app) {
		if strings.HasPrefix(b.query, "LISTEN") {
			return true
		}
	}
	return false
}

// seenAt records the handled events and when.
type seenAt struct {
	mu  sync.Mutex
	ids []int64
	at  []time.Time
}

func (s *seenAt) handler(_ context.Context, m *pgque.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids, s.at = append(s.ids, m.MsgID), append(s.at, time.Now())
	return nil
}

func (s *seenAt) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

func TestConsumerWaitsInTheServerAndGetsAnEventQuickly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_queue($1)", q)
	app := "go_wait_" + q
	var seen seenAt
	c, err := pgque.NewConsumer(appPool(t, "", app, nil), q, "c1", seen.handler)
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, c)
	waitUntil(t, 10*time.Second, "the consumer waiting in the server", func() bool { return waitingInServer(t, p, app) })
	if !c.ServerWaits() {
		t.Fatal("ServerWaits is false")
	}
	if listening(t, p, app) {
		t.Fatalf("a LISTEN connection: %+v", backends(t, p, app))
	}
	var lat []time.Duration
	for i := range 3 {
		t0 := time.Now()
		if _, err := pgque.Send(ctx, p, q, map[string]int{"i": i}); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, 10*time.Second, "the event handled", func() bool { return seen.len() > i })
		seen.mu.Lock()
		lat = append(lat, seen.at[i].Sub(t0))
		seen.mu.Unlock()
		waitUntil(t, 10*time.Second, "waiting again", func() bool { return waitingInServer(t, p, app) })
	}
	t.Logf("waiting receive latency (commit -> handler): %v", lat)
	for _, l := range lat {
		if l > time.Second {
			t.Fatalf("latencies %v", lat)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestConsumerContextEndWhileWaitingCancelsTheWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_queue($1)", q)
	app := "go_stop_" + q
	ap := appPool(t, "", app, nil)
	var seen seenAt
	c, err := pgque.NewConsumer(ap, q, "c1", seen.handler, pgque.WaitTimeout(9*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, c)
	waitUntil(t, 10*time.Second, "the consumer waiting in the server", func() bool { return waitingInServer(t, p, app) })
	time.Sleep(300 * time.Millisecond) // well inside the 9 s wait
	t0 := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 2*time.Second {
		t.Fatalf("Run took %s to return", took)
	}
	if waitingInServer(t, p, app) {
		t.Fatalf("still waiting: %+v", backends(t, p, app))
	}
	// The pool's connection is healthy after the cancel: the next run reads on.
	stop = running(t, c)
	waitUntil(t, 10*time.Second, "waiting again", func() bool { return waitingInServer(t, p, app) })
	id, err := pgque.Send(ctx, p, q, map[string]int{})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the event handled", func() bool { return seen.len() == 1 })
	if seen.ids[0] != id {
		t.Fatalf("handled %v, sent %d", seen.ids, id)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := ap.Stat(); st.TotalConns() < 1 {
		t.Fatalf("the pool lost its connections: %+v", st)
	}
}

func TestConsumerWaitIsCappedUnderStatementTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_queue($1)", q)
	app := "go_stmt_" + q
	var seen seenAt
	var logged lockedBuffer
	c, err := pgque.NewConsumer(appPool(t, "", app, map[string]string{"statement_timeout": "1000"}), q, "c1", seen.handler,
		pgque.Logger(slog.New(slog.NewTextHandler(&logged, nil))))
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, c)
	waitUntil(t, 10*time.Second, "the consumer waiting in the server", func() bool { return waitingInServer(t, p, app) })
	// Five waits' ends; two timeouts had the wait not been capped (a
	// cancelled receive is logged and retried in 1 s).
	time.Sleep(2500 * time.Millisecond)
	id, err := pgque.Send(ctx, p, q, map[string]int{})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the event handled", func() bool { return seen.len() == 1 })
	if seen.ids[0] != id || !c.ServerWaits() {
		t.Fatalf("handled %v (sent %d), ServerWaits %v", seen.ids, id, c.ServerWaits())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if out := logged.String(); out != "" {
		t.Fatalf("the consumer logged: %s", out)
	}
}

// lockedBuffer is a bytes.Buffer for a logger used from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestConsumerWaitTimeoutZeroListensAndPolls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_queue($1)", q)
	app := "go_nowait_" + q
	var seen seenAt
	c, err := pgque.NewConsumer(appPool(t, "", app, nil), q, "c1", seen.handler,
		pgque.WaitTimeout(0), pgque.PollInterval(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, c)
	waitUntil(t, 10*time.Second, "the consumer's LISTEN", func() bool { return listening(t, p, app) })
	time.Sleep(300 * time.Millisecond)
	if c.ServerWaits() || waitingInServer(t, p, app) {
		t.Fatalf("ServerWaits %v, backends %+v", c.ServerWaits(), backends(t, p, app))
	}
	if _, err := pgque.Send(ctx, p, q, map[string]int{}); err != nil {
		t.Fatal(err)
	}
	// a one-minute poll: only the tick's NOTIFY wakes it in time
	waitUntil(t, 10*time.Second, "the event handled", func() bool { return seen.len() == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestConsumerOnAServerWithoutTheWaitsListensAndPolls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := "pgque_go_080_" + strings.TrimPrefix(qname(), "go_")
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
	app := "go_old_" + strings.TrimPrefix(qname(), "go_")
	p := appPool(t, db, app+"_test", nil)
	must(t, p, "CREATE EXTENSION pgque VERSION '0.8.0'")
	q := qname()
	must(t, p, "SELECT pgque.create_queue($1)", q)
	var seen seenAt
	cp := appPool(t, db, app, nil)
	f, err := pgque.FeaturesOf(ctx, cp)
	if err != nil {
		t.Fatal(err)
	}
	if f.ReceiveWait || f.ReceiveWithHeadersWait {
		t.Fatalf("0.8.0 features %+v", f)
	}
	c, err := pgque.NewConsumer(cp, q, "c1", seen.handler, pgque.PollInterval(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, c)
	waitUntil(t, 10*time.Second, "the consumer's LISTEN", func() bool { return listening(t, p, app) })
	if c.ServerWaits() {
		t.Fatal("ServerWaits on a 0.8.0 schema")
	}
	if _, err := pgque.Send(ctx, p, q, map[string]int{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the event handled", func() bool { return seen.len() == 1 })
	if waitingInServer(t, p, app) {
		t.Fatalf("waiting in the server on a 0.8.0 schema: %+v", backends(t, p, app))
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
