package pgque

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The job worker: dispatch in batches, run handlers in goroutines,
// heartbeat, complete or fail, drain on the end of Run's context.
//
// Goroutines and connections of a running Worker: the dispatch loop (the
// caller's goroutine: pgque.dispatch of up to the free handler slots, one
// statement, then a wait for a NOTIFY, a freed slot or the poll interval);
// a listener on a connection of its own (LISTEN only); one goroutine per
// running handler (at most Concurrency); a completer that sends the
// finished jobs of each moment in one complete_many (with outputs where
// the server takes them) and each failure as fail; a heartbeat goroutine
// that extends the running jobs' leases every HeartbeatInterval. All but
// the listener run their statements through the pool, so a dispatch never
// waits behind a completion.

// ErrJobCancelled is the cause (context.Cause) of a handler's context once
// a heartbeat left its job out: the job was cancelled, or its lease was
// lost to the rescue. Its completion will be refused.
var ErrJobCancelled = errors.New("pgque: the job was cancelled or its lease was lost")

// ErrHandedBack is the cause of a handler's context when the Worker's
// drain handed its job back (ShutdownTimeout passed): another worker runs
// it, and this handler's completion is ignored.
var ErrHandedBack = errors.New("pgque: the job was handed back at shutdown")

// dispatchSQL and dispatchHeadersSQL (servers with job headers) claim up
// to $2 ready jobs of the queues $1 for worker $3 under a lease of $4 s.
const dispatchSQL = "SELECT job_id, queue, kind, args, priority, attempt, max_attempts, actor, " +
	"enqueued_at, lease_token, lease_until FROM pgque.dispatch($1::text[], $2::int, $3::text, make_interval(secs => $4::float8))"

const dispatchHeadersSQL = "SELECT job_id, queue, kind, args, priority, attempt, max_attempts, actor, " +
	"enqueued_at, lease_token, lease_until, headers FROM pgque.dispatch($1::text[], $2::int, $3::text, make_interval(secs => $4::float8))"

// refillWait is how long a dispatch waits for half the handler slots to
// free up, so that short jobs are not dispatched one by one.
const refillWait = 20 * time.Millisecond

// Job is a dispatched job, as a handler sees it.
type Job struct {
	ID          int64
	Queue       string
	Kind        string
	Args        json.RawMessage // the job's args, JSON as stored
	Priority    int
	Attempt     int
	MaxAttempts int
	Actor       string // "" for a job without an actor
	EnqueuedAt  time.Time
	LeaseToken  int64
	LeaseUntil  time.Time
	// Headers is what the producer attached (W3C traceparent /
	// tracestate); nil for most jobs and on servers without job headers.
	Headers map[string]string

	run        *workerRun
	lost       atomic.Bool
	handedBack atomic.Bool
	cancel     context.CancelCauseFunc
}

// Decode unmarshals the job's args into v (encoding/json).
func (j *Job) Decode(v any) error { return json.Unmarshal(j.Args, v) }

// Cancelled reports whether a heartbeat left this job out: it was
// cancelled, or its lease was lost to the rescue. Its completion will be
// refused; a long handler should check this (or its context) and return.
func (j *Job) Cancelled() bool { return j.lost.Load() }

// Progress records progress (any JSON value) with pgque.set_progress, one
// statement through the worker's pool. It returns false when the server
// refused it (the job was cancelled or its lease is stale), and
// ErrServerFeatureMissing on a server without set_progress.
func (j *Job) Progress(ctx context.Context, value any) (bool, error) {
	if j.run == nil {
		return false, errors.New("pgque: the job is not attached to a running worker")
	}
	if !j.run.f.Progress {
		return false, featureMissing("this server's pgque has no set_progress (progress needs pgque 0.7)")
	}
	v, err := jsonValue(value, "null")
	if err != nil {
		return false, err
	}
	var ok *bool
	err = j.run.w.pool.QueryRow(ctx, "SELECT pgque.set_progress($1::bigint, $2::bigint, $3::jsonb)", j.ID, j.LeaseToken, v).Scan(&ok)
	if err != nil {
		return false, translate(err)
	}
	return ok != nil && *ok, nil
}

