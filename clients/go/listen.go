package pgque

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// notifier is "something may be ready", broadcast: a waiter takes the
// current channel (gen) before its query and then waits on it; a wake-up
// closes that channel and makes the next one, so one that comes while the
// waiter is busy (in a dispatch or a receive) is not lost, and every
// waiter sees it.
type notifier struct {
	mu sync.Mutex
	ch chan struct{}
}

func newNotifier() *notifier { return &notifier{ch: make(chan struct{})} }

// gen returns the channel that the next wake-up closes.
func (n *notifier) gen() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ch
}

func (n *notifier) wake() {
	n.mu.Lock()
	close(n.ch)
	n.ch = make(chan struct{})
	n.mu.Unlock()
}

// waitOn returns after g is closed, d, or ctx's end.
func waitOn(ctx context.Context, g <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-g:
	case <-t.C:
	case <-ctx.Done():
	}
}

// listener LISTENs on channels on a connection of its own (made from the
// pool's configuration, so it takes no pool slot) and wakes on every
// NOTIFY, and once after each (re)connect, since notifications sent while
// it was disconnected are gone. It runs no query besides LISTEN, so a
// slow handler or a long dispatch never delays a wake-up.
type listener struct {
	cfg      *pgx.ConnConfig
	channels []string
	wake     func()
	log      *slog.Logger
	cancel   context.CancelFunc
	done     chan struct{}
}

// startListener starts the listener and returns once its subscriptions are
// in place (or its first connect failed: it goes on retrying), so nothing
// committed after the owner's first poll goes unnoticed.
func startListener(ctx context.Context, pool *pgxpool.Pool, channels []string, wake func(), log *slog.Logger) *listener {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l := &listener{cfg: pool.Config().ConnConfig.Copy(), channels: channels, wake: wake, log: log, cancel: cancel, done: make(chan struct{})}
	ready := make(chan struct{})
	go l.loop(ctx, ready)
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
	}
	return l
}

func (l *listener) close() {
	l.cancel()
	<-l.done
}

func (l *listener) loop(ctx context.Context, ready chan struct{}) {
	defer close(l.done)
	once := func() {
		select {
		case <-ready:
		default:
			close(ready)
		}
	}
	for ctx.Err() == nil {
		err := l.session(ctx, once)
		if ctx.Err() != nil {
			return
		}
		l.log.Warn("pgque listener: reconnecting in 1 s", "error", err)
		once()
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// session is one connection's life: LISTEN, wake once, then wake per NOTIFY.
func (l *listener) session(ctx context.Context, ready func()) error {
	conn, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, ch := range l.channels {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return err
		}
	}
	ready()
	l.wake()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		l.wake()
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
