package pgque

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Event consumers: a plain Consumer (receive / ack / nack; on a server with
// the waiting receive it waits for its batch inside the server, on an older
// one it is woken by the queue's tick NOTIFY) and a PartitionedConsumer
// whose M worker goroutines cover N slots with the claim_next_slot loop, so
// every slot is polled.
//
// Delivery is at least once: a batch is acked only after its handler calls
// returned, and a batch interrupted by a crash, a stop or a lost slot
// lease is delivered again (the same batch) to whoever reads that consumer
// or slot next. A handler that fails nacks its message (retried after
// RetryAfter, to the dead-letter queue after the queue's max_retries); the
// nacks and the ack of one batch commit together.
//
// Exactly-once handlers (NewConsumerTx, NewPartitionedConsumerTx) are
// called inside the transaction that acks the batch: their effects, the
// batch's nacks and its ack commit together or not at all. Each call runs
// in a savepoint, so a handler that fails takes back only its own effects
// and nacks its message. For a partitioned consumer the ack is fenced by
// the slot lease: a worker that lost its slot gets 55000 from
// ack_partitioned, which rolls the batch's effects back (the new owner gets
// the same batch).

// Message is one event, with PgQue's pgque.message fields.
type Message struct {
	MsgID   int64
	BatchID int64
	Type    string
	// Payload is the event's payload as text ("" for NULL; see PayloadNull).
	Payload string
	// RetryCount is 0 on the first delivery (the server's NULL), then the
	// number of earlier deliveries.
	RetryCount int
	CreatedAt  time.Time
	// Extra1..Extra4 are PgQ's extra fields ("" for NULL); the partition
	// key rides Extra1.
	Extra1, Extra2, Extra3, Extra4 string
	// Headers are the event's headers (W3C trace context), read only
	// while tracing is on, from a server with event headers; nil otherwise.
	Headers map[string]string

	row msgRow
}

// msgRow is the message as the server returned it, NULLs kept: a nack
// sends it back exactly.
type msgRow struct {
	payload, extra1, extra2, extra3, extra4 *string
	retryCount                              *int32
}

// PartitionKey returns the event's partition key (extra1) and whether it has one.
func (m *Message) PartitionKey() (string, bool) {
	if m.row.extra1 == nil {
		return "", false
	}
	return *m.row.extra1, true
}

// PayloadNull reports whether the payload is NULL.
func (m *Message) PayloadNull() bool { return m.row.payload == nil }

// JSON unmarshals the payload into v (encoding/json).
func (m *Message) JSON(v any) error {
	if m.row.payload == nil {
		return json.Unmarshal([]byte("null"), v)
	}
	return json.Unmarshal([]byte(m.Payload), v)
}

// MessageHandler handles one event; an error (or a panic) nacks it. ctx
// is not cancelled by the end of Run's context: the batch in hand is
// finished and acked first.
type MessageHandler func(ctx context.Context, m *Message) error

// TxMessageHandler is an exactly-once event handler: it writes its effects
// through tx (a savepoint of the transaction that acks the batch; do not
// commit it). An error rolls back to the savepoint and nacks the event.
type TxMessageHandler func(ctx context.Context, m *Message, tx pgx.Tx) error

const msgCols = "msg_id, batch_id, type, payload, retry_count, created_at, extra1, extra2, extra3, extra4"

// msgRowSQL is a pgque.message built from 10 parameters starting at $n.
func msgRowSQL(n int) string {
	return fmt.Sprintf("ROW($%d::bigint, $%d::bigint, $%d::text, $%d::text, $%d::int4, $%d::timestamptz, "+
		"$%d::text, $%d::text, $%d::text, $%d::text)::pgque.message", n, n+1, n+2, n+3, n+4, n+5, n+6, n+7, n+8, n+9)
}

func (m *Message) params() []any {
	return []any{m.MsgID, m.BatchID, m.Type, m.row.payload, m.row.retryCount, m.CreatedAt,
		m.row.extra1, m.row.extra2, m.row.extra3, m.row.extra4}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// runner is what both consumers share.
type runner struct {
	pool     *pgxpool.Pool
	queue    string
	consumer string
	cfg      *config
	h        MessageHandler
	txh      TxMessageHandler
	notify   *notifier
	// noHeaders: the server turned out to lack the *_with_headers
	// receives (42883, a 0.7 schema): the plain ones from then on.
	noHeaders atomic.Bool
	handled   atomic.Int64
	running   atomic.Bool
}

type failure struct {
	m   *Message
	why string
}

// receive returns one batch from pgque.<fn>(args) (fn and the casts are
// the client's own constants). While tracing is on it reads the
// _with_headers twin, which adds the events' headers; a server without it
// (42883) is remembered and read with fn itself from then on.
func (r *runner) receive(ctx context.Context, fn, casts string, args ...any) ([]*Message, error) {
	return r.receiveOn(ctx, r.pool, fn, casts, true, args...)
}

// receiveOn is receive on db; headers false reads fn itself even while
// tracing is on.
func (r *runner) receiveOn(ctx context.Context, db DB, fn, casts string, headers bool, args ...any) ([]*Message, error) {
	if headers && !r.noHeaders.Load() && tracingActive(r.cfg.tp) {
		msgs, err := r.query(ctx, db, "SELECT "+msgCols+", headers FROM pgque."+fn+"_with_headers("+casts+")", true, args)
		if SQLState(err) != CodeUndefinedFunction {
			return msgs, err
		}
		r.noHeaders.Store(true)
	}
	return r.query(ctx, db, "SELECT "+msgCols+" FROM pgque."+fn+"("+casts+")", false, args)
}

// receiveWaiting runs the waiting receive(queue, consumer, batch size,
// wait) on a connection of its own from the pool, outside any transaction
// (one that has written would not sleep). When ctx ends meanwhile it
// cancels the statement with the server's cancel request, again every
// 200 ms until the statement returned (a request that reaches the server
// before the statement is dropped there). pgx's CancelRequest returns once
// the server acted on it, and the connection goes back to the pool only
// after the last one, so no cancel lands on a later statement of the pool.
// A cancelled wait is an empty result.
func (r *runner) receiveWaiting(ctx context.Context, wait time.Duration, headers bool) ([]*Message, error) {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil
		}
		return nil, translate(err)
	}
	defer conn.Release()
	done := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-done:
			return
		case <-ctx.Done():
		}
		for {
			cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if err := conn.Conn().PgConn().CancelRequest(cctx); err != nil {
				r.cfg.logger.Warn("pgque consumer: cancelling the waiting receive", "queue", r.queue, "consumer", r.consumer, "error", err)
			}
			cancel()
			select {
			case <-done:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	msgs, err := r.receiveOn(context.WithoutCancel(ctx), conn, "receive",
		"$1::text, $2::text, $3::int, make_interval(secs => $4::float8)", headers,
		r.queue, r.consumer, r.cfg.batchSize, wait.Seconds())
	close(done)
	<-watched
	if err != nil && ctx.Err() != nil && SQLState(err) == codeQueryCanceled {
		return nil, nil
	}
	return msgs, err
}

// codeQueryCanceled is 57014: a cancel request or statement_timeout.
const codeQueryCanceled = "57014"

func (r *runner) query(ctx context.Context, db DB, sql string, headers bool, args []any) ([]*Message, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, translate(err)
	}
	msgs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Message, error) {
		m := &Message{}
		dest := []any{&m.MsgID, &m.BatchID, &m.Type, &m.row.payload, &m.row.retryCount, &m.CreatedAt,
			&m.row.extra1, &m.row.extra2, &m.row.extra3, &m.row.extra4}
		if headers {
			dest = append(dest, &m.Headers)
		}
		if err := row.Scan(dest...); err != nil {
			return nil, err
		}
		m.Payload = deref(m.row.payload)
		if m.row.retryCount != nil {
			m.RetryCount = int(*m.row.retryCount)
		}
		m.Extra1, m.Extra2, m.Extra3, m.Extra4 = deref(m.row.extra1), deref(m.row.extra2), deref(m.row.extra3), deref(m.row.extra4)
		return m, nil
	})
	return msgs, translate(err)
}

