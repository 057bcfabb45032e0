// Command bench runs pgque's Go Worker and River side by side on one
// PostgreSQL server, in interleaved rounds (benches/clients/go/run.sh
// starts the server and calls it):
//
//   - drain: end-to-end jobs/s of a worker draining a backlog of N trivial
//     jobs (enqueued first with each system's bulk insert, not timed), the
//     server's CPU per job (all its processes, from /proc) and the dead
//     tuples the drain left in the system's tables (VACUUM before it,
//     autovacuum off);
//   - rate: latency enqueue -> handler start (p50 / p99) at fixed enqueue
//     rates, open loop from 8 producer connections, and the server's CPU
//     per job meanwhile;
//   - settle: after the rounds, one more drain per system and a wait, for
//     the dead tuples that maintenance makes after a drain.
//
// It prints one JSON line per cell to -raw and a markdown report to stdout.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	pgque "github.com/pgque/pgque/clients/go"
)

const (
	concurrency = 50
	poll        = 500 * time.Millisecond
	producers   = 8
	queue       = "bench"
)

// BenchArgs are the jobs' args: T is the wall clock (unix ns) taken just
// before the enqueue call (0 for the backlog of a drain), I the job's
// number (-1: a warm-up job, skipped).
type BenchArgs struct {
	T int64 `json:"t"`
	I int   `json:"i"`
}

// Kind is River's job kind of BenchArgs.
func (BenchArgs) Kind() string { return "bench" }

type recorder struct {
	mu   sync.Mutex
	lat  []time.Duration
	done atomic.Int64
}

func (r *recorder) job(a BenchArgs) {
	if a.I < 0 {
		return
	}
	if a.T != 0 {
		d := time.Duration(time.Now().UnixNano() - a.T)
		r.mu.Lock()
		r.lat = append(r.lat, d)
		r.mu.Unlock()
	}
	r.done.Add(1)
}

type riverWorker struct {
	river.WorkerDefaults[BenchArgs]
	rec *recorder
}

func (w *riverWorker) Work(ctx context.Context, job *river.Job[BenchArgs]) error {
	w.rec.job(job.Args)
	return nil
}

// system is one side of the comparison.
type system interface {
	name() string
	// backlog enqueues n jobs with the system's bulk insert.
	backlog(ctx context.Context, n int) error
	// start starts a worker recording into rec; stop stops it (drained).
	start(ctx context.Context, rec *recorder) (stop func(), err error)
	// completed counts the jobs whose completion is written.
	completed() int64
	// producer returns an enqueue function for the rate cells.
	producer(ctx context.Context) (enqueue func(context.Context, BenchArgs) error, close func(), err error)
	// deadTuples sums n_dead_tup of the system's tables.
	deadTuples(ctx context.Context) (int64, error)
	pool() *pgxpool.Pool
}

// ---- pgque ----------------------------------------------------------------

type pgqueSys struct {
	dsn string
	p   *pgxpool.Pool
	w   *pgque.Worker
}

func (s *pgqueSys) name() string        { return "pgque" }
func (s *pgqueSys) pool() *pgxpool.Pool { return s.p }
func (s *pgqueSys) completed() int64    { return s.w.Stats().Completed }

func (s *pgqueSys) backlog(ctx context.Context, n int) error {
	for i := 0; i < n; i += 1000 {
		jobs := make([]pgque.JobSpec, 0, 1000)
		for j := i; j < min(n, i+1000); j++ {
			jobs = append(jobs, pgque.NewJob("bench", BenchArgs{I: j}))
		}
		if _, err := pgque.EnqueueMany(ctx, s.p, queue, jobs); err != nil {
			return err
		}
	}
	return nil
}

func (s *pgqueSys) start(ctx context.Context, rec *recorder) (func(), error) {
	w, err := pgque.NewWorker(s.p, []string{queue}, pgque.Concurrency(concurrency), pgque.PollInterval(poll))
	if err != nil {
		return nil, err
	}
	w.Handle("bench", func(ctx context.Context, j *pgque.Job) (any, error) {
		var a BenchArgs
		if err := j.Decode(&a); err != nil {
			return nil, err
		}
		rec.job(a)
		return nil, nil
	})
	s.w = w
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			log.Printf("pgque worker: %v", err)
		}
	}, nil
}

func (s *pgqueSys) producer(ctx context.Context) (func(context.Context, BenchArgs) error, func(), error) {
	p, err := newPool(ctx, s.dsn, producers)
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, a BenchArgs) error {
		_, err := pgque.Enqueue(ctx, p, queue, "bench", a)
		return err
	}, p.Close, nil
}

