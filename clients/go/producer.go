package pgque

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Enqueued is one row of [EnqueueMany]: the job id (for a duplicate, the
// id of the job holding the key; 0 when that holder is not yet visible to
// the statement) and its state: "ready", "scheduled" or "duplicate".
type Enqueued struct {
	JobID int64
	State string
}

// JobSpec is one job of [EnqueueMany]; make it with [NewJob].
type JobSpec struct {
	Kind string
	// Args is the job's args: encoded with encoding/json (a
	// json.RawMessage is sent as it is); nil is {}.
	Args any
	// Options are per-job options: Priority, RunAt, Actor, FairnessKey,
	// IdentityKey, UniqueKey, MaxAttempts, Headers.
	Options []EnqueueOption
}

// NewJob returns the JobSpec of one job of kind with args and options.
func NewJob(kind string, args any, opts ...EnqueueOption) JobSpec {
	return JobSpec{Kind: kind, Args: args, Options: opts}
}

// FlowJobSpec is one job of [EnqueueFlow]: a key unique in the flow, its
// kind and args, the keys of the flow's jobs it runs after, and
// OnParentFailure ("cancel", the default, or "run"). Options may be
// Priority, RunAt, MaxAttempts, Actor, FairnessKey, IdentityKey and
// Headers (the server refuses others).
type FlowJobSpec struct {
	Key             string
	Kind            string
	Args            any
	DependsOn       []string
	OnParentFailure string
	Options         []EnqueueOption
}

// FlowJob is one row of [EnqueueFlow].
type FlowJob struct {
	FlowID int64
	Key    string
	JobID  int64
}

// IdemSend is the result of [SendIdem]: the event id (the original one
// when Deduped).
type IdemSend struct {
	EventID int64
	Deduped bool
}

// jsonValue encodes v as a jsonb parameter: a json.RawMessage as it is,
// anything else with encoding/json; nil is empty.
func jsonValue(v any, empty string) (json.RawMessage, error) {
	switch x := v.(type) {
	case nil:
		return json.RawMessage(empty), nil
	case json.RawMessage:
		if x == nil {
			return json.RawMessage(empty), nil
		}
		return x, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, invalidParameter("value is not JSON-serialisable: %v", err)
	}
	return b, nil
}

// namedCall is SELECT * FROM pgque.fn(name => $1::type, ...) for named
// parameters that the server's function declares, with their declared
// types (read from pg_catalog). Only those names and types are written
// into the statement; every value is a bound parameter.
func namedCall(fn string, params map[string]string, values []param) (string, []any, error) {
	var b strings.Builder
	b.WriteString("SELECT * FROM pgque.")
	b.WriteString(pgx.Identifier{fn}.Sanitize())
	b.WriteString("(")
	args := make([]any, 0, len(values))
	for i, p := range values {
		typ, ok := params[p.name]
		if !ok {
			known := make([]string, 0, len(params))
			for k := range params {
				known = append(known, k)
			}
			sort.Strings(known)
			return "", nil, invalidParameter("pgque.%s has no parameter %q on this server (it has: %s)",
				fn, p.name, strings.Join(known, ", "))
		}
		if i > 0 {
			b.WriteString(", ")
		}
		args = append(args, p.value)
		fmt.Fprintf(&b, "%s => $%d::%s", pgx.Identifier{p.name}.Sanitize(), len(args), typ)
	}
	b.WriteString(")")
	return b.String(), args, nil
}

func hasParam(ps []param, name string) bool {
	for _, p := range ps {
		if p.name == name {
			return true
		}
	}
	return false
}

// Enqueue enqueues one job (pgque.enqueue) on db, in db's transaction:
// nothing is committed here, and the job's NOTIFY fires at the caller's
// commit. It returns the job id; for a duplicate unique key (OnDuplicate
// "skip", the default) the id of the job holding the key, or 0 when that
// holder is not yet visible. One statement (and, once per connection, the
// catalogue read of [FeaturesOf]). An option the server's function does not
// have is refused with 22023 before anything is sent. When tracing is on
// (docs/tracing.md) the call runs in a PRODUCER span "send <queue>" whose
// trace context becomes the job's headers unless [Headers] is given.
func Enqueue(ctx context.Context, db DB, queue, kind string, args any, opts ...EnqueueOption) (id int64, err error) {
	var cfg enqueueConfig
	for _, o := range opts {
		o.applyEnqueue(&cfg)
	}
	a, err := jsonValue(args, "{}")
	if err != nil {
		return 0, err
	}
	f, err := FeaturesOf(ctx, db)
	if err != nil {
		return 0, err
	}
	values := []param{{name: "queue_name", value: queue}, {name: "kind", value: kind}, {name: "args", value: a}}
	for _, p := range cfg.params {
		if hasParam(values[:3], p.name) {
			return 0, invalidParameter("%q is given twice", p.name)
		}
	}
	ctx, sp := startSend(ctx, cfg.tp, queue, 1)
	defer func() { sp.end(err) }()
	params := f.Params["enqueue"]
	if h := sp.headerMap(); h != nil && !hasParam(cfg.params, "headers") {
		if _, ok := params["headers"]; ok {
			cfg.set(param{name: "headers", value: mustJSON(h)})
		}
	}
	q, vals, err := namedCall("enqueue", params, append(values, cfg.params...))
	if err != nil {
		return 0, err
	}
	var got *int64
	if err := db.QueryRow(ctx, q, vals...).Scan(&got); err != nil {
		return 0, translate(err)
	}
	if got == nil {
		return 0, nil
	}
	return *got, nil
}

// EnqueueMany enqueues a batch in one statement (pgque.enqueue_ready_rows)
// on db, in db's transaction. It returns one Enqueued per job, in input
// order. opts may be OnDuplicate (and TracerProvider); per-job options go
// in each JobSpec. In a traced context the batch is one "send <queue>"
// span and every job without Headers of its own carries its context.
func EnqueueMany(ctx context.Context, db DB, queue string, jobs []JobSpec, opts ...EnqueueOption) (out []Enqueued, err error) {
	if len(jobs) == 0 {
		return []Enqueued{}, nil
	}
	var batch enqueueConfig
	for _, o := range opts {
		o.applyEnqueue(&batch)
	}
	for _, p := range batch.params {
		if p.name != "on_duplicate" {
			return nil, invalidParameter("%q is an option of a job, not of enqueue_many (see NewJob)", p.name)
		}
	}
	n := len(jobs)
	kinds := make([]string, n)
	args := make([]json.RawMessage, n)
	var order []string
	cols := map[string]reflect.Value{}
	for i, j := range jobs {
		kinds[i] = j.Kind
		a, err := jsonValue(j.Args, "{}")
		if err != nil {
			return nil, fmt.Errorf("job %d: %w", i, err)
		}
		args[i] = a
		var cfg enqueueConfig
		for _, o := range j.Options {
			o.applyEnqueue(&cfg)
		}
		for _, p := range cfg.params {
			if p.many == "" {
				return nil, invalidParameter("job %d: %q is not a per-job option of enqueue_many", i, p.name)
			}
			col, ok := cols[p.many]
			t := reflect.TypeOf(p.value)
			if !ok {
				col = reflect.MakeSlice(reflect.SliceOf(reflect.PointerTo(t)), n, n)
				cols[p.many] = col
				order = append(order, p.many)
			} else if col.Type().Elem().Elem() != t {
				return nil, invalidParameter("job %d: %q is a %s, an earlier job's is a %s", i, p.name, t, col.Type().Elem().Elem())
			}
			v := reflect.New(t)
			v.Elem().Set(reflect.ValueOf(p.value))
			col.Index(i).Set(v)
		}
	}
	f, err := FeaturesOf(ctx, db)
	if err != nil {
		return nil, err
	}
	ctx, sp := startSend(ctx, batch.tp, queue, n)
	defer func() { sp.end(err) }()
	params := f.Params["enqueue_ready_rows"]
	if h := sp.headerMap(); h != nil {
		if _, ok := params["headers"]; ok {
			hj := mustJSON(h)
			col, ok := cols["headers"]
			if !ok {
				col = reflect.MakeSlice(reflect.TypeFor[[]*json.RawMessage](), n, n)
				cols["headers"] = col
				order = append(order, "headers")
			}
			for i := range n {
				if col.Index(i).IsNil() {
					col.Index(i).Set(reflect.ValueOf(&hj))
				}
			}
		}
	}
	values := []param{{name: "queue_name", value: queue}, {name: "kinds", value: kinds}, {name: "args", value: args}}
	for _, name := range order {
		values = append(values, param{name: name, value: cols[name].Interface()})
	}
	values = append(values, batch.params...)
	q, vals, err := namedCall("enqueue_ready_rows", params, values)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, "SELECT job_id, state FROM ("+q+") r ORDER BY ord", vals...)
	if err != nil {
		return nil, translate(err)
	}
	out = make([]Enqueued, 0, n)
	for rows.Next() {
		var id *int64
		var e Enqueued
		if err := rows.Scan(&id, &e.State); err != nil {
			rows.Close()
			return nil, translate(err)
		}
		if id != nil {
			e.JobID = *id
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, translate(err)
	}
	return out, nil
}

// EnqueueFlow enqueues a flow (pgque.enqueue_flow), all or nothing, in one
// statement on db, in db's transaction: a job waits until every job it
// depends on completed. It returns one FlowJob per job. In a traced context
// every job without Headers of its own gets the "send <queue>" span's
// context (servers whose flows take headers). A server without flows gives
// [ErrServerFeatureMissing].
func EnqueueFlow(ctx context.Context, db DB, queue string, jobs []FlowJobSpec, opts ...EnqueueOption) (out []FlowJob, err error) {
	var batch enqueueConfig
	for _, o := range opts {
		o.applyEnqueue(&batch)
	}
	if len(batch.params) > 0 {
		return nil, invalidParameter("%q is an option of a flow job, not of enqueue_flow", batch.params[0].name)
	}
	f, err := FeaturesOf(ctx, db)
	if err != nil {
		return nil, err
	}
	if !f.Flows {
		return nil, featureMissing("this server's pgque has no enqueue_flow (flows need pgque 0.7)")
	}
	ctx, sp := startSend(ctx, batch.tp, queue, len(jobs))
	defer func() { sp.end(err) }()
	traced := sp.headerMap()
	list := make([]map[string]any, len(jobs))
	for i, j := range jobs {
		m := map[string]any{"key": j.Key, "kind": j.Kind}
		if j.Args != nil {
			a, err := jsonValue(j.Args, "{}")
			if err != nil {
				return nil, fmt.Errorf("flow job %d: %w", i, err)
			}
			m["args"] = a
		}
		if j.DependsOn != nil {
			m["depends_on"] = j.DependsOn
		}
		if j.OnParentFailure != "" {
			m["on_parent_failure"] = j.OnParentFailure
		}
		var cfg enqueueConfig
		for _, o := range j.Options {
			o.applyEnqueue(&cfg)
		}
		for _, p := range cfg.params {
			m[p.name] = p.value
		}
		if _, ok := m["headers"]; !ok && traced != nil && f.Headers {
			m["headers"] = traced
		}
		list[i] = m
	}
	doc, err := json.Marshal(list)
	if err != nil {
		return nil, invalidParameter("flow is not JSON-serialisable: %v", err)
	}
	rows, err := db.Query(ctx, "SELECT flow_id, key, job_id FROM pgque.enqueue_flow($1::text, $2::jsonb)", queue, json.RawMessage(doc))
	if err != nil {
		return nil, translate(err)
	}
	out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (FlowJob, error) {
		var fj FlowJob
		err := r.Scan(&fj.FlowID, &fj.Key, &fj.JobID)
		return fj, err
	})
	return out, translate(err)
}

