package pgque_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	pgque "github.com/pgque/pgque/clients/go"
)

// OpenTelemetry (docs/tracing.md): the same spans, attributes and W3C
// headers as the Python, Rust and TypeScript clients, checked with the
// SDK's in-memory exporter.

func newTracer() (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	return sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)), exp
}

// spansNamed returns the ended spans called name, in the order they ended.
func spansNamed(exp *tracetest.InMemoryExporter, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func attrs(s tracetest.SpanStub) map[string]any {
	m := map[string]any{}
	for _, kv := range s.Attributes {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

func traceparent(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}

func jobHeaders(t testing.TB, p *pgxpool.Pool, id int64) map[string]string {
	return scalar[map[string]string](t, p, "SELECT headers FROM pgque.get_job($1)", id)
}

func TestWithoutTracingNothingIsStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	jq, eq := qname(), qname()
	must(t, p, "SELECT pgque.create_job_queue($1)", jq)
	must(t, p, "SELECT pgque.create_queue($1)", eq)
	must(t, p, "SELECT pgque.subscribe($1, 'c')", eq)
	// A no-op provider is "not configured" as well.
	id, err := pgque.Enqueue(ctx, p, jq, "k", nil, pgque.TracerProvider(noop.NewTracerProvider()))
	if err != nil {
		t.Fatal(err)
	}
	many, _ := pgque.EnqueueMany(ctx, p, jq, []pgque.JobSpec{pgque.NewJob("k", nil)})
	if h := jobHeaders(t, p, id); h != nil {
		t.Fatalf("headers without tracing: %v", h)
	}
	if h := jobHeaders(t, p, many[0].JobID); h != nil {
		t.Fatalf("headers without tracing: %v", h)
	}
	if _, err := pgque.Send(ctx, p, eq, map[string]int{"i": 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := pgque.SendBatch(ctx, p, eq, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	must(t, p, "SELECT pgque.force_tick($1)", eq)
	rows, _ := p.Query(ctx, "SELECT headers FROM pgque.receive_with_headers($1, 'c', 100)", eq)
	hs, err := pgx.CollectRows(rows, pgx.RowTo[map[string]string])
	if err != nil || len(hs) != 2 || hs[0] != nil || hs[1] != nil {
		t.Fatalf("event headers without tracing: %v %v", hs, err)
	}
}

func TestProducerSpansAndWorkerSpansPerAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_job_queue($1)", q)
	tp, exp := newTracer()
	tr := pgque.TracerProvider(tp)

	pctx, parent := tp.Tracer("test").Start(ctx, "parent")
	jid, err := pgque.Enqueue(pctx, p, q, "flaky", nil, tr)
	if err != nil {
		t.Fatal(err)
	}
	many, err := pgque.EnqueueMany(pctx, p, q, []pgque.JobSpec{
		pgque.NewJob("noop", nil), pgque.NewJob("noop", nil),
		pgque.NewJob("noop", nil, pgque.Headers(map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})),
	}, tr)
	if err != nil {
		t.Fatal(err)
	}
	parent.End()

	sends := spansNamed(exp, "send "+q)
	if len(sends) != 2 {
		t.Fatalf("%d send spans", len(sends))
	}
	one, batch := sends[0], sends[1]
	for _, s := range sends {
		if s.SpanKind != trace.SpanKindProducer || s.Parent.SpanID() != parent.SpanContext().SpanID() {
			t.Fatalf("send span %s: kind %v parent %v", s.Name, s.SpanKind, s.Parent)
		}
		a := attrs(s)
		if a["messaging.system"] != "pgque" || a["messaging.destination.name"] != q ||
			a["messaging.operation.type"] != "send" || a["messaging.operation.name"] != "send" {
			t.Fatalf("send attributes %v", a)
		}
	}
	if _, ok := attrs(one)["messaging.batch.message_count"]; ok {
		t.Fatal("a single enqueue has a batch count")
	}
	if attrs(batch)["messaging.batch.message_count"] != int64(3) {
		t.Fatalf("batch attributes %v", attrs(batch))
	}
	if h := jobHeaders(t, p, jid); h["traceparent"] != traceparent(one.SpanContext) {
		t.Fatalf("job headers %v, span %s", h, traceparent(one.SpanContext))
	}
	if h := jobHeaders(t, p, many[1].JobID); h["traceparent"] != traceparent(batch.SpanContext) {
		t.Fatalf("batch job headers %v", h)
	}
	// Headers given explicitly win.
	if h := jobHeaders(t, p, many[2].JobID); h["traceparent"] != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
		t.Fatalf("explicit headers %v", h)
	}

	// The worker: the first attempt fails (a child of the send span), the
	// retry starts a new trace; both link to the send span. A handler's own
	// enqueue is a child of its process span.
	var mu sync.Mutex
	var childJob int64
	w, _ := pgque.NewWorker(p, []string{q}, pgque.Concurrency(2), pgque.PollInterval(200*time.Millisecond), tr)
	w.Handle("flaky", func(ctx context.Context, j *pgque.Job) (any, error) {
		if j.Headers["traceparent"] == "" {
			return nil, errors.New("the job came without its headers")
		}
		if j.Attempt == 1 {
			return nil, errors.New("boom on the first attempt")
		}
		id, err := pgque.Enqueue(ctx, p, q, "noop", nil, tr)
		mu.Lock()
		childJob = id
		mu.Unlock()
		return nil, err
	})
	w.Handle("noop", func(context.Context, *pgque.Job) (any, error) { return nil, nil })
	running(t, w)
	waitUntil(t, 30*time.Second, "every job completed", func() bool {
		return statesAre(jobStates(t, p, q), map[string]int{"completed": 5})
	})
	var procs []tracetest.SpanStub
	for _, s := range spansNamed(exp, "process "+q) {
		if attrs(s)["pgque.job.kind"] == "flaky" {
			procs = append(procs, s)
		}
	}
	if len(procs) != 2 {
		t.Fatalf("%d process spans of the flaky job", len(procs))
	}
	first, retry := procs[0], procs[1]
	if a := attrs(first); a["pgque.job.attempt"] != int64(1) || a["messaging.message.id"] != fmt.Sprint(jid) ||
		a["messaging.operation.type"] != "process" || a["messaging.operation.name"] != "process" ||
		a["messaging.destination.name"] != q || a["messaging.system"] != "pgque" {
		t.Fatalf("process attributes %v", a)
	}
	if first.SpanKind != trace.SpanKindConsumer || first.Parent.SpanID() != one.SpanContext.SpanID() ||
		first.SpanContext.TraceID() != one.SpanContext.TraceID() {
		t.Fatal("the first attempt's span is not the send span's child")
	}
	if first.Status.Code != codes.Error || !strings.Contains(first.Status.Description, "boom") || len(first.Events) == 0 {
		t.Fatalf("the failed attempt's status %v, events %v", first.Status, first.Events)
	}
	if retry.SpanContext.TraceID() == one.SpanContext.TraceID() || retry.Parent.IsValid() || attrs(retry)["pgque.job.attempt"] != int64(2) {
		t.Fatal("the retry's span is not the root of a new trace")
	}
	for _, s := range procs {
		if len(s.Links) != 1 || s.Links[0].SpanContext.SpanID() != one.SpanContext.SpanID() {
			t.Fatalf("links %v", s.Links)
		}
	}
	mu.Lock()
	id := childJob
	mu.Unlock()
	if h := jobHeaders(t, p, id); !strings.Contains(h["traceparent"], retry.SpanContext.TraceID().String()) {
		t.Fatalf("the handler's enqueue is not in the retry's trace: %v", h)
	}
}

func TestEventSpansPerEventAndRetriesInANewTrace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_queue($1)", q)
	must(t, p, "SELECT pgque.subscribe($1, 'c1')", q)
	must(t, p, "SELECT pgque.subscribe_partitioned($1, 'pc', 2)", q)
	tp, exp := newTracer()
	tr := pgque.TracerProvider(tp)
	a, err := pgque.Send(ctx, p, q, map[string]int{"i": 0}, pgque.Type("t"), pgque.PartitionKey("k"), tr)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgque.SendBatch(ctx, p, q, []map[string]int{{"i": 1}, {"i": 2}}, pgque.Type("t"), pgque.PartitionKeys([]string{"k", "j"}), tr)
	if err != nil {
		t.Fatal(err)
	}
	explicit := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	e, err := pgque.Send(ctx, p, q, map[string]int{"i": 3}, pgque.Type("t"), pgque.Headers(explicit), tr)
	if err != nil {
		t.Fatal(err)
	}
	sends := spansNamed(exp, "send "+q)
	if len(sends) != 3 || attrs(sends[1])["messaging.batch.message_count"] != int64(2) {
		t.Fatalf("send spans %v", sends)
	}
	sendOf := map[int64]trace.SpanContext{a: sends[0].SpanContext, ids[0]: sends[1].SpanContext, ids[1]: sends[1].SpanContext}

	var mu sync.Mutex
	headers := map[int64]map[string]string{}
	failedOnce := false
	c, _ := pgque.NewConsumer(p, q, "c1", func(ctx context.Context, m *pgque.Message) error {
		mu.Lock()
		defer mu.Unlock()
		headers[m.MsgID] = m.Headers
		if m.MsgID == a && !failedOnce {
			failedOnce = true
			return errors.New("first delivery fails")
		}
		return nil
	}, pgque.PollInterval(200*time.Millisecond), pgque.RetryAfter(0), tr)
	var pcSeen sync.Map
	pc, _ := pgque.NewPartitionedConsumerTx(p, q, "pc", 2, func(ctx context.Context, m *pgque.Message, tx pgx.Tx) error {
		pcSeen.Store(m.MsgID, true)
		return nil
	}, pgque.PollInterval(200*time.Millisecond), tr)
	running(t, c)
	running(t, pc)
	must(t, p, "SELECT pgque.force_tick($1)", q)
	waitUntil(t, 30*time.Second, "every event handled, the failed one again", func() bool {
		return c.Handled() >= 5 && pc.Handled() >= 4
	})
	mu.Lock()
	if headers[a]["traceparent"] != traceparent(sendOf[a]) || headers[e]["traceparent"] != explicit["traceparent"] {
		t.Fatalf("Message.Headers %v", headers)
	}
	mu.Unlock()
	byConsumer := map[string][]tracetest.SpanStub{}
	for _, s := range spansNamed(exp, "process "+q) {
		g := attrs(s)["messaging.consumer.group.name"].(string)
		byConsumer[g] = append(byConsumer[g], s)
	}
	if len(byConsumer["c1"]) != 5 || len(byConsumer["pc"]) != 4 {
		t.Fatalf("process spans: c1 %d, pc %d", len(byConsumer["c1"]), len(byConsumer["pc"]))
	}
	for _, s := range append(byConsumer["c1"], byConsumer["pc"]...) {
		at := attrs(s)
		var id int64
		fmt.Sscan(at["messaging.message.id"].(string), &id)
		if s.SpanKind != trace.SpanKindConsumer || at["pgque.event.type"] != "t" || at["messaging.operation.name"] != "process" {
			t.Fatalf("event span %v", at)
		}
		send, traced := sendOf[id]
		if !traced {
			continue // the explicit headers' event: linked to a span this test did not record
		}
		if len(s.Links) != 1 || s.Links[0].SpanContext.SpanID() != send.SpanID() {
			t.Fatalf("event %d: links %v", id, s.Links)
		}
		redelivery := at["pgque.event.retry_count"] != int64(0)
		if redelivery == (s.SpanContext.TraceID() == send.TraceID()) {
			t.Fatalf("event %d retry_count %v: trace %s, send's %s", id, at["pgque.event.retry_count"], s.SpanContext.TraceID(), send.TraceID())
		}
		if !redelivery && s.Parent.SpanID() != send.SpanID() {
			t.Fatalf("event %d: not a child of its send span", id)
		}
		if at["messaging.consumer.group.name"] == "c1" && id == a && !redelivery && s.Status.Code != codes.Error {
			t.Fatalf("the failed delivery's span status %v", s.Status)
		}
	}
}

// The global provider: used when set with otel.SetTracerProvider, and a
// no-op set back turns tracing off again. Not parallel: it changes what
// every other test would see.
func TestTheGlobalTracerProvider(t *testing.T) {
	ctx := context.Background()
	p := newPool(t)
	q := qname()
	must(t, p, "SELECT pgque.create_job_queue($1)", q)
	tp, exp := newTracer()
	otel.SetTracerProvider(tp)
	id, err := pgque.Enqueue(ctx, p, q, "k", nil)
	otel.SetTracerProvider(noop.NewTracerProvider())
	if err != nil {
		t.Fatal(err)
	}
	sends := spansNamed(exp, "send "+q)
	if len(sends) != 1 || jobHeaders(t, p, id)["traceparent"] != traceparent(sends[0].SpanContext) {
		t.Fatalf("with the global provider: %d spans, headers %v", len(sends), jobHeaders(t, p, id))
	}
	id, err = pgque.Enqueue(ctx, p, q, "k", nil)
	if err != nil || jobHeaders(t, p, id) != nil || len(spansNamed(exp, "send "+q)) != 1 {
		t.Fatalf("after a no-op provider: %v, headers %v", err, jobHeaders(t, p, id))
	}
}