// call runs the handler for one message, in a "process <queue>" span when
// tracing is on; a transactional one in a savepoint of tx. A failure is
// appended to failed (the message is nacked) and recorded on the span.
func (r *runner) call(ctx context.Context, tx pgx.Tx, m *Message, failed *[]failure) {
	ctx, sp := startEvent(ctx, r.cfg.tp, r.queue, r.consumer, m)
	var err error
	if tx != nil {
		var save pgx.Tx
		save, err = tx.Begin(ctx)
		if err == nil {
			_, err = call(func() (any, error) { return nil, r.txh(ctx, m, save) })
			if err != nil {
				_ = save.Rollback(context.WithoutCancel(ctx))
			} else if cerr := save.Commit(ctx); cerr != nil {
				err = cerr
			}
		}
	} else {
		_, err = call(func() (any, error) { return nil, r.h(ctx, m) })
	}
	sp.end(err)
	if err != nil {
		why := err.Error()
		if len(why) > 1000 {
			why = why[:1000]
		}
		*failed = append(*failed, failure{m, why})
	}
}

func (r *runner) listen(ctx context.Context) *listener {
	return startListener(ctx, r.pool, []string{"pgque_" + r.queue}, r.notify.wake, r.cfg.logger)
}

// Consumer reads an event queue as one consumer and calls its handler per
// event, batch by batch. Make it with [NewConsumer] or [NewConsumerTx].
type Consumer struct {
	r           *runner
	serverWaits atomic.Bool
}