// HandlerFunc handles one job. Its output (nil: none) becomes the job's
// output on servers with outputs, encoded with encoding/json; an error (or
// a panic) fails the job with its message, and the server retries it with
// its backoff until max_attempts. ctx is cancelled when the job is
// cancelled or its lease lost (cause ErrJobCancelled) or when a drain
// hands it back (ErrHandedBack); it is not cancelled by the end of Run's
// context while the drain waits for the handler.
type HandlerFunc func(ctx context.Context, job *Job) (output any, err error)

// TxHandlerFunc is an exactly-once handler: it runs in a transaction that
// the worker opened on a connection of its pool, writes its effects through
// tx (without committing), and the worker completes the job in that same
// transaction (pgque.complete with the lease token and the output) before
// COMMIT. The effects and the completion commit together or not at all: a
// refused completion (the lease was lost, the job cancelled or handed
// back) rolls everything back, and an error rolls back and fails the job
// in a separate statement.
type TxHandlerFunc func(ctx context.Context, job *Job, tx pgx.Tx) (output any, err error)

type handler struct {
	fn   HandlerFunc
	txFn TxHandlerFunc
}

// WorkerStats are a Worker's counters since it was made.
type WorkerStats struct {
	// Completed counts the jobs the server completed.
	Completed int64
	// Failed counts the failures sent (an error, a panic, no handler).
	Failed int64
	// Lost counts the completions the server refused (the lease was lost,
	// the job cancelled or handed back); an exactly-once handler's effects
	// were rolled back.
	Lost int64
}

// Worker runs job handlers for a set of job queues. Make it with
// [NewWorker], register handlers with Handle / HandleTx, then Run.
type Worker struct {
	pool     *pgxpool.Pool
	queues   []string
	cfg      *config
	mu       sync.RWMutex
	handlers map[string]handler
	running  atomic.Bool

	completed, failed, lost atomic.Int64
}

const workerOptions = setConcurrency | setBatchSize | setLease | setHeartbeat | setPoll | setShutdown |
	setWorkerID | setLogger | setTracer

// NewWorker returns a Worker for queues on pool. Options: Concurrency
// (10), BatchSize (the concurrency), Lease (60 s), HeartbeatInterval
// (lease / 3), PollInterval (2 s), ShutdownTimeout (30 s), WorkerID,
// Logger, TracerProvider. The pool serves the dispatches, completions,
// heartbeats and the exactly-once handlers' transactions (one connection
// each while they run): give it MaxConns of at least Concurrency + 2 when
// you use HandleTx. The listener connects on its own with the pool's
// configuration.
func NewWorker(pool *pgxpool.Pool, queues []string, opts ...Option) (*Worker, error) {
	if pool == nil {
		return nil, errors.New("pgque: NewWorker needs a pool")
	}
	if len(queues) == 0 {
		return nil, errors.New("pgque: NewWorker needs at least one queue")
	}
	cfg, err := newConfig("Worker", workerOptions, opts)
	if err != nil {
		return nil, err
	}
	if cfg.set&setBatchSize == 0 {
		cfg.batchSize = cfg.concurrency
	}
	if cfg.set&setHeartbeat == 0 {
		cfg.heartbeat = cfg.lease / 3
	}
	if cfg.workerID == "" {
		cfg.workerID = defaultID()
	}
	return &Worker{pool: pool, queues: append([]string(nil), queues...), cfg: cfg, handlers: map[string]handler{}}, nil
}

// Handle registers fn for jobs of kind (replacing an earlier one).
func (w *Worker) Handle(kind string, fn HandlerFunc) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.handlers[kind] = handler{fn: fn}
}

