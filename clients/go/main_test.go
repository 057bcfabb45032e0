package pgque_test

// Tests against a real server with pgque preloaded: clients/run.sh starts
// one and exports PGQUE_TEST_HOST (its socket directory) and
// PGQUE_TEST_PORT. TestMain makes one database with the extension; each
// test uses queues of its own (unique names).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const testDB = "pgque_go_test"

var dsn string

func TestMain(m *testing.M) {
	if os.Getenv("PGQUE_GO_SIGTERM_WORKER") != "" {
		os.Exit(sigtermWorker())
	}
	host, port := os.Getenv("PGQUE_TEST_HOST"), os.Getenv("PGQUE_TEST_PORT")
	if host == "" || port == "" {
		fmt.Fprintln(os.Stderr, "PGQUE_TEST_HOST/PORT not set: run these tests through clients/run.sh (clients/run.sh 15 go)")
		os.Exit(2)
	}
	base := fmt.Sprintf("host=%s port=%s user=postgres", host, port)
	if err := setup(base); err != nil {
		fmt.Fprintln(os.Stderr, "test database:", err)
		os.Exit(1)
	}
	dsn = base + " dbname=" + testDB
	os.Exit(m.Run())
}

func setup(base string) error {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, base+" dbname=postgres")
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	for _, q := range []string{"DROP DATABASE IF EXISTS " + testDB + " WITH (FORCE)", "CREATE DATABASE " + testDB} {
		if _, err := c.Exec(ctx, q); err != nil {
			return err
		}
	}
	d, err := pgx.Connect(ctx, base+" dbname="+testDB)
	if err != nil {
		return err
	}
	defer d.Close(ctx)
	for _, q := range []string{"CREATE EXTENSION pgque", "CREATE TABLE handled (job_id bigint, at timestamptz DEFAULT clock_timestamp())"} {
		if _, err := d.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// newPool returns a pool on the test database, closed when the test ends.
func newPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// qname is a fresh queue name for this test.
func qname() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return "go_" + hex.EncodeToString(b)
}

// quiet is a logger for workers whose warnings a test provokes.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// waitUntil polls pred every 50 ms until it is true, or fails the test.
func waitUntil(t testing.TB, timeout time.Duration, what string, pred func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !pred() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// must runs sql on the pool and fails the test on an error.
func must(t testing.TB, p *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := p.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// scalar returns the one value of sql's one row.
func scalar[T any](t testing.TB, p *pgxpool.Pool, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := p.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// jobStates counts the queue's jobs by state.
func jobStates(t testing.TB, p *pgxpool.Pool, queue string) map[string]int {
	t.Helper()
	rows, err := p.Query(context.Background(), "SELECT state, count(*)::int FROM pgque.all_jobs WHERE queue = $1 GROUP BY state", queue)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		out[s] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func statesAre(got map[string]int, want map[string]int) bool {
	if len(got) != len(want) {
		return false
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

// running runs r.Run in a goroutine; the returned stop cancels it and
// returns Run's error (failing the test if it does not return in 60 s).
func running(t testing.TB, r interface{ Run(context.Context) error }) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	var err error
	stop = func() error {
		if stopped {
			return err
		}
		stopped = true
		cancel()
		select {
		case err = <-done:
		case <-time.After(60 * time.Second):
			t.Fatal("Run did not return within 60 s of its context's end")
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}