const consumerOptions = setBatchSize | setPoll | setRetryAfter | setSubscribe | setLogger | setTracer |
	setSubconsumer | setDeadInterval | setWait

// atOnce: an empty waiting receive quicker than this did not sleep in the server.
const atOnce = 20 * time.Millisecond

func newRunner(what string, allowed setBits, pool *pgxpool.Pool, queue, consumer string, opts []Option) (*runner, error) {
	if pool == nil {
		return nil, fmt.Errorf("pgque: %s needs a pool", what)
	}
	cfg, err := newConfig(what, allowed, opts)
	if err != nil {
		return nil, err
	}
	if cfg.set&setBatchSize == 0 {
		cfg.batchSize = 100
	}
	return &runner{pool: pool, queue: queue, consumer: consumer, cfg: cfg, notify: newNotifier()}, nil
}

// NewConsumer returns a Consumer of queue as consumer with handler h.
// Options: BatchSize (100), PollInterval (2 s), RetryAfter (60 s),
// Subscribe (true), WaitTimeout (5 s), Subconsumer, DeadInterval, Logger,
// TracerProvider.
func NewConsumer(pool *pgxpool.Pool, queue, consumer string, h MessageHandler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("pgque: NewConsumer needs a handler")
	}
	r, err := newRunner("Consumer", consumerOptions, pool, queue, consumer, opts)
	if err != nil {
		return nil, err
	}
	r.h = h
	return &Consumer{r: r}, nil
}

// NewConsumerTx returns a Consumer whose handler h runs in the transaction
// that acks its batch (a savepoint per event): its writes commit with the ack.
func NewConsumerTx(pool *pgxpool.Pool, queue, consumer string, h TxMessageHandler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("pgque: NewConsumerTx needs a handler")
	}
	r, err := newRunner("Consumer", consumerOptions, pool, queue, consumer, opts)
	if err != nil {
		return nil, err
	}
	r.txh = h
	return &Consumer{r: r}, nil
}

// Handled returns how many events the consumer handled (acked, with their
// nacks) so far.
func (c *Consumer) Handled() int64 { return c.r.handled.Load() }

// ServerWaits reports whether the running consumer waits for its batches
// inside the server (the waiting receive; see [WaitTimeout]) rather than
// on LISTEN and polls (once Run returned: what its last run did).
func (c *Consumer) ServerWaits() bool { return c.serverWaits.Load() }

