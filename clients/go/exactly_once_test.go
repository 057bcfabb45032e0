package pgque_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pgque "github.com/pgque/pgque/clients/go"
)

// Exactly-once handlers: the handler's effects and the job's completion
// (or the batch's ack) commit in one transaction, and a completion the
// server refuses (lease lost, job cancelled) takes the effects back.

// effectsTable makes a table of effects for this test and returns its name.
func effectsTable(t testing.TB, p *pgxpool.Pool) string {
	t.Helper()
	name := "fx_" + qname()
	must(t, p, "CREATE TABLE "+pgx.Identifier{name}.Sanitize()+" (job_id bigint NOT NULL, attempt int)")
	return name
}

func insertEffect(ctx context.Context, tx pgx.Tx, table string, id int64, attempt int) error {
	_, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{table}.Sanitize()+" (job_id, attempt) VALUES ($1, $2)", id, attempt)
	return err
}

// effects counts the rows of table per job id.
func effects(t testing.TB, p *pgxpool.Pool, table string) map[int64]int {
	t.Helper()
	rows, err := p.Query(context.Background(), "SELECT job_id, count(*)::int FROM "+pgx.Identifier{table}.Sanitize()+" GROUP BY job_id")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]int{}
	for rows.Next() {
		var id int64
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	return out
}

func onceEach(fx map[int64]int, ids []int64) bool {
	if len(fx) != len(ids) {
		return false
	}
	for _, id := range ids {
		if fx[id] != 1 {
			return false
		}
	}
	return true
}

func TestTxHandlerEffectsCommitWithTheCompletion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_job_queue($1)", q)
	table := effectsTable(t, p)
	const n = 200
	ids := enqueueN(t, p, q, "work", n)
	boom, _ := pgque.Enqueue(ctx, p, q, "boom", nil, pgque.MaxAttempts(1))
	w, _ := pgque.NewWorker(p, []string{q}, pgque.Concurrency(4), pgque.PollInterval(200*time.Millisecond))
	var mu sync.Mutex
	invisible := 0
	w.HandleTx("work", func(ctx context.Context, j *pgque.Job, tx pgx.Tx) (any, error) {
		if err := insertEffect(ctx, tx, table, j.ID, j.Attempt); err != nil {
			return nil, err
		}
		// Inside the transaction the effect is there; outside it is not yet.
		var inside, outside int
		_ = tx.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()+" WHERE job_id = $1", j.ID).Scan(&inside)
		_ = p.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()+" WHERE job_id = $1", j.ID).Scan(&outside)
		if inside == 1 && outside == 0 {
			mu.Lock()
			invisible++
			mu.Unlock()
		}
		var a struct{ I int }
		_ = j.Decode(&a)
		return map[string]int{"i": a.I}, nil
	})
	w.HandleTx("boom", func(ctx context.Context, j *pgque.Job, tx pgx.Tx) (any, error) {
		if err := insertEffect(ctx, tx, table, j.ID, j.Attempt); err != nil {
			return nil, err
		}
		return nil, errors.New("after the insert")
	})
	running(t, w)
	waitUntil(t, 60*time.Second, "every job finished", func() bool {
		return statesAre(jobStates(t, p, q), map[string]int{"completed": n, "failed": 1})
	})
	fx := effects(t, p, table)
	if !onceEach(fx, ids) {
		t.Fatalf("effects %d rows for %d jobs (or a job twice)", len(fx), n)
	}
	mu.Lock()
	if invisible != n {
		t.Fatalf("%d of %d handlers saw their effect inside and not outside the transaction", invisible, n)
	}
	mu.Unlock()
	if s := w.Stats(); s.Completed != n || s.Failed != 1 || s.Lost != 0 {
		t.Fatalf("stats %+v", s)
	}
	if o := scalar[map[string]int](t, p, "SELECT output FROM pgque.get_job($1)", ids[7]); o["i"] != 7 {
		t.Fatalf("output %v", o)
	}
	if errs := scalar[string](t, p, "SELECT errors::text FROM pgque.get_job($1)", boom); !strings.Contains(errs, "after the insert") {
		t.Fatalf("boom's errors %s", errs)
	}
}

