package pgque

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Option configures a [Worker], a [Consumer] or a [PartitionedConsumer].
// Each constructor refuses an option that is not one of its own (say
// Concurrency for a Consumer) with an error naming it.
type Option interface{ apply(*config) }

type setBits uint32

const (
	setConcurrency setBits = 1 << iota
	setBatchSize
	setLease
	setHeartbeat
	setPoll
	setShutdown
	setWorkerID
	setRetryAfter
	setSubscribe
	setWorkers
	setTTL
	setMaxBatches
	setFailurePolicy
	setLogger
	setTracer
	setSubconsumer
	setDeadInterval
	setWait
)

var optionNames = map[setBits]string{
	setConcurrency: "Concurrency", setBatchSize: "BatchSize", setLease: "Lease", setHeartbeat: "HeartbeatInterval",
	setPoll: "PollInterval", setShutdown: "ShutdownTimeout", setWorkerID: "WorkerID", setRetryAfter: "RetryAfter",
	setSubscribe: "Subscribe", setWorkers: "Workers", setTTL: "TTL", setMaxBatches: "MaxBatchesPerClaim",
	setFailurePolicy: "FailurePolicy", setLogger: "Logger", setTracer: "TracerProvider",
	setSubconsumer: "Subconsumer", setDeadInterval: "DeadInterval", setWait: "WaitTimeout",
}

type config struct {
	set                setBits
	concurrency        int
	batchSize          int
	lease              time.Duration
	heartbeat          time.Duration
	poll               time.Duration
	shutdown           time.Duration
	workerID           string
	retryAfter         time.Duration
	subscribe          bool
	workers            int
	ttl                time.Duration
	maxBatchesPerClaim int
	failurePolicy      string
	onDeadLetter       string
	logger             *slog.Logger
	tp                 trace.TracerProvider
	subconsumer        string
	deadInterval       *time.Duration
	wait               time.Duration
	err                error
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

func (c *config) fail(format string, a ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("pgque: "+format, a...)
	}
}

// newConfig applies opts over the defaults and refuses those outside allowed.
func newConfig(what string, allowed setBits, opts []Option) (*config, error) {
	c := &config{
		concurrency:        10,
		lease:              60 * time.Second,
		poll:               2 * time.Second,
		shutdown:           30 * time.Second,
		retryAfter:         60 * time.Second,
		subscribe:          true,
		workers:            1,
		ttl:                30 * time.Second,
		batchSize:          0,
		maxBatchesPerClaim: 16,
		failurePolicy:      "skip",
		onDeadLetter:       "resume",
		logger:             slog.Default(),
		wait:               5 * time.Second,
	}
	for _, o := range opts {
		o.apply(c)
	}
	if c.err != nil {
		return nil, c.err
	}
	for bit, name := range optionNames {
		if c.set&bit != 0 && allowed&bit == 0 {
			return nil, fmt.Errorf("pgque: %s is not an option of a %s", name, what)
		}
	}
	return c, nil
}

func positive(c *config, name string, d time.Duration) bool {
	if d <= 0 {
		c.fail("%s must be positive, not %s", name, d)
		return false
	}
	return true
}

// Concurrency sets how many handlers a Worker runs at once (default 10).
func Concurrency(n int) Option {
	return optionFunc(func(c *config) {
		if n < 1 {
			c.fail("Concurrency must be at least 1, not %d", n)
		}
		c.concurrency, c.set = n, c.set|setConcurrency
	})
}

// BatchSize caps one dispatch of a Worker (default: its concurrency; never
// more than the free handler slots) or one receive of a consumer (default 100).
func BatchSize(n int) Option {
	return optionFunc(func(c *config) {
		if n < 1 {
			c.fail("BatchSize must be at least 1, not %d", n)
		}
		c.batchSize, c.set = n, c.set|setBatchSize
	})
}

// Lease is what a Worker asks of dispatch for each job and renews while its
// handler runs (default 60 s).
func Lease(d time.Duration) Option {
	return optionFunc(func(c *config) {
		positive(c, "Lease", d)
		c.lease, c.set = d, c.set|setLease
	})
}

// HeartbeatInterval is how often a Worker extends the leases of its running
// jobs (default lease / 3).
func HeartbeatInterval(d time.Duration) Option {
	return optionFunc(func(c *config) {
		positive(c, "HeartbeatInterval", d)
		c.heartbeat, c.set = d, c.set|setHeartbeat
	})
}

// PollInterval is the fallback wake-up when no NOTIFY comes (default 2 s).
func PollInterval(d time.Duration) Option {
	return optionFunc(func(c *config) {
		positive(c, "PollInterval", d)
		c.poll, c.set = d, c.set|setPoll
	})
}

// ShutdownTimeout is how long a Worker's drain waits for running handlers
// before it hands their jobs back (default 30 s).
func ShutdownTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d < 0 {
			c.fail("ShutdownTimeout must not be negative, not %s", d)
		}
		c.shutdown, c.set = d, c.set|setShutdown
	})
}