// Run subscribes the consumer (with Subscribe(true), the default; a no-op
// when it is), then receives, handles and acks batches until ctx ends. On
// a server with the waiting receive each receive waits inside the server
// for a batch (up to [WaitTimeout]), and the end of ctx cancels it;
// otherwise Run sleeps between empty receives until the queue's tick
// NOTIFY or the poll interval. The batch in hand when ctx ends is finished
// and acked first. It returns nil then; a server error of the call (an
// unknown queue or consumer) ends it and is returned. Lost connections are
// retried.
func (c *Consumer) Run(ctx context.Context) error {
	r := c.r
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("pgque: the consumer is already running")
	}
	defer r.running.Store(false)
	if r.cfg.subscribe && r.cfg.subconsumer == "" {
		if _, err := r.pool.Exec(ctx, "SELECT pgque.subscribe($1::text, $2::text)", r.queue, r.consumer); err != nil {
			return translate(err)
		}
	} else if r.cfg.subscribe {
		if _, err := r.pool.Exec(ctx, "SELECT pgque.register_subconsumer($1::text, $2::text, $3::text)",
			r.queue, r.consumer, r.cfg.subconsumer); err != nil {
			return translate(err)
		}
	}
	wait, headers, err := c.serverWait(ctx)
	if err != nil {
		return err
	}
	c.serverWaits.Store(wait > 0)
	var l *listener
	if wait == 0 {
		l = r.listen(ctx)
	}
	defer func() {
		if l != nil {
			l.close()
		}
	}()
	for ctx.Err() == nil {
		g := r.notify.gen()
		t0 := time.Now()
		var n int
		if wait > 0 {
			var msgs []*Message
			msgs, err = r.receiveWaiting(ctx, wait, headers)
			if err == nil {
				n, err = c.handle(ctx, msgs)
			}
		} else {
			n, err = c.RunOnce(ctx)
		}
		if err != nil {
			var pe *Error
			if errors.As(err, &pe) {
				return err
			}
			if ctx.Err() != nil {
				break
			}
			r.cfg.logger.Warn("pgque consumer: retrying in 1 s", "queue", r.queue, "consumer", r.consumer, "error", err)
			sleep(ctx, time.Second)
			continue
		}
		if wait > 0 {
			if n == 0 && time.Since(t0) < atOnce && ctx.Err() == nil {
				r.cfg.logger.Warn("pgque consumer: the waiting receive returned at once (pgque.max_wait = 0, or a "+
					"REPEATABLE READ / SERIALIZABLE default isolation?); LISTEN and poll from now on",
					"queue", r.queue, "consumer", r.consumer)
				wait = 0
				c.serverWaits.Store(false)
				l = r.listen(ctx)
			}
			continue
		}
		if n == 0 {
			waitOn(ctx, g, r.cfg.poll)
		}
	}
	return nil
}

// serverWait returns the wait of Run's waiting receives (0: Run LISTENs:
// WaitTimeout(0), a cooperative member, a server without the waiting
// receive), at most half the session's statement_timeout so that the
// timeout never cancels a wait, and whether the traced form (with headers)
// may wait too.
func (c *Consumer) serverWait(ctx context.Context) (time.Duration, bool, error) {
	r := c.r
	if r.cfg.wait == 0 || r.cfg.subconsumer != "" {
		return 0, false, nil
	}
	f, err := FeaturesOf(ctx, r.pool)
	if err != nil {
		return 0, false, err
	}
	if !f.ReceiveWait {
		return 0, false, nil
	}
	var st int64
	if err := r.pool.QueryRow(ctx, "SELECT setting::int8 FROM pg_catalog.pg_settings WHERE name = 'statement_timeout'").Scan(&st); err != nil {
		return 0, false, translate(err)
	}
	w := r.cfg.wait
	if st > 0 {
		w = min(w, time.Duration(st)*time.Millisecond/2)
	}
	return w, f.ReceiveWithHeadersWait, nil
}

// RunOnce receives one batch (pgque.receive), handles it and acks it (the
// nacks of failed events and pgque.ack in one transaction); it returns the
// batch's size (0: none). The handlers and the ack run on to the end even
// if ctx ends meanwhile.
func (c *Consumer) RunOnce(ctx context.Context) (int, error) {
	r := c.r
	var msgs []*Message
	var err error
	if r.cfg.subconsumer == "" {
		msgs, err = r.receive(ctx, "receive", "$1::text, $2::text, $3::int", r.queue, r.consumer, r.cfg.batchSize)
	} else {
		var dead *float64
		if r.cfg.deadInterval != nil {
			s := r.cfg.deadInterval.Seconds()
			dead = &s
		}
		msgs, err = r.receive(ctx, "receive_coop", "$1::text, $2::text, $3::text, $4::int, $5::float8 * interval '1 second'",
			r.queue, r.consumer, r.cfg.subconsumer, r.cfg.batchSize, dead)
	}
	if err != nil {
		return 0, err
	}
	return c.handle(ctx, msgs)
}