func (s *pgqueSys) deadTuples(ctx context.Context) (int64, error) {
	var n int64
	err := s.p.QueryRow(ctx, "SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables WHERE schemaname = 'pgque'").Scan(&n)
	return n, err
}

// ---- River ----------------------------------------------------------------

type riverSys struct {
	dsn      string
	cooldown time.Duration // 0: River's default (100 ms)
	p        *pgxpool.Pool
	client   *river.Client[pgx.Tx]
	done     atomic.Int64
	label    string
}

func (s *riverSys) name() string        { return s.label }
func (s *riverSys) pool() *pgxpool.Pool { return s.p }
func (s *riverSys) completed() int64    { return s.done.Load() }

func (s *riverSys) backlog(ctx context.Context, n int) error {
	c, err := river.NewClient[pgx.Tx](riverDriver(s.p), &river.Config{})
	if err != nil {
		return err
	}
	for i := 0; i < n; i += 1000 {
		params := make([]river.InsertManyParams, 0, 1000)
		for j := i; j < min(n, i+1000); j++ {
			params = append(params, river.InsertManyParams{Args: BenchArgs{I: j}})
		}
		if _, err := c.InsertManyFast(ctx, params); err != nil {
			return err
		}
	}
	return nil
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func riverDriver(p *pgxpool.Pool) *riverpgxv5.Driver { return riverpgxv5.New(p) }

func (s *riverSys) start(ctx context.Context, rec *recorder) (func(), error) {
	workers := river.NewWorkers()
	river.AddWorker(workers, &riverWorker{rec: rec})
	cfg := &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: concurrency}},
		Workers:           workers,
		FetchPollInterval: poll,
		FetchCooldown:     s.cooldown,
		Logger:            quietLogger(),
	}
	c, err := river.NewClient[pgx.Tx](riverDriver(s.p), cfg)
	if err != nil {
		return nil, err
	}
	s.client = c
	s.done.Store(0)
	events, cancelSub := c.SubscribeConfig(&river.SubscribeConfig{ChanSize: 1 << 20, Kinds: []river.EventKind{river.EventKindJobCompleted}})
	subDone := make(chan struct{})
	go func() {
		defer close(subDone)
		for range events {
			s.done.Add(1)
		}
	}()
	if err := c.Start(ctx); err != nil {
		cancelSub()
		return nil, err
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Stop(sctx); err != nil {
			log.Printf("river stop: %v", err)
		}
		cancelSub()
		<-subDone
	}, nil
}

func (s *riverSys) producer(ctx context.Context) (func(context.Context, BenchArgs) error, func(), error) {
	p, err := newPool(ctx, s.dsn, producers)
	if err != nil {
		return nil, nil, err
	}
	// An insert-only client; its FetchCooldown is also the interval of its
	// insert notifications (at most one per queue per cooldown), so it gets
	// the worker's.
	c, err := river.NewClient[pgx.Tx](riverDriver(p), &river.Config{FetchCooldown: s.cooldown})
	if err != nil {
		p.Close()
		return nil, nil, err
	}
	return func(ctx context.Context, a BenchArgs) error {
		_, err := c.Insert(ctx, a, nil)
		return err
	}, p.Close, nil
}

func (s *riverSys) deadTuples(ctx context.Context) (int64, error) {
	var n int64
	err := s.p.QueryRow(ctx, "SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables WHERE schemaname = 'public' AND relname LIKE 'river%'").Scan(&n)
	return n, err
}

// ---- measuring ---------------------------------------------------------------

func newPool(ctx context.Context, dsn string, max int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = max
	return pgxpool.NewWithConfig(ctx, cfg)
}

// serverCPU returns the CPU seconds used so far by the server whose data
// directory is data: the postmaster (with its reaped children) and every
// live child process.
func serverCPU(data string) (float64, error) {
	b, err := os.ReadFile(data + "/postmaster.pid")
	if err != nil {
		return 0, err
	}
	pm, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil {
		return 0, err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var ticks int64
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(st)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		// f[0] is field 3 (state): ppid is field 4, utime..cstime 14..17.
		ppid, _ := strconv.Atoi(f[1])
		if pid != pm && ppid != pm {
			continue
		}
		n := 2 // utime, stime
		if pid == pm {
			n = 4 // and the reaped children's cutime, cstime
		}
		for i := range n {
			v, _ := strconv.ParseInt(f[11+i], 10, 64)
			ticks += v
		}
	}
	return float64(ticks) / 100, nil // USER_HZ
}