// payloadValue returns an event payload and the SQL type of the overload
// it goes to: a string is sent as text, as it is; anything else as jsonb
// (a json.RawMessage as it is, other values with encoding/json).
func payloadValue(v any) (any, string, error) {
	if s, ok := v.(string); ok {
		return s, "text", nil
	}
	j, err := jsonValue(v, "null")
	return j, "jsonb", err
}

func sendConfigOf(opts []SendOption) *sendConfig {
	c := &sendConfig{}
	for _, o := range opts {
		o.applySend(c)
	}
	return c
}

// refuse returns a 22023 error naming the first option of c that fn does not take.
func (c *sendConfig) refuse(fn string, key, keys, ttl bool) error {
	switch {
	case c.hasKey && !key:
		return invalidParameter("%s takes no PartitionKey (PartitionKeys for a batch)", fn)
	case (c.hasKeys || c.hasPKNullable) && !keys:
		return invalidParameter("%s takes no PartitionKeys (it is SendBatch's)", fn)
	case c.hasTTL && !ttl:
		return invalidParameter("%s takes no IdemTTL (it is SendIdem's)", fn)
	}
	return nil
}

// eventHeaders returns the headers an event send passes: the caller's
// (refused by a server without event headers), else the send span's trace
// context when the server takes it, else nil (the plain overloads). The
// catalogue is read only when there are headers to pass: an untraced send
// runs exactly the statement it always did.
func eventHeaders(ctx context.Context, db DB, c *sendConfig, sp *span) (json.RawMessage, error) {
	traced := sp.headerMap()
	if !c.hasHeaders && traced == nil {
		return nil, nil
	}
	f, err := FeaturesOf(ctx, db)
	if err != nil {
		return nil, err
	}
	if c.hasHeaders {
		if !f.EventHeaders {
			return nil, featureMissing("this server's pgque takes no event headers (they need pgque 0.8)")
		}
		return mustJSON(c.headers), nil
	}
	if f.EventHeaders {
		return mustJSON(traced), nil
	}
	return nil, nil
}