// The first attempt inserts, then fails: rolled back, failed in its own
// statement, retried; the second attempt's insert is the only row.
func TestTxHandlerErrorRollsBackAndTheRetryCommitsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_job_queue($1)", q)
	table := effectsTable(t, p)
	jid, _ := pgque.Enqueue(ctx, p, q, "flaky", nil)
	w, _ := pgque.NewWorker(p, []string{q}, pgque.Concurrency(1), pgque.PollInterval(200*time.Millisecond))
	w.HandleTx("flaky", func(ctx context.Context, j *pgque.Job, tx pgx.Tx) (any, error) {
		if err := insertEffect(ctx, tx, table, j.ID, j.Attempt); err != nil {
			return nil, err
		}
		if j.Attempt == 1 {
			return nil, errors.New("boom after the insert")
		}
		return map[string]int{"attempt": j.Attempt}, nil
	})
	running(t, w)
	waitUntil(t, 30*time.Second, "the retry completed", func() bool {
		return statesAre(jobStates(t, p, q), map[string]int{"completed": 1})
	})
	rows, _ := p.Query(ctx, "SELECT job_id, attempt FROM "+pgx.Identifier{table}.Sanitize())
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]int64, error) {
		var a [2]int64
		return a, r.Scan(&a[0], &a[1])
	})
	if err != nil || len(got) != 1 || got[0] != [2]int64{jid, 2} {
		t.Fatalf("effects %v %v", got, err)
	}
	var attempt int
	var out map[string]int
	var errs string
	if err := p.QueryRow(ctx, "SELECT attempt, output, errors::text FROM pgque.get_job($1)", jid).Scan(&attempt, &out, &errs); err != nil {
		t.Fatal(err)
	}
	if attempt != 2 || out["attempt"] != 2 || !strings.Contains(errs, "boom after the insert") {
		t.Fatalf("%d %v %s", attempt, out, errs)
	}
	if s := w.Stats(); s != (pgque.WorkerStats{Completed: 1, Failed: 1}) {
		t.Fatalf("stats %+v", s)
	}
}

// A 1 s lease, no heartbeats, a first attempt that sleeps 3 s: the rescue
// hands the jobs to a second worker, which completes them; the first
// handlers' completions are refused and their inserts rolled back.
func TestTxHandlerLeaseLostRollsTheEffectsBack(t *testing.T) {
	t.Parallel()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_job_queue($1)", q)
	must(t, p, "SELECT pgque.set_job_queue_config($1, 'max_attempts', '10')", q)
	table := effectsTable(t, p)
	ids := enqueueN(t, p, q, "slow", 3)
	opts := []pgque.Option{pgque.Concurrency(3), pgque.PollInterval(100 * time.Millisecond), pgque.Lease(time.Second),
		pgque.HeartbeatInterval(time.Hour), pgque.Logger(quiet)}
	slow, _ := pgque.NewWorker(p, []string{q}, opts...)
	fast, _ := pgque.NewWorker(p, []string{q}, opts...)
	slow.HandleTx("slow", func(ctx context.Context, j *pgque.Job, tx pgx.Tx) (any, error) {
		if err := insertEffect(ctx, tx, table, j.ID, j.Attempt); err != nil {
			return nil, err
		}
		time.Sleep(3 * time.Second) // past the 1 s lease: the rescue takes the job meanwhile
		return nil, nil
	})
	fast.HandleTx("slow", func(ctx context.Context, j *pgque.Job, tx pgx.Tx) (any, error) {
		return nil, insertEffect(ctx, tx, table, j.ID, j.Attempt)
	})
	running(t, slow)
	waitUntil(t, 10*time.Second, "the slow worker holds the jobs", func() bool { return jobStates(t, p, q)["running"] == 3 })
	running(t, fast)
	waitUntil(t, 30*time.Second, "the second worker completed the rescued jobs", func() bool { return fast.Stats().Completed == 3 })
	waitUntil(t, 30*time.Second, "the first worker's completions refused", func() bool { return slow.Stats().Lost == 3 })
	if st := jobStates(t, p, q); !statesAre(st, map[string]int{"completed": 3}) {
		t.Fatalf("states %v", st)
	}
	if slow.Stats().Completed != 0 {
		t.Fatalf("slow worker stats %+v", slow.Stats())
	}
	if fx := effects(t, p, table); !onceEach(fx, ids) {
		t.Fatalf("effects %v", fx)
	}
	rows, _ := p.Query(context.Background(), "SELECT DISTINCT attempt FROM "+pgx.Identifier{table}.Sanitize())
	attempts, _ := pgx.CollectRows(rows, pgx.RowTo[int])
	if !slices.Equal(attempts, []int{2}) {
		t.Fatalf("only the second attempts' effects may remain: %v", attempts)
	}
}