func pct(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return math.NaN()
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return float64(s[max(0, i)]) / float64(time.Millisecond)
}

// cell is one measurement, as a JSON line.
type cell struct {
	Round      int     `json:"round"`
	System     string  `json:"system"`
	Part       string  `json:"part"`
	Target     int     `json:"target,omitempty"`
	Jobs       int     `json:"jobs"`
	Received   int64   `json:"received"`
	Secs       float64 `json:"secs"`
	JobsPerSec float64 `json:"jobs_per_s"`
	CPUms      float64 `json:"server_cpu_ms_per_job"`
	Dead       int64   `json:"dead_tuples"`
	DeadLater  int64   `json:"dead_tuples_after_wait,omitempty"`
	P50        float64 `json:"p50_ms,omitempty"`
	P99        float64 `json:"p99_ms,omitempty"`
	EnqP50     float64 `json:"enqueue_p50_ms,omitempty"`
}

func drain(ctx context.Context, s system, data string, n int) (cell, error) {
	c := cell{System: s.name(), Part: "drain", Jobs: n}
	if err := s.backlog(ctx, n); err != nil {
		return c, err
	}
	// Dead tuples of this drain only: VACUUM resets n_dead_tup first.
	if _, err := s.pool().Exec(ctx, "VACUUM"); err != nil {
		return c, err
	}
	rec := &recorder{}
	cpu0, err := serverCPU(data)
	if err != nil {
		return c, err
	}
	t0 := time.Now()
	stop, err := s.start(ctx, rec)
	if err != nil {
		return c, err
	}
	deadline := t0.Add(10 * time.Minute)
	for s.completed() < int64(n) && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	c.Secs = time.Since(t0).Seconds()
	cpu1, _ := serverCPU(data)
	c.Received = rec.done.Load()
	stop()
	if s.completed() < int64(n) {
		return c, fmt.Errorf("%s: %d of %d jobs completed", s.name(), s.completed(), n)
	}
	c.JobsPerSec = float64(n) / c.Secs
	c.CPUms = (cpu1 - cpu0) * 1000 / float64(n)
	// The worker's backends flushed their statistics when its pool's
	// connections closed; give the stats a moment.
	time.Sleep(1500 * time.Millisecond)
	c.Dead, err = s.deadTuples(ctx)
	return c, err
}

// settle drains n jobs of each system (each database VACUUMed first), then
// waits: dead tuples that maintenance makes after a drain (pgque settles
// each dispatch's claim once its lease has ended) are counted too.
func settle(ctx context.Context, systems []system, data string, n int, wait time.Duration) ([]cell, error) {
	var out []cell
	for _, s := range systems {
		c, err := drain(ctx, s, data, n)
		if err != nil {
			return nil, err
		}
		c.Part = "settle"
		out = append(out, c)
	}
	time.Sleep(wait)
	for i, s := range systems {
		d, err := s.deadTuples(ctx)
		if err != nil {
			return nil, err
		}
		out[i].DeadLater = d
	}
	return out, nil
}