func (c *sendConfig) typeOr() string {
	if c.hasType {
		return c.typ
	}
	return "default"
}

// Send sends one event (pgque.send) on db, in db's transaction, and returns
// its id. A string payload is sent as text, anything else as JSON. Options:
// Type, PartitionKey (rides extra1), Headers (servers with event headers).
// One statement; in a traced context a "send <queue>" span whose context is
// stored as the event's headers on a server that takes them.
func Send(ctx context.Context, db DB, queue string, payload any, opts ...SendOption) (id int64, err error) {
	c := sendConfigOf(opts)
	if err := c.refuse("Send", true, false, false); err != nil {
		return 0, err
	}
	v, t, err := payloadValue(payload)
	if err != nil {
		return 0, err
	}
	ctx, sp := startSend(ctx, c.tp, queue, 1)
	defer func() { sp.end(err) }()
	h, err := eventHeaders(ctx, db, c, sp)
	if err != nil {
		return 0, err
	}
	var q string
	var args []any
	switch {
	case h != nil:
		var key *string
		if c.hasKey {
			key = &c.key
		}
		q = "SELECT pgque.send($1::text, $2::text, $3::" + t + ", $4::text, $5::jsonb)"
		args = []any{queue, c.typeOr(), v, key, h}
	case c.hasKey:
		q = "SELECT pgque.send($1::text, $2::text, $3::" + t + ", $4::text)"
		args = []any{queue, c.typeOr(), v, c.key}
	case c.hasType:
		q = "SELECT pgque.send($1::text, $2::text, $3::" + t + ")"
		args = []any{queue, c.typ, v}
	default:
		q = "SELECT pgque.send($1::text, $2::" + t + ")"
		args = []any{queue, v}
	}
	if err := db.QueryRow(ctx, q, args...).Scan(&id); err != nil {
		return 0, translate(err)
	}
	return id, nil
}

