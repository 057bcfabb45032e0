package pgque

import (
	"context"
	"fmt"
	"reflect"
	"strconv"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// OpenTelemetry trace context for jobs and events (docs/tracing.md), the
// same spans as the Python, Rust and TypeScript clients:
//
//   - producers: a PRODUCER span "send <queue>" around the call, whose W3C
//     traceparent / tracestate become the job's or event's headers;
//   - the worker: a CONSUMER span "process <queue>" around each handler,
//     linked to the producer's context and its child on the first attempt
//     (a retry starts a new trace, linked);
//   - consumers: a CONSUMER span "process <queue>" per event, the same
//     rules with retry_count for the attempt.
//
// Tracing is on when a TracerProvider option is given, or the global
// provider was set (otel.SetTracerProvider) to one that is not a no-op.
// Otherwise none of this runs: no span, no headers, and the consumers
// read through the plain receives.

const instrumentation = "github.com/pgque/pgque/clients/go"

const system = "pgque"

// The headers are W3C trace context, written and read here, not through
// the application's global propagator, so that every client reads them.
var w3c = propagation.TraceContext{}

// provider returns the tracer provider to record with: explicit, else the
// global one; nil when that is the API's default (nothing set) or a no-op.
func provider(explicit trace.TracerProvider) trace.TracerProvider {
	tp := explicit
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if tp == nil {
		return nil
	}
	t := reflect.TypeOf(tp)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.PkgPath() {
	case "go.opentelemetry.io/otel/internal/global", "go.opentelemetry.io/otel/trace/noop":
		return nil
	case "go.opentelemetry.io/otel/trace":
		if t.Name() == "noopTracerProvider" {
			return nil
		}
	}
	return tp
}

// tracingActive reports whether spans would be recorded with explicit (or
// the global provider): the consumers read event headers only then.
func tracingActive(explicit trace.TracerProvider) bool { return provider(explicit) != nil }

// span is a started span, or nil when tracing is off (every method is
// then a no-op).
type span struct {
	s       trace.Span
	headers map[string]string
}

// startSend opens the PRODUCER span "send <queue>" around an enqueue or
// send of n jobs or events, child of ctx's span; nil when tracing is off.
func startSend(ctx context.Context, explicit trace.TracerProvider, queue string, n int) (context.Context, *span) {
	tp := provider(explicit)
	if tp == nil {
		return ctx, nil
	}
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", system),
		attribute.String("messaging.destination.name", queue),
		attribute.String("messaging.operation.type", "send"),
		attribute.String("messaging.operation.name", "send"),
	}
	if n != 1 {
		attrs = append(attrs, attribute.Int("messaging.batch.message_count", n))
	}
	ctx, s := tp.Tracer(instrumentation).Start(ctx, "send "+queue,
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	sp := &span{s: s}
	if s.SpanContext().IsValid() {
		carrier := propagation.MapCarrier{}
		w3c.Inject(ctx, carrier)
		if len(carrier) > 0 {
			sp.headers = carrier
		}
	}
	return ctx, sp
}

// headerMap returns the span's W3C headers (nil: none to carry).
func (sp *span) headerMap() map[string]string {
	if sp == nil {
		return nil
	}
	return sp.headers
}

// end ends the span, marking it as an error when err is not nil.
func (sp *span) end(err error) {
	if sp == nil {
		return
	}
	if err != nil {
		sp.s.RecordError(err)
		sp.s.SetStatus(codes.Error, err.Error())
	}
	sp.s.End()
}

// producerOf returns the producer's span context from a job's or event's
// headers (invalid when there is none).
func producerOf(headers map[string]string) trace.SpanContext {
	if _, ok := headers["traceparent"]; !ok {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), propagation.MapCarrier(headers)))
}

// startConsumer opens a CONSUMER span name with attrs: linked to the
// producer's context from headers, its child when first, else the root of
// a new trace. The returned context carries it (the handler runs in it).
func startConsumer(ctx context.Context, tp trace.TracerProvider, name string, headers map[string]string, first bool, attrs []attribute.KeyValue) (context.Context, *span) {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)}
	if sc := producerOf(headers); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		if first {
			ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
		} else {
			opts = append(opts, trace.WithNewRoot())
		}
	} else if !first {
		opts = append(opts, trace.WithNewRoot())
	}
	ctx, s := tp.Tracer(instrumentation).Start(ctx, name, opts...)
	return ctx, &span{s: s}
}

// startProcess opens the "process <queue>" span around one job's handler
// (nil when tracing is off).
func startProcess(ctx context.Context, explicit trace.TracerProvider, j *Job) (context.Context, *span) {
	tp := provider(explicit)
	if tp == nil {
		return ctx, nil
	}
	return startConsumer(ctx, tp, "process "+j.Queue, j.Headers, j.Attempt <= 1, []attribute.KeyValue{
		attribute.String("messaging.system", system),
		attribute.String("messaging.destination.name", j.Queue),
		attribute.String("messaging.message.id", strconv.FormatInt(j.ID, 10)),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.operation.name", "process"),
		attribute.String("pgque.job.kind", j.Kind),
		attribute.Int("pgque.job.attempt", j.Attempt),
	})
}

// startEvent opens the "process <queue>" span around one event's handler
// call for consumer (nil when tracing is off); retry_count NULL or 0 is
// the first delivery.
func startEvent(ctx context.Context, explicit trace.TracerProvider, queue, consumer string, m *Message) (context.Context, *span) {
	tp := provider(explicit)
	if tp == nil {
		return ctx, nil
	}
	retries := m.RetryCount
	return startConsumer(ctx, tp, "process "+queue, m.Headers, retries == 0, []attribute.KeyValue{
		attribute.String("messaging.system", system),
		attribute.String("messaging.destination.name", queue),
		attribute.String("messaging.consumer.group.name", consumer),
		attribute.String("messaging.message.id", strconv.FormatInt(m.MsgID, 10)),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.operation.name", "process"),
		attribute.String("pgque.event.type", m.Type),
		attribute.Int("pgque.event.retry_count", retries),
	})
}

// panicError is a handler's panic, as an error (the job fails with it).
type panicError struct {
	value any
	stack []byte
}

func (p *panicError) Error() string { return fmt.Sprintf("panic: %v\n%s", p.value, p.stack) }