// The Consumer's transactional form: each event's insert commits with the
// batch's ack; a handler that fails after its insert takes back only its
// own insert (a savepoint) and nacks the event, which comes back once.
func TestConsumerTxBatchEffectsCommitWithItsAck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_queue($1)", q)
	must(t, p, "SELECT pgque.subscribe($1, 'c1')", q)
	table := effectsTable(t, p)
	payloads := make([]map[string]int, 30)
	for i := range payloads {
		payloads[i] = map[string]int{"i": i}
	}
	ids, err := pgque.SendBatch(ctx, p, q, payloads, pgque.Type("t"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgque.NewConsumerTx(p, q, "c1", func(ctx context.Context, m *pgque.Message, tx pgx.Tx) error {
		if err := insertEffect(ctx, tx, table, m.MsgID, m.RetryCount); err != nil {
			return err
		}
		var v struct{ I int }
		if err := m.JSON(&v); err != nil {
			return err
		}
		if v.I == 7 && m.RetryCount == 0 {
			return errors.New("first delivery of 7 fails after its insert")
		}
		return nil
	}, pgque.PollInterval(200*time.Millisecond), pgque.RetryAfter(0))
	if err != nil {
		t.Fatal(err)
	}
	running(t, c)
	must(t, p, "SELECT pgque.force_tick($1)", q)
	waitUntil(t, 30*time.Second, "every event's effect", func() bool { return len(effects(t, p, table)) == 30 })
	if fx := effects(t, p, table); !onceEach(fx, ids) {
		t.Fatalf("effects %v", fx)
	}
	if a := scalar[int](t, p, "SELECT attempt FROM "+pgx.Identifier{table}.Sanitize()+" WHERE job_id = $1", ids[7]); a != 1 {
		t.Fatalf("event 7's effect is of retry_count %d, want 1", a)
	}
}

// One slot, a 1 s lease: the handler of the third event sleeps past it and
// a thief claims the slot meanwhile. The worker notices at its next
// renewal: the batch's inserts so far are rolled back. When the thief's
// lease lapses the worker takes the slot again and handles the same batch:
// one row per event in the end.
func TestPartitionedTxSlotLostMidBatchRollsTheBatchBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_queue($1)", q)
	must(t, p, "SELECT pgque.subscribe_partitioned($1, 'pc', 1)", q)
	table := effectsTable(t, p)
	payloads := make([]map[string]int, 6)
	keys := make([]string, 6)
	for i := range payloads {
		payloads[i], keys[i] = map[string]int{"i": i}, "k"
	}
	ids, err := pgque.SendBatch(ctx, p, q, payloads, pgque.Type("t"), pgque.PartitionKeys(keys))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var calls []int64
	stolen := false
	var visibleBeforeCommit = -1
	pc, err := pgque.NewPartitionedConsumerTx(p, q, "pc", 1, func(ctx context.Context, m *pgque.Message, tx pgx.Tx) error {
		mu.Lock()
		calls = append(calls, m.MsgID)
		mu.Unlock()
		if err := insertEffect(ctx, tx, table, m.MsgID, m.RetryCount); err != nil {
			return err
		}
		var v struct{ I int }
		_ = m.JSON(&v)
		mu.Lock()
		first := v.I == 2 && !stolen
		mu.Unlock()
		if first {
			time.Sleep(1300 * time.Millisecond) // past the 1 s lease
			var epoch *int64
			if err := p.QueryRow(ctx, "SELECT pgque.claim_slot($1, 'pc', 0, 'thief', '1 second')", q).Scan(&epoch); err != nil || epoch == nil {
				t.Errorf("the thief's claim: %v %v", epoch, err)
			}
			mu.Lock()
			stolen = true
			visibleBeforeCommit = len(effects(t, p, table))
			mu.Unlock()
		}
		return nil
	}, pgque.Workers(1), pgque.TTL(time.Second), pgque.PollInterval(200*time.Millisecond), pgque.WorkerID("A"), pgque.Logger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	running(t, pc)
	must(t, p, "SELECT pgque.force_tick($1)", q)
	waitUntil(t, 30*time.Second, "the batch handled again and committed", func() bool { return len(effects(t, p, table)) == 6 })
	mu.Lock()
	defer mu.Unlock()
	if !stolen || pc.LostSlots() < 1 || visibleBeforeCommit != 0 {
		t.Fatalf("stolen %v, lost slots %d, effects visible before the commit %d", stolen, pc.LostSlots(), visibleBeforeCommit)
	}
	// The first try stopped after the third event; the second did all six.
	if len(calls) != 9 || !slices.Equal(calls[:3], ids[:3]) || !slices.Equal(calls[3:], ids) {
		t.Fatalf("calls %v, ids %v", calls, ids)
	}
	if fx := effects(t, p, table); !onceEach(fx, ids) {
		t.Fatalf("effects %v", fx)
	}
}
