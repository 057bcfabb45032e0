package pgque_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	pgque "github.com/pgque/pgque/clients/go"
)

func TestProducersRunInTheCallersTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	jq, eq := qname(), qname()
	must(t, p, "SELECT pgque.create_job_queue($1)", jq)
	must(t, p, "SELECT pgque.create_queue($1)", eq)
	must(t, p, "SELECT pgque.subscribe($1, 'c')", eq)
	channel := scalar[string](t, p, "SELECT pgque.job_channel($1)", jq)

	// A listener sees the job channel's NOTIFY only at the commit.
	lc, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close(ctx)
	if _, err := lc.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	notified := func(d time.Duration) bool {
		wctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		_, err := lc.WaitForNotification(wctx)
		return err == nil
	}

	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id, err := pgque.Enqueue(ctx, tx, jq, "welcome", map[string]int{"to": 1})
	if err != nil || id <= 0 {
		t.Fatalf("Enqueue: %d, %v", id, err)
	}
	if _, err := pgque.EnqueueMany(ctx, tx, jq, []pgque.JobSpec{pgque.NewJob("a", nil), pgque.NewJob("b", nil)}); err != nil {
		t.Fatal(err)
	}
	if _, err := pgque.Send(ctx, tx, eq, map[string]int{"x": 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := pgque.SendBatch(ctx, tx, eq, []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	// Not visible to others before the caller commits.
	if st := jobStates(t, p, jq); len(st) != 0 {
		t.Fatalf("jobs visible before commit: %v", st)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if st := jobStates(t, p, jq); len(st) != 0 {
		t.Fatalf("jobs after rollback: %v", st)
	}
	if notified(500 * time.Millisecond) {
		t.Fatal("a NOTIFY after a rollback")
	}
	must(t, p, "SELECT pgque.force_tick($1)", eq)
	if n := scalar[int](t, p, "SELECT count(*)::int FROM pgque.receive($1, 'c', 100)", eq); n != 0 {
		t.Fatalf("%d events after rollback", n)
	}

	// The same calls committed: every job and event is there, and one NOTIFY came.
	tx, err = p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id, err = pgque.Enqueue(ctx, tx, jq, "welcome", map[string]int{"to": 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgque.Send(ctx, tx, eq, map[string]int{"x": 2}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !notified(5 * time.Second) {
		t.Fatal("no NOTIFY at the commit")
	}
	if st := jobStates(t, p, jq); !statesAre(st, map[string]int{"ready": 1}) {
		t.Fatalf("states after commit: %v", st)
	}
	var kind string
	var args map[string]int
	if err := p.QueryRow(ctx, "SELECT kind, args FROM pgque.get_job($1)", id).Scan(&kind, &args); err != nil {
		t.Fatal(err)
	}
	if kind != "welcome" || args["to"] != 2 {
		t.Fatalf("job %d: %s %v", id, kind, args)
	}
}

func TestEnqueueOptionsByName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_job_queue($1)", q)
	later := time.Now().Add(time.Hour)
	id, err := pgque.Enqueue(ctx, p, q, "k", map[string]int{"a": 1},
		pgque.Priority(7), pgque.MaxAttempts(3), pgque.UniqueKey("u1"), pgque.RunAt(later), pgque.Actor("t-1"))
	if err != nil {
		t.Fatal(err)
	}
	var prio, maxAtt int
	var uk, state, actor string
	var runAt time.Time
	if err := p.QueryRow(ctx, "SELECT priority, max_attempts, unique_key, state, actor, run_at FROM pgque.get_job($1)", id).
		Scan(&prio, &maxAtt, &uk, &state, &actor, &runAt); err != nil {
		t.Fatal(err)
	}
	if prio != 7 || maxAtt != 3 || uk != "u1" || state != "scheduled" || actor != "t-1" || runAt.Sub(later).Abs() > time.Millisecond {
		t.Fatalf("job: %d %d %s %s %s %s", prio, maxAtt, uk, state, actor, runAt)
	}
	// A duplicate unique key: skip returns the holder, "error" gives 23505.
	if dup, err := pgque.Enqueue(ctx, p, q, "k", nil, pgque.UniqueKey("u1")); err != nil || dup != id {
		t.Fatalf("duplicate: %d, %v (holder %d)", dup, err, id)
	}
	_, err = pgque.Enqueue(ctx, p, q, "k", nil, pgque.UniqueKey("u1"), pgque.OnDuplicate("error"))
	if !errors.Is(err, pgque.ErrDuplicateJob) || pgque.SQLState(err) != "23505" {
		t.Fatalf("on_duplicate error: %v", err)
	}
	// Param passes a parameter the server has; one it does not have is
	// refused before anything is sent: the caller's transaction stays usable.
	if _, err := pgque.Enqueue(ctx, p, q, "k", nil, pgque.Param("fairness_key", "f")); err != nil {
		t.Fatal(err)
	}
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	_, err = pgque.Enqueue(ctx, tx, q, "k", nil, pgque.Param("colour", "red"))
	var pe *pgque.Error
	if !errors.As(err, &pe) || pe.SQLState != pgque.CodeInvalidParameterValue || pe.Cause != nil {
		t.Fatalf("unknown parameter: %v", err)
	}
	if _, err := pgque.Enqueue(ctx, tx, q, "k", nil); err != nil {
		t.Fatalf("the transaction after a refused option: %v", err)
	}
	if _, err := pgque.Enqueue(ctx, tx, q, "k", nil, pgque.Param("kind", "x")); !errors.Is(err, pgque.ErrInvalidParameterValue) {
		t.Fatalf("kind given twice: %v", err)
	}
}

func TestTypedErrorsBySQLSTATE(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	_, err := pgque.Enqueue(ctx, p, "no_such_"+q, "k", nil)
	if !errors.Is(err, pgque.ErrUndefinedObject) {
		t.Fatalf("unknown queue: %v", err)
	}
	// The server's error stays reachable.
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || pg.Code != "42704" {
		t.Fatalf("no *pgconn.PgError in %v", err)
	}
	var pe *pgque.Error
	if !errors.As(err, &pe) || pe.SQLState != "42704" || pe.Message == "" {
		t.Fatalf("*pgque.Error: %+v", pe)
	}
	if errors.Is(err, pgque.ErrWrongState) || errors.Is(err, pgque.ErrServerFeatureMissing) {
		t.Fatal("one error matched another sentinel")
	}
	must(t, p, "SELECT pgque.create_job_queue($1)", q)
	if _, err := pgque.Enqueue(ctx, p, q, "", nil); !errors.Is(err, pgque.ErrInvalidParameterValue) {
		t.Fatalf("empty kind: %v", err)
	}
	if _, err := pgque.Enqueue(ctx, p, q, "k", nil, pgque.Priority(5000)); !errors.Is(err, pgque.ErrNumericValueOutOfRange) {
		t.Fatalf("priority 5000: %v", err)
	}
	if _, err := pgque.Send(ctx, p, "bad\nname; drop", map[string]int{"x": 1}); !errors.Is(err, pgque.ErrInvalidName) {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := pgque.Send(ctx, p, "no_such_"+q, map[string]int{"x": 1}); !errors.Is(err, pgque.ErrUndefinedObject) {
		t.Fatalf("send to unknown queue: %v", err)
	}
	if _, err := pgque.Enqueue(ctx, p, q, "k", json.RawMessage(`{"x":`)); !errors.Is(err, pgque.ErrInvalidJSON) {
		t.Fatalf("invalid JSON: %v", err)
	}
	// Client-side refusals of options that do not apply.
	if _, err := pgque.Send(ctx, p, q, "x", pgque.PartitionKeys([]string{"a"})); !errors.Is(err, pgque.ErrInvalidParameterValue) {
		t.Fatalf("PartitionKeys on Send: %v", err)
	}
	// Connection-level errors are not translated.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = pgque.Enqueue(cctx, p, q, "k", nil)
	if err == nil || errors.As(err, &pe) {
		t.Fatalf("a cancelled context: %v", err)
	}
}

func TestEnqueueManyInOrderWithDuplicates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_job_queue($1)", q)
	later := time.Now().Add(time.Hour)
	got, err := pgque.EnqueueMany(ctx, p, q, []pgque.JobSpec{
		pgque.NewJob("a", map[string]int{"i": 0}),
		pgque.NewJob("b", map[string]int{"i": 1}, pgque.UniqueKey("x"), pgque.Priority(3)),
		pgque.NewJob("c", nil, pgque.UniqueKey("x")),
		pgque.NewJob("d", nil, pgque.RunAt(later), pgque.MaxAttempts(2)),
	})
	if err != nil {
		t.Fatal(err)
	}
	states := []string{got[0].State, got[1].State, got[2].State, got[3].State}
	if !slices.Equal(states, []string{"ready", "ready", "duplicate", "scheduled"}) {
		t.Fatalf("states %v", states)
	}
	if !(got[0].JobID < got[1].JobID && got[2].JobID == got[1].JobID && got[3].JobID > got[1].JobID) {
		t.Fatalf("ids %v", got)
	}
	if prio := scalar[int](t, p, "SELECT priority FROM pgque.get_job($1)", got[1].JobID); prio != 3 {
		t.Fatalf("priority %d", prio)
	}
	if m := scalar[int](t, p, "SELECT max_attempts FROM pgque.get_job($1)", got[3].JobID); m != 2 {
		t.Fatalf("max_attempts %d", m)
	}
	rows, _ := p.Query(ctx, "SELECT kind FROM pgque.all_jobs WHERE queue = $1 ORDER BY id", q)
	kinds, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || !slices.Equal(kinds, []string{"a", "b", "d"}) {
		t.Fatalf("kinds %v %v", kinds, err)
	}
	if e, err := pgque.EnqueueMany(ctx, p, q, nil); err != nil || len(e) != 0 {
		t.Fatalf("empty batch: %v %v", e, err)
	}
	// on_duplicate 'error': 23505 and nothing of the batch.
	_, err = pgque.EnqueueMany(ctx, p, q, []pgque.JobSpec{pgque.NewJob("e", nil), pgque.NewJob("f", nil, pgque.UniqueKey("x"))}, pgque.OnDuplicate("error"))
	if !errors.Is(err, pgque.ErrDuplicateJob) {
		t.Fatalf("on_duplicate error: %v", err)
	}
	if n := scalar[int](t, p, "SELECT count(*)::int FROM pgque.all_jobs WHERE queue = $1", q); n != 3 {
		t.Fatalf("%d jobs after a refused batch", n)
	}
	// Options that are not per job, or of the batch, are refused.
	if _, err := pgque.EnqueueMany(ctx, p, q, []pgque.JobSpec{pgque.NewJob("a", nil, pgque.Param("colour", "red"))}); !errors.Is(err, pgque.ErrInvalidParameterValue) {
		t.Fatalf("Param in a job: %v", err)
	}
	if _, err := pgque.EnqueueMany(ctx, p, q, []pgque.JobSpec{pgque.NewJob("a", nil)}, pgque.Priority(1)); !errors.Is(err, pgque.ErrInvalidParameterValue) {
		t.Fatalf("Priority of the batch: %v", err)
	}
}

func TestEnqueueFlow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_job_queue($1)", q)
	f, err := pgque.FeaturesOf(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Flows {
		t.Fatal("the server of this tier has flows; Features says it has not")
	}
	flow, err := pgque.EnqueueFlow(ctx, p, q, []pgque.FlowJobSpec{
		{Key: "fetch", Kind: "fetch", Args: map[string]string{"day": "2026-12-01"}},
		{Key: "left", Kind: "render", DependsOn: []string{"fetch"}, Options: []pgque.EnqueueOption{pgque.Priority(2)}},
		{Key: "right", Kind: "render", DependsOn: []string{"fetch"}},
		{Key: "merge", Kind: "merge", DependsOn: []string{"left", "right"}, OnParentFailure: "run"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(flow) != 4 || flow[0].Key != "fetch" || flow[3].Key != "merge" || flow[0].FlowID != flow[3].FlowID {
		t.Fatalf("flow %v", flow)
	}
	byKey := map[string]int64{}
	for _, j := range flow {
		byKey[j.Key] = j.JobID
	}
	rows, _ := p.Query(ctx, "SELECT key FROM pgque.job_parents($1) ORDER BY key", byKey["merge"])
	parents, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || !slices.Equal(parents, []string{"left", "right"}) {
		t.Fatalf("parents of merge: %v %v", parents, err)
	}
	if prio := scalar[int](t, p, "SELECT priority FROM pgque.get_job($1)", byKey["left"]); prio != 2 {
		t.Fatalf("left's priority %d", prio)
	}
	// Only fetch is ready; the others wait for their parents.
	if st := jobStates(t, p, q); st["ready"] != 1 || st["ready"]+st["waiting"] != 4 {
		t.Fatalf("states %v", st)
	}
	// A cycle is refused, and nothing of that flow is enqueued.
	_, err = pgque.EnqueueFlow(ctx, p, q, []pgque.FlowJobSpec{
		{Key: "x", Kind: "k", DependsOn: []string{"y"}}, {Key: "y", Kind: "k", DependsOn: []string{"x"}},
	})
	if pgque.SQLState(err) == "" {
		t.Fatalf("a cycle: %v", err)
	}
	if n := scalar[int](t, p, "SELECT count(*)::int FROM pgque.all_jobs WHERE queue = $1", q); n != 4 {
		t.Fatalf("%d jobs after a refused flow", n)
	}
}

func TestSendSendBatchSendIdemSendAt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_queue($1)", q)
	must(t, p, "SELECT pgque.subscribe($1, 'c')", q)
	a, err := pgque.Send(ctx, p, q, map[string]int{"id": 1}, pgque.Type("order.created"), pgque.PartitionKey("t-1"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := pgque.Send(ctx, p, q, "plain text")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgque.SendBatch(ctx, p, q, []map[string]int{{"id": 2}, {"id": 3}}, pgque.Type("t"), pgque.PartitionKeys([]string{"k1", "k2"}))
	if err != nil || len(ids) != 2 || ids[0] >= ids[1] || ids[0] <= b {
		t.Fatalf("SendBatch: %v %v", ids, err)
	}
	k := "k3"
	nids, err := pgque.SendBatch(ctx, p, q, []string{"x", "y"}, pgque.NullablePartitionKeys([]*string{nil, &k}))
	if err != nil || len(nids) != 2 {
		t.Fatalf("SendBatch nullable keys: %v %v", nids, err)
	}
	if empty, err := pgque.SendBatch(ctx, p, q, []string{}); err != nil || len(empty) != 0 {
		t.Fatalf("empty SendBatch: %v %v", empty, err)
	}
	if _, err := pgque.SendBatch(ctx, p, q, []string{"a"}, pgque.PartitionKeys([]string{"a", "b"})); !errors.Is(err, pgque.ErrInvalidParameterValue) {
		t.Fatalf("unaligned keys: %v", err)
	}
	i1, err := pgque.SendIdem(ctx, p, q, "invoice.issue", map[string]int{"invoice": 1042}, "issue-invoice:1042")
	if err != nil || i1.Deduped {
		t.Fatalf("SendIdem: %+v %v", i1, err)
	}
	i2, err := pgque.SendIdem(ctx, p, q, "invoice.issue", map[string]int{"invoice": 1042}, "issue-invoice:1042", pgque.IdemTTL(time.Minute))
	if err != nil || !i2.Deduped || i2.EventID != i1.EventID {
		t.Fatalf("SendIdem again: %+v %v (first %+v)", i2, err, i1)
	}
	later, err := pgque.SendAt(ctx, p, q, "reminder", map[string]bool{"due": true}, time.Now().Add(time.Hour), pgque.PartitionKey("t-9"))
	if err != nil || later <= 0 {
		t.Fatalf("SendAt: %d %v", later, err)
	}
	must(t, p, "SELECT pgque.force_tick($1)", q)
	rows, err := p.Query(ctx, "SELECT msg_id, type, payload, extra1 FROM pgque.receive($1, 'c', 100) ORDER BY msg_id", q)
	if err != nil {
		t.Fatal(err)
	}
	type ev struct {
		id           int64
		typ          string
		payload, key *string
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ev, error) {
		var e ev
		return e, r.Scan(&e.id, &e.typ, &e.payload, &e.key)
	})
	if err != nil {
		t.Fatal(err)
	}
	// a, b, two of the batch, two text ones, the idem one; the send_at one is not due.
	if len(evs) != 7 {
		t.Fatalf("%d events: %+v", len(evs), evs)
	}
	if evs[0].id != a || evs[0].typ != "order.created" || *evs[0].key != "t-1" || *evs[0].payload != `{"id": 1}` {
		t.Fatalf("first event %+v", evs[0])
	}
	if evs[1].id != b || evs[1].typ != "default" || *evs[1].payload != "plain text" || evs[1].key != nil {
		t.Fatalf("text event %+v", evs[1])
	}
	if *evs[2].key != "k1" || *evs[3].key != "k2" || evs[4].key != nil || *evs[5].key != "k3" {
		t.Fatalf("batch keys %+v", evs[2:6])
	}
	if evs[6].id != i1.EventID || evs[6].typ != "invoice.issue" {
		t.Fatalf("idem event %+v", evs[6])
	}
}

func TestExplicitEventHeadersAreStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_queue($1)", q)
	must(t, p, "SELECT pgque.subscribe($1, 'c')", q)
	h := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x-tenant": "42"}
	if _, err := pgque.Send(ctx, p, q, map[string]int{"i": 1}, pgque.Headers(h)); err != nil {
		t.Fatal(err)
	}
	if _, err := pgque.Send(ctx, p, q, map[string]int{"i": 2}); err != nil {
		t.Fatal(err)
	}
	jq := qname()
	must(t, p, "SELECT pgque.create_job_queue($1)", jq)
	jid, err := pgque.Enqueue(ctx, p, jq, "k", nil, pgque.Headers(h))
	if err != nil {
		t.Fatal(err)
	}
	must(t, p, "SELECT pgque.force_tick($1)", q)
	rows, _ := p.Query(ctx, "SELECT headers FROM pgque.receive_with_headers($1, 'c', 100) ORDER BY msg_id", q)
	got, err := pgx.CollectRows(rows, pgx.RowTo[map[string]string])
	if err != nil || len(got) != 2 || got[0]["x-tenant"] != "42" || got[0]["traceparent"] != h["traceparent"] || got[1] != nil {
		t.Fatalf("event headers %v %v", got, err)
	}
	if jh := scalar[map[string]string](t, p, "SELECT headers FROM pgque.get_job($1)", jid); jh["x-tenant"] != "42" {
		t.Fatalf("job headers %v", jh)
	}
}
