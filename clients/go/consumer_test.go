package pgque_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pgque "github.com/pgque/pgque/clients/go"
)

func TestConsumerAcksAndNacks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_queue($1)", q)
	must(t, p, "SELECT pgque.subscribe($1, 'c1')", q)
	payloads := make([]map[string]int, 50)
	for i := range payloads {
		payloads[i] = map[string]int{"i": i}
	}
	ids, err := pgque.SendBatch(ctx, p, q, payloads, pgque.Type("t"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []int64
	var retried [][2]int64
	c, err := pgque.NewConsumer(p, q, "c1", func(ctx context.Context, m *pgque.Message) error {
		var v struct{ I int }
		if err := m.JSON(&v); err != nil {
			return err
		}
		if m.Type != "t" || m.BatchID == 0 {
			return fmt.Errorf("message %+v", m)
		}
		if v.I == 7 && m.RetryCount == 0 {
			return errors.New("first delivery of 7 fails")
		}
		mu.Lock()
		defer mu.Unlock()
		if m.RetryCount > 0 {
			retried = append(retried, [2]int64{m.MsgID, int64(m.RetryCount)})
		}
		seen = append(seen, m.MsgID)
		return nil
	}, pgque.PollInterval(200*time.Millisecond), pgque.RetryAfter(0))
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, c)
	waitUntil(t, 30*time.Second, "every event handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == 50
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	var rest []int64
	for _, s := range seen {
		if s != ids[7] {
			rest = append(rest, s)
		}
	}
	want := slices.Delete(slices.Clone(ids), 7, 8)
	if !slices.Equal(rest, want) {
		t.Fatalf("out of order: %v", seen)
	}
	if len(retried) != 1 || retried[0] != [2]int64{ids[7], 1} {
		t.Fatalf("retried %v", retried)
	}
	if n := scalar[int64](t, p, "SELECT pending_events FROM pgque.get_consumer_info($1, 'c1')", q); n != 0 {
		t.Fatalf("%d pending", n)
	}
	if c.Handled() < 51 {
		t.Fatalf("Handled %d", c.Handled())
	}
}

func TestConsumerOfAnUnknownQueueIsATypedError(t *testing.T) {
	t.Parallel()
	p := newPool(t)
	c, err := pgque.NewConsumer(p, "no_such_"+qname(), "c", func(context.Context, *pgque.Message) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, pgque.ErrUndefinedObject) {
		t.Fatalf("Run: %v", err)
	}
}

type slotRow struct {
	slot, lastTick int64
	pending        int64
	owner          *string
}

func slots(t testing.TB, p *pgxpool.Pool, q, consumer string) []slotRow {
	t.Helper()
	rows, err := p.Query(context.Background(), "SELECT slot, coalesce(pending_events, 0)::bigint, coalesce(last_tick, 0)::bigint, lease_owner "+
		"FROM pgque.partition_slot_status WHERE queue_name = $1 AND consumer = $2 ORDER BY slot", q, consumer)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (slotRow, error) {
		var s slotRow
		return s, r.Scan(&s.slot, &s.pending, &s.lastTick, &s.owner)
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func lastTick(t testing.TB, p *pgxpool.Pool, q string) int64 {
	return scalar[int64](t, p, "SELECT last_tick_id FROM pgque.get_queue_info($1)", q)
}

// keyed sends one round of one event per key and records the ids per key.
type keyed struct {
	mu   sync.Mutex
	keys []string
	sent map[string][]int64
	got  map[string][]int64
	who  map[string]map[string]bool
}

func newKeyed(n int) *keyed {
	k := &keyed{sent: map[string][]int64{}, got: map[string][]int64{}, who: map[string]map[string]bool{}}
	for i := range n {
		k.keys = append(k.keys, fmt.Sprintf("key-%d", i))
	}
	return k
}

func (k *keyed) send(t testing.TB, p *pgxpool.Pool, q string, round int) {
	t.Helper()
	payloads := make([]map[string]any, len(k.keys))
	for i, key := range k.keys {
		payloads[i] = map[string]any{"r": round, "k": key}
	}
	ids, err := pgque.SendBatch(context.Background(), p, q, payloads, pgque.Type("t"), pgque.PartitionKeys(k.keys))
	if err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for i, key := range k.keys {
		k.sent[key] = append(k.sent[key], ids[i])
	}
}

func (k *keyed) handle(ctx context.Context, m *pgque.Message) error {
	key, _ := m.PartitionKey()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.got[key] = append(k.got[key], m.MsgID)
	return nil
}

func (k *keyed) allHandled() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	n, m := 0, 0
	for _, v := range k.sent {
		n += len(v)
	}
	for _, v := range k.got {
		m += len(v)
	}
	return n == m
}

// inOrder fails the test unless every key's events arrived once each, in order.
func (k *keyed) inOrder(t testing.TB) {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, key := range k.keys {
		if !slices.Equal(k.got[key], k.sent[key]) {
			t.Fatalf("key %s: got %v, sent %v (out of order, missing or twice)", key, k.got[key], k.sent[key])
		}
	}
}

func TestPartitionedFewerWorkersThanSlotsPollsEverySlot(t *testing.T) {
	t.Parallel()
	p := newPool(t)
	q := qname()
	const n, m = 8, 3
	must(t, p, "SELECT pgque.create_queue($1)", q)
	must(t, p, "SELECT pgque.subscribe_partitioned($1, 'pc', $2)", q, n)
	k := newKeyed(40)
	for r := range 5 {
		k.send(t, p, q, r)
	}
	pc, err := pgque.NewPartitionedConsumer(p, q, "pc", n, k.handle, pgque.Workers(m), pgque.PollInterval(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	running(t, pc)
	must(t, p, "SELECT pgque.force_tick($1)", q)
	t1 := lastTick(t, p, q)
	waitUntil(t, 60*time.Second, "pending events of every slot at 0", func() bool {
		for _, s := range slots(t, p, q, "pc") {
			if s.pending != 0 || s.lastTick < t1 {
				return false
			}
		}
		return true
	})
	// Idle slots are polled too: every slot's position follows a new tick.
	must(t, p, "SELECT pgque.force_tick($1)", q)
	t2 := lastTick(t, p, q)
	waitUntil(t, 30*time.Second, "every slot polled", func() bool {
		for _, s := range slots(t, p, q, "pc") {
			if s.lastTick < t2 {
				return false
			}
		}
		return true
	})
	if !k.allHandled() {
		t.Fatal("not every event handled")
	}
	k.inOrder(t)
	if got := len(slots(t, p, q, "pc")); got != n {
		t.Fatalf("%d slots", got)
	}
	if pc.Handled() != 200 {
		t.Fatalf("Handled %d", pc.Handled())
	}
}

func TestPartitionedWorkerThatLosesItsLeaseStopsProcessingTheSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_queue($1)", q)
	must(t, p, "SELECT pgque.subscribe_partitioned($1, 'pc', 1)", q)
	ids, err := pgque.SendBatch(ctx, p, q, []int{0, 1, 2, 3, 4}, pgque.Type("t"), pgque.PartitionKeys([]string{"k", "k", "k", "k", "k"}))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var handled []int64
	inFirst, goOn := make(chan struct{}), make(chan struct{})
	pc, err := pgque.NewPartitionedConsumer(p, q, "pc", 1, func(ctx context.Context, m *pgque.Message) error {
		mu.Lock()
		handled = append(handled, m.MsgID)
		first := len(handled) == 1
		mu.Unlock()
		if first {
			close(inFirst)
			<-goOn // past the 1 s lease, without renewing it
		}
		return nil
	}, pgque.Workers(1), pgque.TTL(time.Second), pgque.PollInterval(200*time.Millisecond), pgque.WorkerID("A"), pgque.Logger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, pc)
	must(t, p, "SELECT pgque.force_tick($1)", q)
	<-inFirst
	// The lease lapses; another worker takes the slot over.
	waitUntil(t, 10*time.Second, "A's lease to lapse", func() bool { return slots(t, p, q, "pc")[0].owner == nil })
	if e := scalar[*int64](t, p, "SELECT pgque.claim_slot($1, 'pc', 0, 'thief', '60 seconds')", q); e == nil {
		t.Fatal("the thief got no lease")
	}
	close(goOn)
	waitUntil(t, 10*time.Second, "A to notice the take-over", func() bool { return pc.LostSlots() >= 1 })
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	if !slices.Equal(handled, ids[:1]) {
		t.Fatalf("A handled %v, want only %v", handled, ids[:1])
	}
	mu.Unlock()
	// The new owner gets the whole batch again: A acked nothing.
	rows, _ := p.Query(ctx, "SELECT msg_id FROM pgque.receive_partitioned($1, 'pc', 0, 1, 'thief', 100)", q)
	again, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || !slices.Equal(again, ids) {
		t.Fatalf("the thief's batch %v %v", again, err)
	}
	if n := scalar[int](t, p, "SELECT pgque.ack_partitioned($1, 'pc', 0, 1, 'thief')", q); n != 1 {
		t.Fatalf("ack_partitioned %d", n)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(handled, ids[:1]) {
		t.Fatalf("A handled %v", handled)
	}
}

func TestPartitionedPauseKeepsAFailedKeysOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_queue($1)", q)
	must(t, p, "SELECT pgque.subscribe_partitioned($1, 'pp', 1, failure_policy => 'pause')", q)
	keys := []string{"a", "b", "a", "b", "a", "a"}
	ids, err := pgque.SendBatch(ctx, p, q, []int{0, 1, 2, 3, 4, 5}, pgque.Type("t"), pgque.PartitionKeys(keys))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var done [][2]any
	failedOnce := false
	handler := func(ctx context.Context, m *pgque.Message) error {
		mu.Lock()
		defer mu.Unlock()
		// The first delivery of a's first event fails.
		if m.MsgID == ids[0] && !failedOnce {
			failedOnce = true
			return errors.New("a's first event fails once")
		}
		key, _ := m.PartitionKey()
		done = append(done, [2]any{key, m.MsgID})
		return nil
	}
	// Its subscribe (with the same policy) is a no-op.
	pc, err := pgque.NewPartitionedConsumer(p, q, "pp", 1, handler, pgque.PollInterval(200*time.Millisecond),
		pgque.RetryAfter(0), pgque.FailurePolicy("pause", "resume"))
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, pc)
	must(t, p, "SELECT pgque.force_tick($1)", q)
	waitUntil(t, 30*time.Second, "every event handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) == len(keys)
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	var a, b []int64
	for _, d := range done {
		if d[0] == "a" {
			a = append(a, d[1].(int64))
		} else {
			b = append(b, d[1].(int64))
		}
	}
	mu.Unlock()
	if !failedOnce || !slices.Equal(a, []int64{ids[0], ids[2], ids[4], ids[5]}) || !slices.Equal(b, []int64{ids[1], ids[3]}) {
		t.Fatalf("a %v, b %v (ids %v)", a, b, ids)
	}
	if pol := scalar[string](t, p, "SELECT pc_failure_policy FROM pgque.partition_consumer WHERE pc_consumer = 'pp'"); pol != "pause" {
		t.Fatalf("policy %s", pol)
	}
	if n := scalar[int](t, p, "SELECT count(*)::int FROM pgque.partition_blocked_keys WHERE consumer = 'pp'"); n != 0 {
		t.Fatalf("%d blocked keys left", n)
	}
	// The policy is the consumer's: another one is refused.
	other, _ := pgque.NewPartitionedConsumer(p, q, "pp", 1, handler)
	if err := other.Run(ctx); !errors.Is(err, pgque.ErrInvalidParameterValue) {
		t.Fatalf("another policy: %v", err)
	}
}

// resize is an operator's online resize: begin, wait until every old slot
// drained, complete.
func resize(t testing.TB, p *pgxpool.Pool, q, consumer string, n int) {
	t.Helper()
	must(t, p, "SELECT pgque.begin_resize($1, $2, $3)", q, consumer, n)
	waitUntil(t, 60*time.Second, fmt.Sprintf("the old slots to drain (resize to %d)", n), func() bool {
		return scalar[bool](t, p, "SELECT bool_and(ready) FROM pgque.resize_ready($1, $2)", q, consumer)
	})
	if got := scalar[int](t, p, "SELECT pgque.complete_resize($1, $2)", q, consumer); got != n {
		t.Fatalf("complete_resize %d, want %d", got, n)
	}
}

func TestPartitionedFollowsAnOnlineResizeWithoutARestart(t *testing.T) {
	t.Parallel()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_queue($1)", q)
	must(t, p, "SELECT pgque.subscribe_partitioned($1, 'pr', 4)", q)
	k := newKeyed(30)
	pc, err := pgque.NewPartitionedConsumer(p, q, "pr", 4, k.handle, pgque.Workers(3), pgque.PollInterval(200*time.Millisecond), pgque.Logger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, pc)
	for r := range 3 {
		k.send(t, p, q, r)
	}
	resize(t, p, q, "pr", 8) // grow while events of before the seal are consumed
	for r := 3; r < 6; r++ {
		k.send(t, p, q, r)
	}
	must(t, p, "SELECT pgque.force_tick($1)", q)
	waitUntil(t, 60*time.Second, "every event handled after the grow", k.allHandled)
	waitUntil(t, 10*time.Second, "N to follow the grow", func() bool { return pc.N() == 8 })
	for r := 6; r < 9; r++ {
		k.send(t, p, q, r)
	}
	resize(t, p, q, "pr", 2) // shrink
	k.send(t, p, q, 9)
	must(t, p, "SELECT pgque.force_tick($1)", q)
	waitUntil(t, 60*time.Second, "every event handled after the shrink", k.allHandled)
	waitUntil(t, 10*time.Second, "N to follow the shrink", func() bool { return pc.N() == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	k.inOrder(t)
	if n := len(slots(t, p, q, "pr")); n != 2 {
		t.Fatalf("%d slots", n)
	}
	// A consumer started later with the N it was first given follows the server's.
	pc2, _ := pgque.NewPartitionedConsumer(p, q, "pr", 4, k.handle, pgque.PollInterval(200*time.Millisecond))
	running(t, pc2)
	k.send(t, p, q, 10)
	must(t, p, "SELECT pgque.force_tick($1)", q)
	waitUntil(t, 60*time.Second, "every event handled by the restarted consumer", k.allHandled)
	if pc2.N() != 2 {
		t.Fatalf("N %d", pc2.N())
	}
	k.inOrder(t)
}

// Two members of one cooperative consumer (Subconsumer, pgque.receive_coop)
// share its stream: every event handled once by one of them, a nack
// redelivered; a normal consumer beside them still gets every event.
func TestCooperativeMembersShareTheStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_queue($1)", q)
	must(t, p, "SELECT pgque.subscribe($1, 'all')", q)
	must(t, p, "SELECT pgque.register_subconsumer($1, 'grp', 'm1')", q)
	must(t, p, "SELECT pgque.register_subconsumer($1, 'grp', 'm2')", q)
	var ids []int64
	for r := 0; r < 8; r++ {
		payloads := make([]map[string]int, 5)
		for i := range payloads {
			payloads[i] = map[string]int{"i": r*5 + i}
		}
		got, err := pgque.SendBatch(ctx, p, q, payloads, pgque.Type("t"))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, got...)
		must(t, p, "SELECT pgque.force_tick($1)", q)
	}
	type handled struct {
		member string
		id     int64
		retry  int32
	}
	var mu sync.Mutex
	var seen []handled
	member := func(name string) *pgque.Consumer {
		c, err := pgque.NewConsumer(p, q, "grp", func(ctx context.Context, m *pgque.Message) error {
			var v struct{ I int }
			if err := m.JSON(&v); err != nil {
				return err
			}
			if v.I == 7 && m.RetryCount == 0 {
				return errors.New("first delivery of 7 fails")
			}
			mu.Lock()
			seen = append(seen, handled{name, m.MsgID, int32(m.RetryCount)})
			mu.Unlock()
			time.Sleep(20 * time.Millisecond) // slow, so the other member gets batches too
			return nil
		}, pgque.Subconsumer(name), pgque.BatchSize(5), pgque.PollInterval(100*time.Millisecond), pgque.RetryAfter(0))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	stops := []func() error{running(t, member("m1")), running(t, member("m2"))}
	waitUntil(t, 60*time.Second, "every event handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == 40
	})
	for _, stop := range stops {
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	var got []int64
	members := map[string]bool{}
	redelivered := false
	for _, s := range seen {
		got = append(got, s.id)
		members[s.member] = true
		redelivered = redelivered || (s.id == ids[7] && s.retry == 1)
	}
	slices.Sort(got)
	if !slices.Equal(got, ids) {
		t.Fatalf("handled %v, sent %v", got, ids)
	}
	if !redelivered || len(members) != 2 {
		t.Fatalf("redelivered %v, members %v", redelivered, members)
	}
	must(t, p, "SELECT pgque.force_tick($1)", q)
	total := 0
	for {
		rows, err := p.Query(ctx, "SELECT batch_id FROM pgque.receive($1, 'all', 1000)", q)
		if err != nil {
			t.Fatal(err)
		}
		var batch []int64
		for rows.Next() {
			var b int64
			if err := rows.Scan(&b); err != nil {
				t.Fatal(err)
			}
			batch = append(batch, b)
		}
		rows.Close()
		if len(batch) == 0 {
			break
		}
		total += len(batch)
		must(t, p, "SELECT pgque.ack($1)", batch[0])
	}
	if total < 40 {
		t.Fatalf("the normal consumer got %d", total)
	}
}