// HandleTx registers the exactly-once handler fn for jobs of kind (see
// [TxHandlerFunc]).
func (w *Worker) HandleTx(kind string, fn TxHandlerFunc) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.handlers[kind] = handler{txFn: fn}
}

// ID returns the worker's id, the worker name it dispatches with.
func (w *Worker) ID() string { return w.cfg.workerID }

// Stats returns the worker's counters.
func (w *Worker) Stats() WorkerStats {
	return WorkerStats{Completed: w.completed.Load(), Failed: w.failed.Load(), Lost: w.lost.Load()}
}

// outcome is a finished plain job: its output, or the failure text.
type outcome struct {
	job    *Job
	output json.RawMessage
	fail   string
	failed bool
}

// workerRun is the state of one Run.
type workerRun struct {
	w      *Worker
	f      *Features
	log    *slog.Logger
	notify *notifier // NOTIFYs from the listener
	freed  *notifier // a handler slot freed

	mu      sync.Mutex
	jobs    map[int64]*Job
	omu     sync.Mutex
	out     []outcome
	osig    chan struct{}
	closing chan struct{}
}

func (r *workerRun) free() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.w.cfg.concurrency - len(r.jobs)
}

func (r *workerRun) push(o outcome) {
	r.omu.Lock()
	r.out = append(r.out, o)
	r.omu.Unlock()
	select {
	case r.osig <- struct{}{}:
	default:
	}
}

// Run dispatches and runs jobs until ctx ends, then drains: no new
// dispatch, running handlers get ShutdownTimeout to finish, the jobs still
// running after it are handed back (snoozed to now: the attempt is not
// counted, another worker takes them at once), and every finished job's
// outcome is sent before Run returns. It returns nil after a drain that
// ctx's end started; an error the server gave for the call (an unknown
// queue: ErrUndefinedObject) ends it too, after the drain, and is
// returned. Lost connections are retried. A Worker runs once at a time.
func (w *Worker) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("pgque: the worker is already running")
	}
	defer w.running.Store(false)
	f, err := FeaturesOf(ctx, w.pool)
	if err != nil {
		return err
	}
	r := &workerRun{w: w, f: f, log: w.cfg.logger, notify: newNotifier(), freed: newNotifier(),
		jobs: map[int64]*Job{}, osig: make(chan struct{}, 1), closing: make(chan struct{})}
	channels, err := r.channels(ctx)
	if err != nil {
		return err
	}
	l := startListener(ctx, w.pool, channels, r.notify.wake, r.log)
	defer l.close()
	completerDone := make(chan struct{})
	go func() { defer close(completerDone); r.completeLoop() }()
	hbStop := make(chan struct{})
	hbDone := make(chan struct{})
	go func() { defer close(hbDone); r.heartbeatLoop(hbStop) }()

	fatal := r.dispatchLoop(ctx)

	r.drain()
	close(r.closing)
	<-completerDone
	close(hbStop)
	<-hbDone
	return fatal
}

// channels returns the queues' NOTIFY channels: pgque.job_channel where
// the server has it (names the server shortens), else pgque_jobs_<queue>.
func (r *workerRun) channels(ctx context.Context) ([]string, error) {
	out := make([]string, len(r.w.queues))
	for i, q := range r.w.queues {
		if !r.f.JobChannel {
			out[i] = "pgque_jobs_" + q
			continue
		}
		if err := r.w.pool.QueryRow(ctx, "SELECT pgque.job_channel($1::text)", q).Scan(&out[i]); err != nil {
			return nil, translate(err)
		}
	}
	return out, nil
}