// WorkerID names the Worker (dispatch's worker) or the PartitionedConsumer
// (its lease owners are "<id>/<i>"); default host-pid-random.
func WorkerID(id string) Option {
	return optionFunc(func(c *config) {
		if id == "" {
			c.fail("WorkerID must not be empty")
		}
		c.workerID, c.set = id, c.set|setWorkerID
	})
}

// RetryAfter is how long a consumer's nacked event waits before it is
// delivered again (default 60 s; 0: at the next batch).
func RetryAfter(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d < 0 {
			c.fail("RetryAfter must not be negative, not %s", d)
		}
		c.retryAfter, c.set = d, c.set|setRetryAfter
	})
}

// Subscribe says whether a consumer subscribes before its first receive
// (default true; a no-op when it is subscribed).
func Subscribe(on bool) Option {
	return optionFunc(func(c *config) { c.subscribe, c.set = on, c.set|setSubscribe })
}

// Subconsumer makes a Consumer one member, name, of the cooperative
// consumer it names (pgque.receive_coop): the members share the consumer's
// stream, each batch to one of them. Run registers the member
// (register_subconsumer) unless Subscribe(false); a normal consumer of that
// name is not converted (55000).
func Subconsumer(name string) Option {
	return optionFunc(func(c *config) {
		if name == "" {
			c.fail("Subconsumer needs a name")
		}
		c.subconsumer, c.set = name, c.set|setSubconsumer
	})
}

// DeadInterval lets a cooperative member (Subconsumer) also take over the
// open batch of a member idle longer than d (receive_coop's dead_interval;
// default: never).
func DeadInterval(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d < 0 {
			c.fail("DeadInterval must not be negative, not %s", d)
		}
		c.deadInterval, c.set = &d, c.set|setDeadInterval
	})
}

// WaitTimeout is how long one waiting receive of a Consumer waits inside
// the server for a batch (default 5 s; the server caps it at
// pgque.max_wait, and Run at half the session's statement_timeout). On a
// server with the waiting receive (pgque 0.9, docs/waits.md) Run loops on
// it instead of LISTEN + poll: an event arrives within a few milliseconds
// and no LISTEN connection is held (it works through transaction-mode
// poolers). 0 keeps LISTEN + poll, which is also what an older server, a
// cooperative member (no waiting receive_coop yet) and a server that does
// not sleep (pgque.max_wait = 0, a REPEATABLE READ default isolation) get.
func WaitTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d < 0 {
			c.fail("WaitTimeout must not be negative, not %s", d)
		}
		c.wait, c.set = d, c.set|setWait
	})
}

// Workers sets how many goroutines of a PartitionedConsumer run the
// claim_next_slot loop over its N slots (default 1; any ratio to N).
func Workers(m int) Option {
	return optionFunc(func(c *config) {
		if m < 1 {
			c.fail("Workers must be at least 1, not %d", m)
		}
		c.workers, c.set = m, c.set|setWorkers
	})
}

// TTL is a PartitionedConsumer's slot lease (default 30 s, at least 1 s).
func TTL(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d < time.Second {
			c.fail("TTL must be at least 1s, not %s", d)
		}
		c.ttl, c.set = d, c.set|setTTL
	})
}

// MaxBatchesPerClaim caps how many batches a PartitionedConsumer's worker
// takes from one slot before it releases it (default 16).
func MaxBatchesPerClaim(n int) Option {
	return optionFunc(func(c *config) {
		if n < 1 {
			c.fail("MaxBatchesPerClaim must be at least 1, not %d", n)
		}
		c.maxBatchesPerClaim, c.set = n, c.set|setMaxBatches
	})
}

// FailurePolicy is a PartitionedConsumer's failure policy, chosen at its
// first subscribe (docs/partition-keys.md): policy "skip" (the default: a
// failed event comes back after its key's later ones) or "pause" (the
// key's later events wait until it is acked or dead-lettered), and
// onDeadLetter "resume" (the default) or "block".
func FailurePolicy(policy, onDeadLetter string) Option {
	return optionFunc(func(c *config) {
		if policy != "skip" && policy != "pause" {
			c.fail("FailurePolicy must be \"skip\" or \"pause\", not %q", policy)
		}
		if onDeadLetter != "resume" && onDeadLetter != "block" {
			c.fail("FailurePolicy's onDeadLetter must be \"resume\" or \"block\", not %q", onDeadLetter)
		}
		c.failurePolicy, c.onDeadLetter, c.set = policy, onDeadLetter, c.set|setFailurePolicy
	})
}

// Logger sets where a worker or consumer logs reconnects, lost slots and
// hand-backs (default slog.Default()).
func Logger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l == nil {
			c.fail("Logger must not be nil")
		}
		c.logger, c.set = l, c.set|setLogger
	})
}

// defaultID is host-pid-random, like the other clients' worker ids.
func defaultID() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), randHex(3))
}