// handle handles a received batch and acks it (with its nacks) in one
// transaction; it returns the batch's size.
func (c *Consumer) handle(ctx context.Context, msgs []*Message) (int, error) {
	r := c.r
	if len(msgs) == 0 {
		return 0, nil
	}
	ctx = context.WithoutCancel(ctx)
	var failed []failure
	if r.txh == nil {
		for _, m := range msgs {
			r.call(ctx, nil, m, &failed)
		}
	}
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if r.txh != nil {
			for _, m := range msgs {
				r.call(ctx, tx, m, &failed)
			}
		}
		for _, f := range failed {
			args := append([]any{f.m.BatchID}, f.m.params()...)
			args = append(args, r.cfg.retryAfter.Seconds(), f.why)
			if _, err := tx.Exec(ctx, "SELECT pgque.nack($1::bigint, "+msgRowSQL(2)+", make_interval(secs => $12::float8), $13::text)", args...); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, "SELECT pgque.ack($1::bigint)", msgs[0].BatchID)
		return err
	})
	if err != nil {
		return 0, translate(err)
	}
	r.handled.Add(int64(len(msgs)))
	return len(msgs), nil
}

// PartitionedConsumer reads an event queue as partitioned consumer over N
// slots with M worker goroutines (any ratio to N), each looping
// claim_next_slot -> receive_partitioned -> handler -> ack_partitioned ->
// release_slot, so the slot that has waited longest is served next and no
// slot is left unpolled (an unpolled slot pins the queue's rotation).
// Events of one key arrive in order, on one worker at a time.
//
// A worker keeps a slot while its batches are non-empty (at most
// MaxBatchesPerClaim), renewing the lease between events once a third of
// TTL has passed; if the lease was taken over meanwhile it stops
// processing that slot at once, without acking (the new owner gets the
// same batch). With FailurePolicy "pause" a worker skips a key's remaining
// events of a batch once the handler failed on one of them (the server
// holds them back and redelivers them after the failed one).
//
// It follows an online resize of N (docs/partition-keys.md) without a
// restart: n is only the N it subscribes with; a worker whose calls are
// refused because N changed (22023, 22003), or that is handed a slot
// beyond the N it knows, re-reads N from the server and goes on with the
// new slots ([PartitionedConsumer.N] follows it).
type PartitionedConsumer struct {
	r         *runner
	n         atomic.Int32
	lostSlots atomic.Int64
}

const partitionedOptions = setWorkers | setTTL | setBatchSize | setPoll | setRetryAfter | setMaxBatches |
	setSubscribe | setWorkerID | setFailurePolicy | setLogger | setTracer

func newPartitioned(pool *pgxpool.Pool, queue, consumer string, n int, opts []Option) (*PartitionedConsumer, error) {
	r, err := newRunner("PartitionedConsumer", partitionedOptions, pool, queue, consumer, opts)
	if err != nil {
		return nil, err
	}
	if n < 1 || n > math.MaxInt32 {
		return nil, fmt.Errorf("pgque: a PartitionedConsumer needs n >= 1, not %d", n)
	}
	if r.cfg.workerID == "" {
		r.cfg.workerID = defaultID()
	}
	pc := &PartitionedConsumer{r: r}
	pc.n.Store(int32(n))
	return pc, nil
}

// NewPartitionedConsumer returns a PartitionedConsumer of queue as
// consumer over n slots with handler h. Options: Workers (1), TTL (30 s),
// BatchSize (100), PollInterval (2 s), RetryAfter (60 s),
// MaxBatchesPerClaim (16), Subscribe (true), WorkerID, FailurePolicy
// ("skip", "resume"), Logger, TracerProvider. The pool needs a connection
// per worker (MaxConns of at least Workers + 1 for the Tx form).
func NewPartitionedConsumer(pool *pgxpool.Pool, queue, consumer string, n int, h MessageHandler, opts ...Option) (*PartitionedConsumer, error) {
	if h == nil {
		return nil, errors.New("pgque: NewPartitionedConsumer needs a handler")
	}
	pc, err := newPartitioned(pool, queue, consumer, n, opts)
	if err != nil {
		return nil, err
	}
	pc.r.h = h
	return pc, nil
}