func (r *workerRun) dispatchLoop(ctx context.Context) error {
	cfg := r.w.cfg
	sql := dispatchSQL
	if r.f.Headers {
		sql = dispatchHeadersSQL
	}
	base := context.WithoutCancel(ctx)
	for ctx.Err() == nil {
		g := r.notify.gen()
		fg := r.freed.gen()
		free := r.free()
		if free <= 0 {
			waitOn(ctx, fg, cfg.poll)
			continue
		}
		low := max(1, min(cfg.batchSize, cfg.concurrency)/2)
		if free < low {
			// Refill in batches: give the running handlers a moment to free
			// half the slots; a slow handler delays a refill by at most refillWait.
			deadline := time.Now().Add(refillWait)
			for free < low && ctx.Err() == nil {
				left := time.Until(deadline)
				if left <= 0 {
					break
				}
				waitOn(ctx, fg, left)
				fg = r.freed.gen()
				free = r.free()
			}
			if ctx.Err() != nil {
				break
			}
		}
		want := min(free, cfg.batchSize)
		// Not cancelled by ctx: a dispatch that claimed jobs must hand
		// them to handlers, or they would wait for their lease to expire.
		dctx, cancel := context.WithTimeout(base, time.Minute)
		jobs, err := r.dispatch(dctx, sql, want)
		cancel()
		if err != nil {
			var pe *Error
			if errors.As(err, &pe) {
				return err
			}
			r.log.Warn("pgque worker: dispatch failed; retrying in 1 s", "worker", cfg.workerID, "error", err)
			sleep(ctx, time.Second)
			continue
		}
		for _, j := range jobs {
			hctx, cancel := context.WithCancelCause(base)
			j.cancel = cancel
			r.mu.Lock()
			r.jobs[j.ID] = j
			r.mu.Unlock()
			go r.runJob(hctx, j)
		}
		if len(jobs) < want {
			// The queues had no more ready jobs: sleep until a NOTIFY, the
			// poll interval, or the end of ctx.
			waitOn(ctx, g, cfg.poll)
		}
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func (r *workerRun) dispatch(ctx context.Context, sql string, n int) ([]*Job, error) {
	cfg := r.w.cfg
	rows, err := r.w.pool.Query(ctx, sql, r.w.queues, n, cfg.workerID, cfg.lease.Seconds())
	if err != nil {
		return nil, translate(err)
	}
	defer rows.Close()
	var jobs []*Job
	for rows.Next() {
		j := &Job{run: r}
		var actor *string
		dest := []any{&j.ID, &j.Queue, &j.Kind, &j.Args, &j.Priority, &j.Attempt, &j.MaxAttempts, &actor,
			&j.EnqueuedAt, &j.LeaseToken, &j.LeaseUntil}
		if r.f.Headers {
			dest = append(dest, &j.Headers)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		if actor != nil {
			j.Actor = *actor
		}
		jobs = append(jobs, j)
	}
	// A failure after the rows were read still claimed them: hand them over.
	if err := rows.Err(); err != nil && len(jobs) == 0 {
		return nil, translate(err)
	}
	return jobs, nil
}

// runJob runs one job's handler and records its outcome.
func (r *workerRun) runJob(ctx context.Context, j *Job) {
	defer func() {
		j.cancel(nil)
		r.mu.Lock()
		delete(r.jobs, j.ID)
		r.mu.Unlock()
		r.freed.wake()
	}()
	r.w.mu.RLock()
	h, ok := r.w.handlers[j.Kind]
	r.w.mu.RUnlock()
	if !ok {
		r.push(outcome{job: j, failed: true, fail: fmt.Sprintf("no handler for job kind %q in worker %s", j.Kind, r.w.cfg.workerID)})
		return
	}
	ctx, sp := startProcess(ctx, r.w.cfg.tp, j)
	var err error
	if h.txFn != nil {
		err = r.runTx(ctx, j, h.txFn)
		sp.end(err)
		if err != nil {
			r.push(outcome{job: j, failed: true, fail: failureText(err)})
		}
		return
	}
	out, err := call(func() (any, error) { return h.fn(ctx, j) })
	var o outcome
	if err == nil {
		o.output, err = outputJSON(out)
	}
	sp.end(err)
	if err != nil {
		r.push(outcome{job: j, failed: true, fail: failureText(err)})
		return
	}
	o.job = j
	r.push(o)
}

// call runs fn, turning a panic into an error with its stack.
func call(fn func() (any, error)) (out any, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = nil, &panicError{value: p, stack: debug.Stack()}
		}
	}()
	return fn()
}

func outputJSON(v any) (json.RawMessage, error) {
	if v == nil {
		return nil, nil
	}
	b, err := jsonValue(v, "null")
	if err != nil {
		return nil, fmt.Errorf("the handler's output: %w", err)
	}
	return b, nil
}

// failureText is a handler's error as the job's error text.
func failureText(err error) string {
	s := err.Error()
	if len(s) > 100000 {
		s = s[:100000]
	}
	return s
}

// runTx runs an exactly-once handler: BEGIN, fn(job, tx), the fenced
// complete, COMMIT. It returns the failure to report (nil: committed, or
// refused and rolled back). The failure is reported in a separate
// statement, fenced by the same token, so a commit that did happen before
// a lost connection makes it a no-op.
func (r *workerRun) runTx(ctx context.Context, j *Job, fn TxHandlerFunc) error {
	tx, err := r.w.pool.Begin(ctx)
	if err != nil {
		return err
	}
	rollback := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
	}
	out, err := call(func() (any, error) { return fn(ctx, j, tx) })
	var outJSON json.RawMessage
	if err == nil {
		outJSON, err = outputJSON(out)
	}
	if err != nil {
		rollback()
		return err
	}
	var ok *bool
	if r.f.Outputs {
		var o any // NULL for no output
		if outJSON != nil {
			o = outJSON
		}
		err = tx.QueryRow(ctx, "SELECT pgque.complete($1::bigint, $2::bigint, $3::jsonb)", j.ID, j.LeaseToken, o).Scan(&ok)
	} else {
		err = tx.QueryRow(ctx, "SELECT pgque.complete($1::bigint, $2::bigint)", j.ID, j.LeaseToken).Scan(&ok)
	}
	if err != nil {
		rollback()
		return translate(err)
	}
	if ok == nil || !*ok {
		rollback()
		r.w.lost.Add(1)
		why := "its lease was lost or it was cancelled"
		if j.handedBack.Load() {
			why = "handed back at shutdown"
		}
		r.log.Warn("pgque worker: job not completed; its transaction was rolled back", "job", j.ID, "why", why)
		return nil
	}
	if err := tx.Commit(ctx); err != nil {
		return translate(err)
	}
	r.w.completed.Add(1)
	return nil
}

