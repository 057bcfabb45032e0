package pgque

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Runner is what RunUntilSignal runs: a [Worker], a [Consumer] or a
// [PartitionedConsumer].
type Runner interface {
	Run(ctx context.Context) error
}

// RunUntilSignal runs r until ctx ends or the process receives one of sigs
// (SIGTERM and SIGINT when none are given), then lets r drain as it does
// at the end of its context (a Worker: no new dispatch, running handlers
// get ShutdownTimeout, the rest handed back). It returns r's error. The
// signals are handled only while it runs, then restored.
func RunUntilSignal(ctx context.Context, r Runner, sigs ...os.Signal) error {
	if len(sigs) == 0 {
		sigs = []os.Signal{syscall.SIGTERM, os.Interrupt}
	}
	ctx, stop := signal.NotifyContext(ctx, sigs...)
	defer stop()
	return r.Run(ctx)
}
