package pgque_test

// Examples against a server (they compile with go test and go vet, and are
// not run: they have no Output). The DSN is that of `make run`.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	pgque "github.com/pgque/pgque/clients/go"
)

const exampleDSN = "host=/tmp/pgque_run_15 port=55415 dbname=pgque_demo user=postgres"

// Producers take the caller's transaction: the job and the event commit
// with the order row, or not at all.
func ExampleEnqueue() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, exampleDSN)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO orders (id) VALUES ($1)", 7); err != nil {
			return err
		}
		id, err := pgque.Enqueue(ctx, tx, "emails", "welcome", map[string]string{"to": "ada@example.com"},
			pgque.Priority(5), pgque.UniqueKey("welcome:ada"))
		if err != nil {
			return err
		}
		fmt.Println("job", id)
		_, err = pgque.Send(ctx, tx, "orders", map[string]int{"id": 7},
			pgque.Type("order.created"), pgque.PartitionKey("tenant-42"))
		return err
	})
	if errors.Is(err, pgque.ErrUndefinedObject) {
		log.Fatal("create the queues first: ", err)
	}
}

// A batch of jobs in one statement, ids in input order.
func ExampleEnqueueMany() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, exampleDSN)
	defer pool.Close()
	rows, err := pgque.EnqueueMany(ctx, pool, "emails", []pgque.JobSpec{
		pgque.NewJob("welcome", map[string]int{"to": 1}),
		pgque.NewJob("digest", map[string]int{"week": 47}, pgque.RunAt(time.Now().Add(time.Hour)), pgque.UniqueKey("digest:47")),
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range rows {
		fmt.Println(r.JobID, r.State)
	}
}

// A flow: render runs after fetch, merge after both renders.
func ExampleEnqueueFlow() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, exampleDSN)
	defer pool.Close()
	jobs, err := pgque.EnqueueFlow(ctx, pool, "reports", []pgque.FlowJobSpec{
		{Key: "fetch", Kind: "fetch", Args: map[string]string{"day": "2026-12-01"}},
		{Key: "left", Kind: "render", DependsOn: []string{"fetch"}},
		{Key: "right", Kind: "render", DependsOn: []string{"fetch"}},
		{Key: "merge", Kind: "merge", DependsOn: []string{"left", "right"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("flow", jobs[0].FlowID)
}

// A worker with a plain handler, run until SIGTERM or Ctrl-C, then drained.
func ExampleWorker() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, exampleDSN)
	defer pool.Close()
	w, err := pgque.NewWorker(pool, []string{"emails"}, pgque.Concurrency(8), pgque.ShutdownTimeout(20*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	w.Handle("welcome", func(ctx context.Context, job *pgque.Job) (any, error) {
		var args struct{ To string }
		if err := job.Decode(&args); err != nil {
			return nil, err // fails the job; the server retries it with backoff
		}
		return map[string]any{"sent_to": args.To}, nil // the job's output
	})
	if err := pgque.RunUntilSignal(ctx, w); err != nil {
		log.Fatal(err)
	}
}

// An exactly-once handler: its insert and the job's completion commit in
// one transaction.
func ExampleWorker_HandleTx() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, exampleDSN)
	defer pool.Close()
	w, _ := pgque.NewWorker(pool, []string{"payments"})
	w.HandleTx("charge", func(ctx context.Context, job *pgque.Job, tx pgx.Tx) (any, error) {
		_, err := tx.Exec(ctx, "INSERT INTO charges (job_id) VALUES ($1)", job.ID)
		return nil, err
	})
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_ = w.Run(ctx)
}

// A consumer of an event queue; a handler error nacks the event.
func ExampleNewConsumer() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, exampleDSN)
	defer pool.Close()
	c, err := pgque.NewConsumer(pool, "orders", "billing", func(ctx context.Context, m *pgque.Message) error {
		key, _ := m.PartitionKey()
		fmt.Println(m.MsgID, m.Type, key, m.Payload)
		return nil
	}, pgque.RetryAfter(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	_ = pgque.RunUntilSignal(ctx, c)
}

// 16 slots, 3 workers: every slot is polled, one key's events in order.
func ExampleNewPartitionedConsumer() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, exampleDSN)
	defer pool.Close()
	pc, err := pgque.NewPartitionedConsumer(pool, "orders", "shipping", 16, func(ctx context.Context, m *pgque.Message) error {
		return nil
	}, pgque.Workers(3), pgque.TTL(30*time.Second), pgque.FailurePolicy("pause", "resume"))
	if err != nil {
		log.Fatal(err)
	}
	_ = pgque.RunUntilSignal(ctx, pc)
}