// completeLoop sends the outcomes of each moment: the completions in one
// complete_many, each failure as fail. It returns once closing is closed
// and everything pushed before is sent.
func (r *workerRun) completeLoop() {
	for {
		final := false
		select {
		case <-r.osig:
		case <-r.closing:
			final = true
		}
		for {
			r.omu.Lock()
			batch := r.out
			if len(batch) > 1000 {
				batch, r.out = batch[:1000], append([]outcome(nil), batch[1000:]...)
			} else {
				r.out = nil
			}
			r.omu.Unlock()
			if len(batch) == 0 {
				break
			}
			r.send(batch)
		}
		if final {
			return
		}
	}
}

func (r *workerRun) send(batch []outcome) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var ids, tokens []int64
	var outs []*json.RawMessage
	withOutputs := false
	for i := range batch {
		o := &batch[i]
		if o.failed || o.job.handedBack.Load() {
			continue
		}
		ids = append(ids, o.job.ID)
		tokens = append(tokens, o.job.LeaseToken)
		if o.output != nil {
			withOutputs = true
			outs = append(outs, &o.output)
		} else {
			outs = append(outs, nil)
		}
	}
	if len(ids) > 0 {
		var n int64
		var err error
		if withOutputs && r.f.Outputs {
			err = r.w.pool.QueryRow(ctx, "SELECT pgque.complete_many($1::bigint[], $2::bigint[], $3::jsonb[])", ids, tokens, outs).Scan(&n)
		} else {
			err = r.w.pool.QueryRow(ctx, "SELECT pgque.complete_many($1::bigint[], $2::bigint[])", ids, tokens).Scan(&n)
		}
		if err != nil {
			// Their leases expire and the server's rescue hands them out
			// again: at least once, never lost.
			r.log.Error("pgque worker: could not complete jobs", "jobs", len(ids), "error", err)
		} else {
			r.w.completed.Add(n)
			r.w.lost.Add(int64(len(ids)) - n)
		}
	}
	for i := range batch {
		o := &batch[i]
		if !o.failed || o.job.handedBack.Load() {
			continue
		}
		var state *string
		err := r.w.pool.QueryRow(ctx, "SELECT pgque.fail($1::bigint, $2::bigint, $3::text)", o.job.ID, o.job.LeaseToken, o.fail).Scan(&state)
		if err != nil {
			r.log.Error("pgque worker: could not fail job", "job", o.job.ID, "error", err)
			continue
		}
		r.w.failed.Add(1)
	}
}