// NewPartitionedConsumerTx returns a PartitionedConsumer whose handler h
// runs in the transaction of its batch's fenced ack (a savepoint per
// event); the lease renewals between events go through other connections
// of the pool, so they take effect at once rather than at that commit.
func NewPartitionedConsumerTx(pool *pgxpool.Pool, queue, consumer string, n int, h TxMessageHandler, opts ...Option) (*PartitionedConsumer, error) {
	if h == nil {
		return nil, errors.New("pgque: NewPartitionedConsumerTx needs a handler")
	}
	pc, err := newPartitioned(pool, queue, consumer, n, opts)
	if err != nil {
		return nil, err
	}
	pc.r.txh = h
	return pc, nil
}

// N returns the number of slots the consumer works with (after a resize,
// the server's new N).
func (pc *PartitionedConsumer) N() int { return int(pc.n.Load()) }

// Handled returns how many events were handled (acked) so far.
func (pc *PartitionedConsumer) Handled() int64 { return pc.r.handled.Load() }

// LostSlots returns how many times a worker lost a slot it was serving
// (taken over, or the consumer resized).
func (pc *PartitionedConsumer) LostSlots() int64 { return pc.lostSlots.Load() }

// WorkerName returns the lease owner name of worker goroutine i: "<WorkerID>/<i>".
func (pc *PartitionedConsumer) WorkerName(i int) string {
	return fmt.Sprintf("%s/%d", pc.r.cfg.workerID, i)
}

// Run subscribes the consumer (Subscribe(true), the default: with n slots
// and the FailurePolicy; one subscribed with another N since a resize
// follows the server's N), starts the workers and returns when ctx ends
// and each has acked the batch in hand. A server error of a call ends
// every worker and is returned.
func (pc *PartitionedConsumer) Run(ctx context.Context) error {
	r := pc.r
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("pgque: the consumer is already running")
	}
	defer r.running.Store(false)
	if r.cfg.subscribe {
		n := pc.n.Load()
		var err error
		if r.cfg.failurePolicy == "skip" && r.cfg.onDeadLetter == "resume" {
			_, err = r.pool.Exec(ctx, "SELECT pgque.subscribe_partitioned($1::text, $2::text, $3::int4)", r.queue, r.consumer, n)
		} else {
			_, err = r.pool.Exec(ctx, "SELECT pgque.subscribe_partitioned($1::text, $2::text, $3::int4, $4::text, $5::text)",
				r.queue, r.consumer, n, r.cfg.failurePolicy, r.cfg.onDeadLetter)
		}
		if err = translate(err); err != nil {
			if !errors.Is(err, ErrInvalidParameterValue) {
				return err
			}
			// Subscribed already with another N (resized since): follow the server's.
			got, rerr := pc.refreshN(ctx)
			if rerr != nil {
				return rerr
			}
			if got == int(n) {
				return err
			}
		}
	}
	l := r.listen(ctx)
	defer l.close()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	var once sync.Once
	var fatal error
	for i := range r.cfg.workers {
		wg.Go(func() {
			if err := pc.worker(ctx, i); err != nil {
				once.Do(func() { fatal = err })
				r.cfg.logger.Error("pgque consumer: worker failed", "worker", pc.WorkerName(i), "error", err)
				stop()
			}
		})
	}
	wg.Wait()
	return fatal
}

func isPgque(err error) bool {
	var pe *Error
	return errors.As(err, &pe) && !errors.Is(err, ErrSlotLost)
}

