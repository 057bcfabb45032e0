package pgque

import (
	"context"
	"runtime"
	"sync"
	"weak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is what the producers run on: the caller's connection, pool or
// transaction. pgx.Tx, *pgx.Conn, *pgxpool.Pool, *pgxpool.Conn and
// pgxpool.Tx all satisfy it. Each producer call is one statement on it, in
// whatever transaction it is in; nothing is committed by this package.
type DB interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// catalogSQL reads every overload of the functions the client cares
// about, with their named parameters and types. Read-only, cheap.
const catalogSQL = `
SELECT p.proname::text, p.pronargs::int,
       coalesce(p.proargnames[1:p.pronargs], '{}')::text[],
       ARRAY(SELECT pg_catalog.format_type(t, NULL)
             FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, i) ORDER BY i)::text[]
FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'pgque'
  AND p.proname = ANY ('{enqueue,enqueue_ready_rows,complete,complete_many,set_progress,enqueue_flow,job_channel,send,receive,receive_with_headers}')`

// Features is what the connected server's pgque offers, read once per
// connection (or pool) from pg_proc. The client works with servers of
// several pgque versions and uses the newer functions only where they exist.
type Features struct {
	// Outputs: complete_many takes outputs (pgque 0.7).
	Outputs bool
	// Progress: set_progress exists.
	Progress bool
	// Flows: enqueue_flow exists.
	Flows bool
	// JobChannel: job_channel exists (else the channel is pgque_jobs_<queue>).
	JobChannel bool
	// Headers: jobs carry headers (enqueue takes them, dispatch returns them).
	Headers bool
	// EventHeaders: send(queue, type, payload, partition_key, headers) and
	// its siblings take headers, receive_with_headers returns them (0.8).
	EventHeaders bool
	// ReceiveWait: the waiting receive(queue, consumer, max_return, wait
	// interval), which sleeps in the server until the consumer has a batch
	// (pgque 0.9, docs/waits.md).
	ReceiveWait bool
	// ReceiveWithHeadersWait: its receive_with_headers(queue, consumer,
	// max_return, wait interval) twin.
	ReceiveWithHeadersWait bool
	// Params maps each named parameter of the widest overload of a function
	// to its SQL type (as format_type writes it).
	Params map[string]map[string]string
}

func featuresFromRows(rows pgx.Rows) (*Features, error) {
	f := &Features{Params: map[string]map[string]string{}}
	widest := map[string]int{}
	for rows.Next() {
		var name string
		var nargs int
		var argnames, argtypes []string
		if err := rows.Scan(&name, &nargs, &argnames, &argtypes); err != nil {
			return nil, err
		}
		switch {
		case name == "complete_many" && nargs >= 3:
			f.Outputs = true
		case name == "set_progress":
			f.Progress = true
		case name == "enqueue_flow":
			f.Flows = true
		case name == "job_channel":
			f.JobChannel = true
		case name == "receive" && nargs == 4 && len(argtypes) == 4 && argtypes[3] == "interval":
			f.ReceiveWait = true
		case name == "receive_with_headers" && nargs == 4 && len(argtypes) == 4 && argtypes[3] == "interval":
			f.ReceiveWithHeadersWait = true
		}
		if w, ok := widest[name]; !ok || nargs > w {
			widest[name] = nargs
			params := map[string]string{}
			for i, n := range argnames {
				if n != "" && i < len(argtypes) {
					params[n] = argtypes[i]
				}
			}
			f.Params[name] = params
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	_, f.Headers = f.Params["enqueue"]["headers"]
	_, f.EventHeaders = f.Params["send"]["headers"]
	return f, nil
}

// ReadFeatures reads the server's features from pg_catalog with one
// read-only query on db, without the cache (see [FeaturesOf]).
func ReadFeatures(ctx context.Context, db DB) (*Features, error) {
	rows, err := db.Query(ctx, catalogSQL)
	if err != nil {
		return nil, translate(err)
	}
	defer rows.Close()
	f, err := featuresFromRows(rows)
	return f, translate(err)
}

// The cache: one entry per *pgx.Conn (a pgx.Tx and a *pgxpool.Conn count
// as their connection) or per *pgxpool.Pool, held weakly, so a closed and
// collected connection drops its entry.
var (
	connFeatures sync.Map // weak.Pointer[pgx.Conn] -> *Features
	poolFeatures sync.Map // weak.Pointer[pgxpool.Pool] -> *Features
)

type hasConn interface{ Conn() *pgx.Conn }

func cached[T any](m *sync.Map, p *T, read func() (*Features, error)) (*Features, error) {
	key := weak.Make(p)
	if f, ok := m.Load(key); ok {
		return f.(*Features), nil
	}
	f, err := read()
	if err != nil {
		return nil, err
	}
	if _, loaded := m.LoadOrStore(key, f); !loaded {
		runtime.AddCleanup(p, func(k weak.Pointer[T]) { m.Delete(k) }, key)
	}
	return f, nil
}

// FeaturesOf returns the server's features for db, read from pg_catalog on
// first use per connection (a pgx.Tx or *pgxpool.Conn shares its
// connection's entry) or per pool, then cached. Other DB implementations
// are read on every call.
func FeaturesOf(ctx context.Context, db DB) (*Features, error) {
	read := func() (*Features, error) { return ReadFeatures(ctx, db) }
	switch d := db.(type) {
	case *pgxpool.Pool:
		return cached(&poolFeatures, d, read)
	case *pgx.Conn:
		return cached(&connFeatures, d, read)
	case hasConn:
		if c := d.Conn(); c != nil {
			return cached(&connFeatures, c, read)
		}
	}
	return read()
}