// heartbeatLoop extends the leases of the running jobs every
// HeartbeatInterval until stop is closed (through the drain, so the jobs
// still running keep their leases). A job the server leaves out was
// cancelled or lost its lease: it is flagged, and its handler's context
// cancelled with ErrJobCancelled.
func (r *workerRun) heartbeatLoop(stop chan struct{}) {
	cfg := r.w.cfg
	t := time.NewTicker(cfg.heartbeat)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		r.mu.Lock()
		var jobs []*Job
		for _, j := range r.jobs {
			if !j.handedBack.Load() {
				jobs = append(jobs, j)
			}
		}
		r.mu.Unlock()
		if len(jobs) == 0 {
			continue
		}
		ids := make([]int64, len(jobs))
		tokens := make([]int64, len(jobs))
		for i, j := range jobs {
			ids[i], tokens[i] = j.ID, j.LeaseToken
		}
		ctx, cancel := context.WithTimeout(context.Background(), cfg.heartbeat+10*time.Second)
		rows, err := r.w.pool.Query(ctx, "SELECT job_id FROM pgque.heartbeat($1::bigint[], $2::bigint[], make_interval(secs => $3::float8))",
			ids, tokens, cfg.lease.Seconds())
		var alive []int64
		if err == nil {
			alive, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		}
		cancel()
		if err != nil {
			r.log.Warn("pgque worker: heartbeat failed", "error", err)
			continue
		}
		live := make(map[int64]bool, len(alive))
		for _, id := range alive {
			live[id] = true
		}
		r.mu.Lock()
		for _, j := range jobs {
			if !live[j.ID] && r.jobs[j.ID] == j {
				j.lost.Store(true)
				j.cancel(ErrJobCancelled)
			}
		}
		r.mu.Unlock()
	}
}

// drain waits up to ShutdownTimeout for the running handlers, then hands
// back what is still running (snooze to now).
func (r *workerRun) drain() {
	deadline := time.Now().Add(r.w.cfg.shutdown)
	for {
		g := r.freed.gen()
		r.mu.Lock()
		n := len(r.jobs)
		r.mu.Unlock()
		left := time.Until(deadline)
		if n == 0 || left <= 0 {
			break
		}
		waitOn(context.Background(), g, min(left, 500*time.Millisecond))
	}
	r.mu.Lock()
	var left []*Job
	for _, j := range r.jobs {
		left = append(left, j)
	}
	r.mu.Unlock()
	if len(left) == 0 {
		return
	}
	r.log.Warn("pgque worker: handing back jobs still running after the shutdown timeout",
		"jobs", len(left), "timeout", r.w.cfg.shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, j := range left {
		j.handedBack.Store(true)
		j.cancel(ErrHandedBack)
		if _, err := r.w.pool.Exec(ctx, "SELECT pgque.snooze($1::bigint, $2::bigint, now())", j.ID, j.LeaseToken); err != nil {
			r.log.Error("pgque worker: could not hand back job", "job", j.ID, "error", err)
		}
	}
}
