package pgque_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pgque "github.com/pgque/pgque/clients/go"
)

func enqueueN(t testing.TB, p *pgxpool.Pool, q, kind string, n int) []int64 {
	t.Helper()
	jobs := make([]pgque.JobSpec, n)
	for i := range jobs {
		jobs[i] = pgque.NewJob(kind, map[string]int{"i": i})
	}
	got, err := pgque.EnqueueMany(context.Background(), p, q, jobs)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int64, n)
	for i, e := range got {
		ids[i] = e.JobID
	}
	return ids
}

func TestWorkersRunEachJobOnceWithOutputs(t *testing.T) {
	t.Parallel()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_job_queue($1)", q)
	const n = 300
	ids := enqueueN(t, p, q, "work", n)
	var mu sync.Mutex
	seen := map[int64]int{}
	active, peak := 0, 0
	work := func(ctx context.Context, j *pgque.Job) (any, error) {
		var a struct{ I int }
		if err := j.Decode(&a); err != nil {
			return nil, err
		}
		mu.Lock()
		seen[j.ID]++
		active++
		peak = max(peak, active)
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		active--
		mu.Unlock()
		return map[string]int{"i": a.I}, nil
	}
	// Two workers of 4 handlers compete for one queue: 8 handlers.
	var ws []*pgque.Worker
	for range 2 {
		w, err := pgque.NewWorker(p, []string{q}, pgque.Concurrency(4), pgque.PollInterval(200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		w.Handle("work", work)
		ws = append(ws, w)
		running(t, w)
	}
	waitUntil(t, 60*time.Second, "every job completed", func() bool {
		return statesAre(jobStates(t, p, q), map[string]int{"completed": n})
	})
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != n {
		t.Fatalf("%d jobs handled, want %d", len(seen), n)
	}
	for id, c := range seen {
		if c != 1 {
			t.Fatalf("job %d ran %d times", id, c)
		}
	}
	if peak != 8 {
		t.Fatalf("expected 8 handlers at once, saw %d", peak)
	}
	if got := ws[0].Stats().Completed + ws[1].Stats().Completed; got != n {
		t.Fatalf("Stats().Completed %d, want %d", got, n)
	}
	var out map[string]int
	if err := p.QueryRow(context.Background(), "SELECT output FROM pgque.get_job($1)", ids[17]).Scan(&out); err != nil || out["i"] != 17 {
		t.Fatalf("output of job 17: %v %v", out, err)
	}
}

func TestFailingHandlerIsRetriedWithItsError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_job_queue($1)", q)
	flaky, _ := pgque.Enqueue(ctx, p, q, "flaky", nil)
	doomed, _ := pgque.Enqueue(ctx, p, q, "doomed", nil, pgque.MaxAttempts(1))
	panics, _ := pgque.Enqueue(ctx, p, q, "panics", nil, pgque.MaxAttempts(1))
	orphan, _ := pgque.Enqueue(ctx, p, q, "no_handler_for_this", nil, pgque.MaxAttempts(1))
	var mu sync.Mutex
	attempts := map[int64][]int{}
	w, err := pgque.NewWorker(p, []string{q}, pgque.Concurrency(2), pgque.PollInterval(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	w.Handle("flaky", func(ctx context.Context, j *pgque.Job) (any, error) {
		mu.Lock()
		attempts[j.ID] = append(attempts[j.ID], j.Attempt)
		mu.Unlock()
		if j.Attempt == 1 {
			return nil, errors.New("boom on the first attempt")
		}
		return "ok", nil
	})
	w.Handle("doomed", func(ctx context.Context, j *pgque.Job) (any, error) {
		mu.Lock()
		attempts[j.ID] = append(attempts[j.ID], j.Attempt)
		mu.Unlock()
		return nil, fmt.Errorf("always: %w", os.ErrPermission)
	})
	w.Handle("panics", func(ctx context.Context, j *pgque.Job) (any, error) {
		var m map[string]int
		m["x"] = 1 // a nil map: a panic
		return nil, nil
	})
	running(t, w)
	waitUntil(t, 30*time.Second, "the retry and the failures", func() bool {
		return statesAre(jobStates(t, p, q), map[string]int{"completed": 1, "failed": 3})
	})
	mu.Lock()
	if fmt.Sprint(attempts[flaky]) != "[1 2]" || fmt.Sprint(attempts[doomed]) != "[1]" {
		t.Fatalf("attempts %v", attempts)
	}
	mu.Unlock()
	errs := scalar[string](t, p, "SELECT errors::text FROM pgque.get_job($1)", flaky)
	if !strings.Contains(errs, "boom on the first attempt") {
		t.Fatalf("flaky's errors %s", errs)
	}
	if o := scalar[string](t, p, "SELECT output::text FROM pgque.get_job($1)", flaky); o != `"ok"` {
		t.Fatalf("flaky's output %s", o)
	}
	if errs := scalar[string](t, p, "SELECT errors::text FROM pgque.get_job($1)", doomed); !strings.Contains(errs, "always: permission denied") {
		t.Fatalf("doomed's errors %s", errs)
	}
	errs = scalar[string](t, p, "SELECT errors::text FROM pgque.get_job($1)", panics)
	if !strings.Contains(errs, "panic: assignment to entry in nil map") || !strings.Contains(errs, "worker_test.go") {
		t.Fatalf("a panic's error should carry the panic and its stack: %s", errs)
	}
	errs = scalar[string](t, p, "SELECT errors::text FROM pgque.get_job($1)", orphan)
	if !strings.Contains(errs, "no handler for job kind") {
		t.Fatalf("orphan's errors %s", errs)
	}
	if s := w.Stats(); s.Completed != 1 || s.Failed != 4 {
		t.Fatalf("stats %+v", s)
	}
}

// A 2 s lease and a 4 s handler: with heartbeats it runs once; without
// (the control) the server's rescue hands the job out again meanwhile.
func TestHeartbeatsKeepALongHandlerAlive(t *testing.T) {
	for _, beats := range []bool{true, false} {
		t.Run(fmt.Sprintf("heartbeats=%v", beats), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			p := newPool(t)
			q := qname()
			must(t, p, "SELECT pgque.create_job_queue($1)", q)
			jid, _ := pgque.Enqueue(ctx, p, q, "long", nil)
			hb := 500 * time.Millisecond
			if !beats {
				hb = time.Hour
			}
			var mu sync.Mutex
			var runs []int
			w, err := pgque.NewWorker(p, []string{q}, pgque.Concurrency(2), pgque.Lease(2*time.Second),
				pgque.HeartbeatInterval(hb), pgque.PollInterval(200*time.Millisecond), pgque.ShutdownTimeout(500*time.Millisecond), pgque.Logger(quiet))
			if err != nil {
				t.Fatal(err)
			}
			w.Handle("long", func(ctx context.Context, j *pgque.Job) (any, error) {
				mu.Lock()
				runs = append(runs, j.Attempt)
				mu.Unlock()
				time.Sleep(4 * time.Second)
				return nil, nil
			})
			stop := running(t, w)
			if beats {
				waitUntil(t, 30*time.Second, "completion", func() bool { return jobStates(t, p, q)["completed"] == 1 })
			} else {
				waitUntil(t, 30*time.Second, "a second run after the rescue", func() bool {
					mu.Lock()
					defer mu.Unlock()
					return len(runs) >= 2
				})
			}
			_ = stop()
			mu.Lock()
			defer mu.Unlock()
			if beats {
				var state string
				var attempt int
				if err := p.QueryRow(ctx, "SELECT state, attempt FROM pgque.get_job($1)", jid).Scan(&state, &attempt); err != nil {
					t.Fatal(err)
				}
				if fmt.Sprint(runs) != "[1]" || state != "completed" || attempt != 1 {
					t.Fatalf("runs %v, %s attempt %d", runs, state, attempt)
				}
			} else if runs[0] != 1 || runs[1] != 2 {
				t.Fatalf("runs %v", runs)
			}
		})
	}
}

// A cancel of a running job reaches its handler: the next heartbeat leaves
// the job out, the handler's context ends with ErrJobCancelled, and the
// completion is refused.
func TestCancelReachesTheHandlersContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_job_queue($1)", q)
	jid, _ := pgque.Enqueue(ctx, p, q, "long", nil)
	started := make(chan struct{})
	cause := make(chan error, 1)
	w, err := pgque.NewWorker(p, []string{q}, pgque.Concurrency(1), pgque.HeartbeatInterval(200*time.Millisecond), pgque.PollInterval(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var sawCancelled atomic.Bool
	w.Handle("long", func(ctx context.Context, j *pgque.Job) (any, error) {
		close(started)
		select {
		case <-ctx.Done():
			sawCancelled.Store(j.Cancelled())
			cause <- context.Cause(ctx)
		case <-time.After(20 * time.Second):
			cause <- nil
		}
		return map[string]bool{"should": false}, nil
	})
	running(t, w)
	<-started
	if !scalar[bool](t, p, "SELECT pgque.cancel($1)", jid) {
		t.Fatal("cancel returned false")
	}
	if c := <-cause; !errors.Is(c, pgque.ErrJobCancelled) || !sawCancelled.Load() {
		t.Fatalf("the handler's context cause: %v (Cancelled %v)", c, sawCancelled.Load())
	}
	waitUntil(t, 10*time.Second, "the refused completion", func() bool { return w.Stats().Lost == 1 })
	var state string
	var out *string
	if err := p.QueryRow(ctx, "SELECT state, output::text FROM pgque.get_job($1)", jid).Scan(&state, &out); err != nil {
		t.Fatal(err)
	}
	if state != "cancelled" || out != nil || w.Stats().Completed != 0 {
		t.Fatalf("%s %v %+v", state, out, w.Stats())
	}
}

// With a 60 s poll interval only the NOTIFY can wake the worker in time.
func TestListenWakesAnIdleWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_job_queue($1)", q)
	got := make(chan time.Time, 10)
	w, err := pgque.NewWorker(p, []string{q}, pgque.Concurrency(1), pgque.PollInterval(60*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	w.Handle("ping", func(ctx context.Context, j *pgque.Job) (any, error) {
		got <- time.Now()
		return nil, nil
	})
	running(t, w)
	time.Sleep(time.Second) // idle: the worker sleeps on its 60 s poll
	var worst time.Duration
	for i := range 5 {
		t0 := time.Now()
		if _, err := pgque.Enqueue(ctx, p, q, "ping", map[string]int{"i": i}); err != nil {
			t.Fatal(err)
		}
		select {
		case at := <-got:
			worst = max(worst, at.Sub(t0))
		case <-time.After(10 * time.Second):
			t.Fatalf("job %d not handled within 10 s: no wake-up by NOTIFY", i)
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Logf("LISTEN wake-up latency (commit -> handler): max %s", worst)
}

func TestOutputsAndProgress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_job_queue($1)", q)
	jid, _ := pgque.Enqueue(ctx, p, q, "calc", map[string]int{"x": 20})
	f, err := pgque.FeaturesOf(ctx, p)
	if err != nil || !f.Progress || !f.Outputs {
		t.Fatalf("the tier's server has progress and outputs: %+v %v", f, err)
	}
	progress := make(chan bool, 1)
	w, _ := pgque.NewWorker(p, []string{q}, pgque.Concurrency(1), pgque.PollInterval(200*time.Millisecond))
	w.Handle("calc", func(ctx context.Context, j *pgque.Job) (any, error) {
		ok, err := j.Progress(ctx, map[string]int{"pct": 50})
		if err != nil {
			return nil, err
		}
		progress <- ok
		var a struct{ X int }
		_ = j.Decode(&a)
		return map[string]int{"y": a.X * 2}, nil
	})
	running(t, w)
	waitUntil(t, 30*time.Second, "completion", func() bool { return statesAre(jobStates(t, p, q), map[string]int{"completed": 1}) })
	if !<-progress {
		t.Fatal("set_progress refused")
	}
	var out, prog map[string]int
	if err := p.QueryRow(ctx, "SELECT output, progress FROM pgque.get_job($1)", jid).Scan(&out, &prog); err != nil {
		t.Fatal(err)
	}
	if out["y"] != 40 || prog["pct"] != 50 {
		t.Fatalf("output %v progress %v", out, prog)
	}
}

func TestDrainHandsBackJobsPastTheTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_job_queue($1)", q)
	jid, _ := pgque.Enqueue(ctx, p, q, "stuck", nil)
	fast, _ := pgque.Enqueue(ctx, p, q, "quick", nil)
	started := make(chan struct{})
	release := make(chan struct{})
	handedBack := make(chan error, 1)
	w, _ := pgque.NewWorker(p, []string{q}, pgque.Concurrency(2), pgque.PollInterval(200*time.Millisecond),
		pgque.ShutdownTimeout(500*time.Millisecond), pgque.Logger(quiet))
	w.Handle("stuck", func(ctx context.Context, j *pgque.Job) (any, error) {
		close(started)
		<-ctx.Done()
		handedBack <- context.Cause(ctx)
		<-release
		return nil, nil
	})
	quickDone := make(chan struct{})
	w.Handle("quick", func(ctx context.Context, j *pgque.Job) (any, error) {
		<-started // runs beside the stuck one, and finishes during the drain
		time.Sleep(200 * time.Millisecond)
		close(quickDone)
		return nil, nil
	})
	stop := running(t, w)
	<-started
	t0 := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("Run after a drain: %v", err)
	}
	took := time.Since(t0)
	close(release)
	if c := <-handedBack; !errors.Is(c, pgque.ErrHandedBack) {
		t.Fatalf("the stuck handler's context cause: %v", c)
	}
	<-quickDone
	if took < 450*time.Millisecond || took > 10*time.Second {
		t.Fatalf("the drain took %s with a 500 ms timeout", took)
	}
	// The quick job finished inside the timeout: its completion was sent.
	if st := scalar[string](t, p, "SELECT state FROM pgque.get_job($1)", fast); st != "completed" {
		t.Fatalf("the job finished in the drain: %s", st)
	}
	if st := scalar[string](t, p, "SELECT state FROM pgque.get_job($1)", jid); st != "ready" && st != "scheduled" {
		t.Fatalf("handed-back job: %s", st)
	}
	// Handed back: the next worker runs it at once, and the attempt was not consumed.
	again := make(chan int, 1)
	w2, _ := pgque.NewWorker(p, []string{q}, pgque.Concurrency(1), pgque.PollInterval(200*time.Millisecond))
	w2.Handle("stuck", func(ctx context.Context, j *pgque.Job) (any, error) { again <- j.Attempt; return nil, nil })
	running(t, w2)
	waitUntil(t, 30*time.Second, "the handed-back job done", func() bool {
		return statesAre(jobStates(t, p, q), map[string]int{"completed": 2})
	})
	if a := <-again; a != 1 {
		t.Fatalf("attempt %d after a hand-back", a)
	}
}

func TestUnknownQueueIsATypedErrorFromRun(t *testing.T) {
	t.Parallel()
	p := newPool(t)
	w, err := pgque.NewWorker(p, []string{"no_such_" + qname()}, pgque.PollInterval(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	select {
	case err := <-done:
		if !errors.Is(err, pgque.ErrUndefinedObject) {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return on an unknown queue")
	}
	// Options are checked by the constructors.
	if _, err := pgque.NewConsumer(p, "q", "c", func(context.Context, *pgque.Message) error { return nil }, pgque.Concurrency(2)); err == nil {
		t.Fatal("Concurrency accepted by a Consumer")
	}
	if _, err := pgque.NewWorker(p, []string{"q"}, pgque.Concurrency(0)); err == nil {
		t.Fatal("Concurrency(0) accepted")
	}
}

// sigtermWorker is the worker process of TestSIGTERMMidBatchLosesNothing
// (this test binary run again with PGQUE_GO_SIGTERM_WORKER=queue): each
// handler records its job in table handled (its own commit, before it
// returns), then the process runs until SIGTERM.
func sigtermWorker() int {
	ctx := context.Background()
	p, err := pgxpool.New(ctx, os.Getenv("PGQUE_GO_DSN"))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer p.Close()
	w, err := pgque.NewWorker(p, []string{os.Getenv("PGQUE_GO_SIGTERM_WORKER")}, pgque.Concurrency(4),
		pgque.PollInterval(200*time.Millisecond), pgque.ShutdownTimeout(20*time.Second))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	w.Handle("slow", func(ctx context.Context, j *pgque.Job) (any, error) {
		time.Sleep(150 * time.Millisecond)
		_, err := p.Exec(ctx, "INSERT INTO handled (job_id) VALUES ($1)", j.ID)
		return nil, err
	})
	fmt.Println("ready")
	if err := pgque.RunUntilSignal(ctx, w); err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Printf("stopped completed=%d\n", w.Stats().Completed)
	return 0
}

func TestSIGTERMMidBatchLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_job_queue($1)", q)
	const n = 60
	ids := enqueueN(t, p, q, "slow", n)
	handled := func() int {
		return scalar[int](t, p, "SELECT count(*)::int FROM handled WHERE job_id = ANY($1)", ids)
	}
	start := func() (*exec.Cmd, *bufio.Reader) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "PGQUE_GO_SIGTERM_WORKER="+q, "PGQUE_GO_DSN="+dsn)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(out)
		if line, _ := r.ReadString('\n'); strings.TrimSpace(line) != "ready" {
			t.Fatalf("the worker process said %q", line)
		}
		return cmd, r
	}
	finish := func(cmd *exec.Cmd, r *bufio.Reader) string {
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		rest, _ := r.ReadString(0)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("the worker process after SIGTERM: %v (%s)", err, rest)
		}
		return rest
	}
	cmd, r := start()
	waitUntil(t, 30*time.Second, "some jobs handled", func() bool { return handled() >= 8 })
	runningNow := jobStates(t, p, q)["running"]
	out := finish(cmd, r)
	if runningNow == 0 {
		t.Fatal("SIGTERM came between batches; the test wants it mid-batch")
	}
	if !strings.Contains(out, "stopped completed=") {
		t.Fatalf("the worker process did not drain: %q", out)
	}
	st := jobStates(t, p, q)
	// Drained: nothing left running, and every job a handler finished is completed.
	doneFirst := handled()
	if st["running"] != 0 || st["completed"] != doneFirst || doneFirst >= n {
		t.Fatalf("after SIGTERM: %v, %d handled", st, doneFirst)
	}
	// Restart: the rest is done, each job completed once.
	cmd, r = start()
	waitUntil(t, 60*time.Second, "every job completed after the restart", func() bool {
		return statesAre(jobStates(t, p, q), map[string]int{"completed": n})
	})
	finish(cmd, r)
	rows, _ := p.Query(ctx, "SELECT job_id, count(*)::int FROM handled WHERE job_id = ANY($1) GROUP BY job_id", ids)
	counts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]int64, error) {
		var id int64
		var c int
		err := r.Scan(&id, &c)
		return [2]int64{id, int64(c)}, err
	})
	if err != nil || len(counts) != n {
		t.Fatalf("%d jobs handled, want %d (%v)", len(counts), n, err)
	}
	for _, c := range counts {
		if c[1] != 1 {
			t.Fatalf("job %d handled %d times", c[0], c[1])
		}
	}
}

// A queue name over 52 bytes has a shortened channel (md5): the worker must
// LISTEN on what pgque.job_channel returns. With a 60 s poll only that
// NOTIFY wakes it in time.
func TestListenOnALongQueueNamesChannel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname() + strings.Repeat("x", 56-len(qname()))
	must(t, p, "SELECT pgque.create_job_queue($1)", q)
	if ch := scalar[string](t, p, "SELECT pgque.job_channel($1)", q); ch == "pgque_jobs_"+q {
		t.Fatalf("a %d-byte name kept its plain channel %s", len(q), ch)
	}
	got := make(chan struct{}, 1)
	w, _ := pgque.NewWorker(p, []string{q}, pgque.Concurrency(1), pgque.PollInterval(60*time.Second))
	w.Handle("ping", func(context.Context, *pgque.Job) (any, error) { got <- struct{}{}; return nil, nil })
	running(t, w)
	time.Sleep(time.Second) // idle on its first poll's wait
	if _, err := pgque.Enqueue(ctx, p, q, "ping", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("not woken by the shortened channel's NOTIFY")
	}
}