// worker is one goroutine's claim_next_slot loop; it returns a server
// error of a call (nil when ctx ended).
func (pc *PartitionedConsumer) worker(ctx context.Context, i int) error {
	r := pc.r
	wid := pc.WorkerName(i)
	idle := 0
	for ctx.Err() == nil {
		g := r.notify.gen()
		var slot *int32
		var epoch *int64
		err := r.pool.QueryRow(ctx, "SELECT slot, epoch FROM pgque.claim_next_slot($1::text, $2::text, $3::text, make_interval(secs => $4::float8))",
			r.queue, r.consumer, wid, r.cfg.ttl.Seconds()).Scan(&slot, &epoch)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && (slot == nil || epoch == nil)) {
			// Every slot is held by a live lease of another worker.
			waitOn(ctx, g, r.cfg.poll)
			continue
		}
		if err != nil {
			err = translate(err)
			if ctx.Err() != nil {
				return nil
			}
			if isPgque(err) {
				return err
			}
			r.cfg.logger.Warn("pgque consumer: retrying in 1 s", "worker", wid, "error", err)
			sleep(ctx, time.Second)
			continue
		}
		if int(*slot) >= pc.N() {
			// A slot of a bigger N: the consumer was resized.
			if _, err := pc.refreshN(ctx); err != nil && isPgque(err) {
				return err
			}
		}
		got, err := pc.serveSlot(ctx, wid, *slot, *epoch)
		if err != nil {
			if errors.Is(err, ErrSlotLost) {
				r.cfg.logger.Info("pgque consumer: slot lost", "worker", wid, "error", err)
				pc.lostSlots.Add(1)
				continue
			}
			if ctx.Err() != nil {
				return nil
			}
			if isPgque(err) {
				return err
			}
			r.cfg.logger.Warn("pgque consumer: retrying in 1 s", "worker", wid, "error", err)
			sleep(ctx, time.Second)
			continue
		}
		if got > 0 {
			idle = 0
		} else {
			idle++
		}
		if idle >= max(1, (pc.N()+r.cfg.workers-1)/r.cfg.workers) {
			idle = 0
			waitOn(ctx, g, r.cfg.poll)
		}
	}
	return nil
}

func slotLost(format string, a ...any) error {
	return clientError("", kindSlotLost, format, a...)
}

func resizeRefusal(err error) bool {
	return errors.Is(err, ErrInvalidParameterValue) || errors.Is(err, ErrNumericValueOutOfRange)
}

// serveSlot drains up to MaxBatchesPerClaim batches of a claimed slot, then
// releases it; it returns the number of events handled. ErrSlotLost when
// the lease was taken over or the consumer resized (nothing acked).
func (pc *PartitionedConsumer) serveSlot(ctx context.Context, wid string, slot int32, epoch int64) (int, error) {
	r := pc.r
	n := pc.n.Load()
	base := context.WithoutCancel(ctx)
	renewed := time.Now()
	total := 0
	for range r.cfg.maxBatchesPerClaim {
		if ctx.Err() != nil {
			break
		}
		msgs, err := r.receive(ctx, "receive_partitioned", "$1::text, $2::text, $3::int4, $4::int4, $5::text, $6::int",
			r.queue, r.consumer, slot, n, wid, r.cfg.batchSize)
		if err != nil {
			if errors.Is(err, ErrWrongState) {
				return total, slotLost("slot %d: lease lost before receive (%v)", slot, err)
			}
			if resizeRefusal(err) {
				return total, pc.resized(base, slot, err, n, wid)
			}
			return total, err
		}
		renewed = time.Now()
		if len(msgs) == 0 {
			break
		}
		var failed []failure
		handleAll := func(tx pgx.Tx) error {
			// pause: a key whose event failed in this batch is skipped from
			// there on (its later events come back after it).
			blocked := map[string]bool{}
			for _, m := range msgs {
				key, keyed := m.PartitionKey()
				if keyed && blocked[key] {
					continue
				}
				if time.Since(renewed) > r.cfg.ttl/3 {
					e, err := pc.renew(base, wid, slot, epoch)
					if err != nil {
						return err
					}
					epoch, renewed = e, time.Now()
				}
				before := len(failed)
				r.call(base, tx, m, &failed)
				if r.cfg.failurePolicy == "pause" && len(failed) > before && keyed {
					blocked[key] = true
				}
			}
			return nil
		}
		if r.txh == nil {
			if err := handleAll(nil); err != nil {
				return total, err
			}
		}
		err = pgx.BeginFunc(base, r.pool, func(tx pgx.Tx) error {
			if r.txh != nil {
				if err := handleAll(tx); err != nil {
					return err
				}
			}
			for _, f := range failed {
				args := []any{r.queue, r.consumer, slot, n, wid}
				args = append(args, f.m.params()...)
				args = append(args, r.cfg.retryAfter.Seconds(), f.why)
				if _, err := tx.Exec(base, "SELECT pgque.nack_partitioned($1::text, $2::text, $3::int4, $4::int4, $5::text, "+
					msgRowSQL(6)+", make_interval(secs => $16::float8), $17::text)", args...); err != nil {
					return err
				}
			}
			_, err := tx.Exec(base, "SELECT pgque.ack_partitioned($1::text, $2::text, $3::int4, $4::int4, $5::text)",
				r.queue, r.consumer, slot, n, wid)
			return err
		})
		if err != nil {
			err = translate(err)
			if errors.Is(err, ErrSlotLost) {
				return total, err
			}
			if errors.Is(err, ErrWrongState) {
				return total, slotLost("slot %d: lease lost before ack (%v)", slot, err)
			}
			if resizeRefusal(err) {
				return total, pc.resized(base, slot, err, n, wid)
			}
			return total, err
		}
		renewed = time.Now()
		total += len(msgs)
		r.handled.Add(int64(len(msgs)))
	}
	if _, err := r.pool.Exec(base, "SELECT pgque.release_slot($1::text, $2::text, $3::int4, $4::text)", r.queue, r.consumer, slot, wid); err != nil {
		err = translate(err)
		if resizeRefusal(err) {
			// A resize between the last batch and this release (a shrink
			// leaves the slot out of range: 22003) is a lost slot.
			return total, pc.resized(base, slot, err, n, wid)
		}
		return total, err
	}
	return total, nil
}