func rate(ctx context.Context, s system, data string, target int, secs float64) (cell, error) {
	n := int(float64(target) * secs)
	c := cell{System: s.name(), Part: "rate", Target: target, Jobs: n}
	rec := &recorder{}
	stop, err := s.start(ctx, rec)
	if err != nil {
		return c, err
	}
	defer stop()
	enqueue, closeP, err := s.producer(ctx)
	if err != nil {
		return c, err
	}
	defer closeP()
	for range producers { // warm-up jobs, skipped by the handlers
		if err := enqueue(ctx, BenchArgs{I: -1}); err != nil {
			return c, err
		}
	}
	time.Sleep(time.Second)
	cpu0, _ := serverCPU(data)
	var mu sync.Mutex
	var took []time.Duration
	var wg sync.WaitGroup
	var fail atomic.Value
	t0 := time.Now()
	for k := range producers {
		wg.Go(func() {
			for i := k; i < n; i += producers {
				due := t0.Add(time.Duration(float64(i) / float64(target) * float64(time.Second)))
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
				}
				t := time.Now()
				if err := enqueue(ctx, BenchArgs{T: t.UnixNano(), I: i}); err != nil {
					fail.Store(err)
					return
				}
				d := time.Since(t)
				mu.Lock()
				took = append(took, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	sent := time.Since(t0)
	if err, _ := fail.Load().(error); err != nil {
		return c, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for rec.done.Load() < int64(n) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cpu1, _ := serverCPU(data)
	c.Received = rec.done.Load()
	c.Secs = sent.Seconds()
	c.JobsPerSec = float64(n) / sent.Seconds()
	c.CPUms = (cpu1 - cpu0) * 1000 / float64(n)
	rec.mu.Lock()
	c.P50, c.P99 = pct(rec.lat, 0.50), pct(rec.lat, 0.99)
	rec.mu.Unlock()
	c.EnqP50 = pct(took, 0.50)
	if c.Received < int64(n) {
		return c, fmt.Errorf("%s at %d/s: %d of %d jobs received", s.name(), target, c.Received, n)
	}
	return c, nil
}

func main() {
	pgqueDSN := flag.String("pgque-dsn", "", "DSN of the database with pgque")
	riverDSN := flag.String("river-dsn", "", "DSN of the database for River")
	data := flag.String("data", "", "the server's data directory (for its CPU, from /proc)")
	n := flag.Int("n", 20000, "jobs per drain cell")
	rounds := flag.Int("rounds", 3, "interleaved rounds")
	rates := flag.String("rates", "200,1000", "enqueue rates (jobs/s) of the latency cells")
	secs := flag.Float64("secs", 4, "seconds per latency cell")
	parts := flag.String("parts", "drain,rate", "parts to run")
	raw := flag.String("raw", "/tmp/pgque_bench_go.jsonl", "every cell's JSON line")
	only := flag.String("systems", "pgque,river,river_fc1ms", "the systems to run")
	settleSystems := flag.String("settle-systems", "pgque,river_fc1ms", "the systems of the settle part (one database each)")
	settleWait := flag.Duration("settle-wait", 75*time.Second, "how long the settle part waits after its drains")
	flag.Parse()
	ctx := context.Background()

	pp, err := newPool(ctx, *pgqueDSN, concurrency+4)
	if err != nil {
		log.Fatal(err)
	}
	rp, err := newPool(ctx, *riverDSN, concurrency+4)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pp.Exec(ctx, "SELECT pgque.create_job_queue($1)", queue); err != nil {
		log.Fatal(err)
	}
	mig, err := rivermigrate.New(riverDriver(rp), nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := mig.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		log.Fatal(err)
	}
	var systems []system
	for _, s := range []system{
		&pgqueSys{dsn: *pgqueDSN, p: pp},
		&riverSys{dsn: *riverDSN, p: rp, label: "river"},
		&riverSys{dsn: *riverDSN, p: rp, label: "river_fc1ms", cooldown: time.Millisecond},
	} {
		if slices.Contains(strings.Split(*only, ","), s.name()) {
			systems = append(systems, s)
		}
	}
	out, err := os.Create(*raw)
	if err != nil {
		log.Fatal(err)
	}
	defer out.Close()
	var cells []cell
	record := func(r int, c cell, err error) {
		c.Round = r
		if err != nil {
			log.Printf("round %d: %s %s FAILED: %v", r, c.System, c.Part, err)
			return
		}
		b, _ := json.Marshal(c)
		fmt.Fprintln(out, string(b))
		log.Printf("round %d: %s", r, b)
		cells = append(cells, c)
	}
	var rateList []int
	for _, s := range strings.Split(*rates, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			log.Fatal(err)
		}
		rateList = append(rateList, v)
	}
	for r := 1; r <= *rounds; r++ {
		// Interleaved, and each round in another order of the systems.
		order := append([]system(nil), systems...)
		for i := 0; i < (r-1)%len(order); i++ {
			order = append(order[1:], order[0])
		}
		for _, part := range strings.Split(*parts, ",") {
			switch part {
			case "drain":
				for _, s := range order {
					c, err := drain(ctx, s, *data, *n)
					record(r, c, err)
				}
			case "rate":
				for _, target := range rateList {
					for _, s := range order {
						c, err := rate(ctx, s, *data, target, *secs)
						record(r, c, err)
					}
				}
			}
		}
	}
	if slices.Contains(strings.Split(*parts, ","), "settle") {
		var ss []system
		for _, s := range systems {
			if slices.Contains(strings.Split(*settleSystems, ","), s.name()) {
				ss = append(ss, s)
			}
		}
		got, err := settle(ctx, ss, *data, *n, *settleWait)
		if err != nil {
			log.Printf("settle FAILED: %v", err)
		}
		for _, c := range got {
			record(0, c, nil)
		}
	}
	report(cells, *rounds, rateList, systems, *settleWait)
}