// SendBatch sends many events in one statement (pgque.send_batch) on db,
// in db's transaction, and returns their ids aligned with payloads. When
// every payload is a string they go as text, otherwise as JSON. Options:
// Type, PartitionKeys or NullablePartitionKeys (aligned with payloads),
// Headers (one object for every event). In a traced context: one "send
// <queue>" span for the batch.
func SendBatch[T any](ctx context.Context, db DB, queue string, payloads []T, opts ...SendOption) (ids []int64, err error) {
	c := sendConfigOf(opts)
	if err := c.refuse("SendBatch", false, true, false); err != nil {
		return nil, err
	}
	var keys any
	switch {
	case c.hasKeys && c.hasPKNullable:
		return nil, invalidParameter("SendBatch takes PartitionKeys or NullablePartitionKeys, not both")
	case c.hasKeys:
		if len(c.keys) != len(payloads) {
			return nil, invalidParameter("PartitionKeys must align with payloads (%d keys, %d payloads)", len(c.keys), len(payloads))
		}
		keys = c.keys
	case c.hasPKNullable:
		if len(c.keysNullable) != len(payloads) {
			return nil, invalidParameter("PartitionKeys must align with payloads (%d keys, %d payloads)", len(c.keysNullable), len(payloads))
		}
		keys = c.keysNullable
	}
	allText := len(payloads) > 0
	for _, p := range payloads {
		if _, ok := any(p).(string); !ok {
			allText = false
			break
		}
	}
	var values any
	t := "jsonb[]"
	if allText {
		s := make([]string, len(payloads))
		for i, p := range payloads {
			s[i] = any(p).(string)
		}
		values, t = s, "text[]"
	} else {
		js := make([]json.RawMessage, len(payloads))
		for i, p := range payloads {
			j, err := jsonValue(any(p), "null")
			if err != nil {
				return nil, fmt.Errorf("payload %d: %w", i, err)
			}
			js[i] = j
		}
		values = js
	}
	ctx, sp := startSend(ctx, c.tp, queue, len(payloads))
	defer func() { sp.end(err) }()
	h, err := eventHeaders(ctx, db, c, sp)
	if err != nil {
		return nil, err
	}
	var q string
	var args []any
	switch {
	case h != nil:
		q = "SELECT pgque.send_batch($1::text, $2::text, $3::" + t + ", $4::text[], $5::jsonb)"
		args = []any{queue, c.typeOr(), values, keys, h}
	case keys != nil:
		q = "SELECT pgque.send_batch($1::text, $2::text, $3::" + t + ", $4::text[])"
		args = []any{queue, c.typeOr(), values, keys}
	case c.hasType:
		q = "SELECT pgque.send_batch($1::text, $2::text, $3::" + t + ")"
		args = []any{queue, c.typ, values}
	default:
		q = "SELECT pgque.send_batch($1::text, $2::" + t + ")"
		args = []any{queue, values}
	}
	if err := db.QueryRow(ctx, q, args...).Scan(&ids); err != nil {
		return nil, translate(err)
	}
	if ids == nil {
		ids = []int64{}
	}
	return ids, nil
}