// refreshN re-reads the consumer's N from the server (after a resize).
func (pc *PartitionedConsumer) refreshN(ctx context.Context) (int, error) {
	var n *int32
	err := pc.r.pool.QueryRow(ctx, "SELECT n FROM pgque.partition_slot_status WHERE queue_name = $1 AND consumer = $2 LIMIT 1",
		pc.r.queue, pc.r.consumer).Scan(&n)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return pc.N(), translate(err)
	}
	if n != nil {
		pc.n.Store(*n)
	}
	return pc.N(), nil
}

// resized handles a fenced call refused for the N it passed (used): when
// the server's N differs, the consumer was resized (the batch, not acked,
// is redelivered on the key's new slot): the slot is given back and
// ErrSlotLost returned, and the worker goes on with the new N. Otherwise
// the error itself. used, not N(): another worker may have refreshed N.
func (pc *PartitionedConsumer) resized(ctx context.Context, slot int32, err error, used int32, wid string) error {
	now, rerr := pc.refreshN(ctx)
	if rerr != nil {
		return rerr
	}
	if now != int(used) {
		// Not ours any more when the cutover ended every lease: ignored.
		_ = pc.releaseQuietly(ctx, slot, wid)
		return slotLost("slot %d: consumer resized from %d to %d slots", slot, used, now)
	}
	return err
}

// renew renews the slot lease and returns its epoch, or ErrSlotLost when
// another worker took it over.
func (pc *PartitionedConsumer) renew(ctx context.Context, wid string, slot int32, epoch int64) (int64, error) {
	r := pc.r
	var got *int64
	if err := r.pool.QueryRow(ctx, "SELECT pgque.claim_slot($1::text, $2::text, $3::int4, $4::text, make_interval(secs => $5::float8))",
		r.queue, r.consumer, slot, wid, r.cfg.ttl.Seconds()).Scan(&got); err != nil {
		return 0, translate(err)
	}
	// The same epoch: renewed. epoch + 1: it had lapsed and nobody took it
	// in between (a take-over would have made that epoch its own), so the
	// batch is still ours. Anything else: another worker held the slot.
	if got == nil || (*got != epoch && *got != epoch+1) {
		if got != nil {
			_ = pc.releaseQuietly(ctx, slot, wid)
			return 0, slotLost("slot %d: lease taken over (epoch %d -> %d)", slot, epoch, *got)
		}
		return 0, slotLost("slot %d: lease taken over (epoch %d -> none)", slot, epoch)
	}
	return *got, nil
}

func (pc *PartitionedConsumer) releaseQuietly(ctx context.Context, slot int32, wid string) error {
	_, err := pc.r.pool.Exec(ctx, "SELECT pgque.release_slot($1::text, $2::text, $3::int4, $4::text)", pc.r.queue, pc.r.consumer, slot, wid)
	err = translate(err)
	if errors.Is(err, ErrWrongState) {
		// An open batch: the lease lapses after its ttl and the batch is redelivered.
		return nil
	}
	return err
}
