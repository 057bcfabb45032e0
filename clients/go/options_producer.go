package pgque

import (
	"encoding/json"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// EnqueueOption is an option of [Enqueue], of a job of [EnqueueMany] (see
// [NewJob]) or of a flow job ([FlowJobSpec]): one named parameter of the
// server's pgque.enqueue.
type EnqueueOption interface{ applyEnqueue(*enqueueConfig) }

// SendOption is an option of the event producers [Send], [SendBatch],
// [SendIdem] and [SendAt]. An option that does not apply to the call (a
// PartitionKeys for Send, say) is refused with 22023 before anything is sent.
type SendOption interface{ applySend(*sendConfig) }

// param is one named parameter of pgque.enqueue; many is the name of the
// matching array parameter of enqueue_ready_rows ("" for none).
type param struct {
	name  string
	many  string
	value any
}

type enqueueConfig struct {
	params []param
	tp     trace.TracerProvider
}

func (c *enqueueConfig) set(p param) {
	for i := range c.params {
		if c.params[i].name == p.name {
			c.params[i] = p
			return
		}
	}
	c.params = append(c.params, p)
}

type paramOption param

func (p paramOption) applyEnqueue(c *enqueueConfig) { c.set(param(p)) }

// Priority sets the job's priority: lower runs first, -1000..1000, default 0.
func Priority(p int) EnqueueOption { return paramOption{"priority", "priorities", p} }

// RunAt makes the job ready at t (a future time makes it scheduled).
func RunAt(t time.Time) EnqueueOption { return paramOption{"run_at", "run_at", t} }

// Actor sets the actor whose capacity and rate limits the job counts against.
func Actor(a string) EnqueueOption { return paramOption{"actor", "actors", a} }

// FairnessKey sets the round-robin fairness key.
func FairnessKey(k string) EnqueueOption {
	return paramOption{"fairness_key", "fairness_keys", k}
}

// IdentityKey allows at most one running job per (queue, key).
func IdentityKey(k string) EnqueueOption {
	return paramOption{"identity_key", "identity_keys", k}
}

// UniqueKey allows at most one live (scheduled, ready or running) job per
// (queue, key); see [OnDuplicate].
func UniqueKey(k string) EnqueueOption { return paramOption{"unique_key", "unique_keys", k} }

// MaxAttempts sets the attempts before the job fails for good (default: the queue's).
func MaxAttempts(n int) EnqueueOption { return paramOption{"max_attempts", "max_attempts", n} }

// OnDuplicate says what a duplicate unique key does: "skip" (the default:
// the call returns the holder's id, EnqueueMany reports state "duplicate")
// or "error" (23505, [ErrDuplicateJob], nothing of the call is enqueued).
// For EnqueueMany it is an option of the call, not of a job.
func OnDuplicate(mode string) EnqueueOption { return paramOption{"on_duplicate", "", mode} }

// DependsOn makes the job wait until the jobs ids completed (servers with flows).
func DependsOn(ids ...int64) EnqueueOption { return paramOption{"depends_on", "", ids} }

// Param passes any named parameter of the server's pgque.enqueue, as
// value (bound, cast to the parameter's declared type). A name the
// server's function does not have is refused with 22023 before anything is
// sent. Enqueue only: a job of EnqueueMany refuses it.
func Param(name string, value any) EnqueueOption { return paramOption{name, "", value} }

type headersOption map[string]string

func (h headersOption) applyEnqueue(c *enqueueConfig) {
	c.set(param{"headers", "headers", mustJSON(map[string]string(h))})
}
func (h headersOption) applySend(c *sendConfig) { c.headers = h; c.hasHeaders = true }

// Headers stores a small map of strings with the job or event (W3C
// traceparent / tracestate; servers with headers). Given explicitly they
// win over the ones a traced call would store (docs/tracing.md). A send
// with headers to a server without event headers fails with
// [ErrServerFeatureMissing].
func Headers(h map[string]string) interface {
	EnqueueOption
	SendOption
} {
	return headersOption(h)
}

type tracerOption struct{ tp trace.TracerProvider }

func (o tracerOption) applyEnqueue(c *enqueueConfig) { c.tp = o.tp }
func (o tracerOption) applySend(c *sendConfig)       { c.tp = o.tp }
func (o tracerOption) apply(c *config)               { c.tp = o.tp; c.set |= setTracer }

// TracerProvider traces the call, worker or consumer with tp instead of
// the global provider (otel.GetTracerProvider). Without either (or with a
// no-op provider) nothing is traced and nothing of OpenTelemetry runs.
func TracerProvider(tp trace.TracerProvider) interface {
	EnqueueOption
	SendOption
	Option
} {
	return tracerOption{tp}
}

type sendConfig struct {
	typ           string
	hasType       bool
	key           string
	hasKey        bool
	keys          []string
	hasKeys       bool
	headers       map[string]string
	hasHeaders    bool
	ttl           time.Duration
	hasTTL        bool
	tp            trace.TracerProvider
	hasPKNullable bool
	keysNullable  []*string
}

type sendFunc func(*sendConfig)

func (f sendFunc) applySend(c *sendConfig) { f(c) }

// Type sets the event type (default "default").
func Type(t string) SendOption {
	return sendFunc(func(c *sendConfig) { c.typ, c.hasType = t, true })
}

// PartitionKey sets the event's partition key (it rides extra1;
// docs/partition-keys.md). Send, SendIdem and SendAt.
func PartitionKey(k string) SendOption {
	return sendFunc(func(c *sendConfig) { c.key, c.hasKey = k, true })
}

// PartitionKeys sets one partition key per payload of a SendBatch.
func PartitionKeys(keys []string) SendOption {
	return sendFunc(func(c *sendConfig) { c.keys, c.hasKeys = keys, true })
}

// NullablePartitionKeys sets one partition key per payload of a SendBatch,
// nil for an event without a key (it goes to slot 0).
func NullablePartitionKeys(keys []*string) SendOption {
	return sendFunc(func(c *sendConfig) { c.keysNullable, c.hasPKNullable = keys, true })
}

// IdemTTL sets how long SendIdem's key stays live (default 1 hour).
func IdemTTL(d time.Duration) SendOption {
	return sendFunc(func(c *sendConfig) { c.ttl, c.hasTTL = d, true })
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		// Only called with map[string]string, which always marshals.
		panic(err)
	}
	return b
}