// SendIdem sends at most one event per (queue, idemKey) while the key's
// window is live (pgque.send_idem; IdemTTL, default 1 hour), on db, in db's
// transaction. It returns the event id and whether the send was deduped
// (then the id is the original event's, and nothing is stored). Options:
// IdemTTL, PartitionKey, Headers.
func SendIdem(ctx context.Context, db DB, queue, typ string, payload any, idemKey string, opts ...SendOption) (r IdemSend, err error) {
	c := sendConfigOf(opts)
	if err := c.refuse("SendIdem", true, false, true); err != nil {
		return r, err
	}
	if c.hasType {
		return r, invalidParameter("SendIdem takes its type as an argument, not as Type")
	}
	v, t, err := payloadValue(payload)
	if err != nil {
		return r, err
	}
	ttl := time.Hour
	if c.hasTTL {
		ttl = c.ttl
	}
	var key *string
	if c.hasKey {
		key = &c.key
	}
	ctx, sp := startSend(ctx, c.tp, queue, 1)
	defer func() { sp.end(err) }()
	h, err := eventHeaders(ctx, db, c, sp)
	if err != nil {
		return r, err
	}
	args := []any{queue, typ, v, idemKey, ttl.Seconds(), key}
	hs := ""
	if h != nil {
		hs = ", $7::jsonb"
		args = append(args, h)
	}
	q := "SELECT event_id, deduped FROM pgque.send_idem($1::text, $2::text, $3::" + t +
		", $4::text, make_interval(secs => $5::float8), $6::text" + hs + ")"
	if err := db.QueryRow(ctx, q, args...).Scan(&r.EventID, &r.Deduped); err != nil {
		return IdemSend{}, translate(err)
	}
	return r, nil
}

// SendAt sends one event for delivery at deliverAt (pgque.send_at) on db,
// in db's transaction, and returns its id. Options: PartitionKey, Headers
// (kept until the event is delivered).
func SendAt(ctx context.Context, db DB, queue, typ string, payload any, deliverAt time.Time, opts ...SendOption) (id int64, err error) {
	c := sendConfigOf(opts)
	if err := c.refuse("SendAt", true, false, false); err != nil {
		return 0, err
	}
	if c.hasType {
		return 0, invalidParameter("SendAt takes its type as an argument, not as Type")
	}
	v, t, err := payloadValue(payload)
	if err != nil {
		return 0, err
	}
	var key *string
	if c.hasKey {
		key = &c.key
	}
	ctx, sp := startSend(ctx, c.tp, queue, 1)
	defer func() { sp.end(err) }()
	h, err := eventHeaders(ctx, db, c, sp)
	if err != nil {
		return 0, err
	}
	args := []any{queue, typ, v, deliverAt, key}
	hs := ""
	if h != nil {
		hs = ", $6::jsonb"
		args = append(args, h)
	}
	q := "SELECT pgque.send_at($1::text, $2::text, $3::" + t + ", $4::timestamptz, $5::text" + hs + ")"
	if err := db.QueryRow(ctx, q, args...).Scan(&id); err != nil {
		return 0, translate(err)
	}
	return id, nil
}
