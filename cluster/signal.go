package cluster

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
)

// SignalError is the cause of a context from NotifyContext that a signal cancelled.
type SignalError struct{ Signal os.Signal }

func (e *SignalError) Error() string { return "received " + signalName(e.Signal) }

func signalName(s os.Signal) string {
	switch s {
	case syscall.SIGTERM:
		return "SIGTERM"
	case os.Interrupt:
		return "SIGINT"
	}
	return s.String()
}

// NotifyContext returns a copy of parent that is cancelled when the process receives SIGINT or
// SIGTERM, after logging "<name>: received SIGTERM, shutting down" through logf (nil = standard
// error). name is typically "rank 3". context.Cause(ctx) is then a *SignalError. After the first
// signal the handler is removed, so a second one ends a program that does not shut down.
// Call stop to release the handler (and cancel the context) when done; it waits for the
// watcher goroutine, so nothing outlives it.
func NotifyContext(parent context.Context, name string, logf func(format string, args ...any)) (ctx context.Context, stop context.CancelFunc) {
	if logf == nil {
		logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	}
	ctx, cancel := context.WithCancelCause(parent)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case sig := <-sigs:
			signal.Stop(sigs)
			logf("%s: received %s, shutting down", name, signalName(sig))
			cancel(&SignalError{Signal: sig})
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		cancel(context.Canceled)
		<-exited
	}
}

// stopKey is the context key of a stop request (WithStopper).
type stopKey struct{}

// stopper is a context's stop request: the first cause asked for stays.
type stopper struct {
	once  sync.Once
	cause atomic.Pointer[error]
}

// WithStopper returns a copy of parent that carries a stop request, and the function that
// makes it: request(cause) does not cancel ctx but makes Stopping(ctx) return cause (the
// first one given), so that a training loop finishes its step, saves a checkpoint and returns
// cause. NotifyGraceful calls it with the signal's *SignalError; tests call it directly.
func WithStopper(parent context.Context) (ctx context.Context, request func(cause error)) {
	s := &stopper{}
	return context.WithValue(parent, stopKey{}, s), func(cause error) {
		s.once.Do(func() { s.cause.Store(&cause) })
	}
}

// Stopping reports why ctx's program was asked to stop at its next safe point (a
// *SignalError from NotifyGraceful), and nil while it was not; ok is false when ctx carries
// no stop request at all (WithStopper), so that a loop can skip the ranks' agreement on it.
func Stopping(ctx context.Context) (cause error, ok bool) {
	s, ok := ctx.Value(stopKey{}).(*stopper)
	if !ok {
		return nil, false
	}
	if c := s.cause.Load(); c != nil {
		return *c, true
	}
	return nil, true
}

// NotifyGraceful is NotifyContext with a graceful first signal: the first SIGINT or SIGTERM
// does not cancel ctx but requests a stop (Stopping(ctx) returns its *SignalError), logged as
// "<name>: received SIGINT: stopping after this step (again to stop at once)", so that a
// training loop ends its step, saves a checkpoint and returns; the second cancels ctx with
// the *SignalError as its cause, like NotifyContext's first; then the handler is removed, so
// a third ends the program the default way. stop releases the handler, cancels ctx and waits
// for the watcher goroutine.
func NotifyGraceful(parent context.Context, name string, logf func(format string, args ...any)) (ctx context.Context, stop context.CancelFunc) {
	if logf == nil {
		logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	}
	ctx, request := WithStopper(parent)
	ctx, cancel := context.WithCancelCause(ctx)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for n := 0; ; n++ {
			select {
			case sig := <-sigs:
				if n == 0 {
					request(&SignalError{Signal: sig})
					logf("%s: received %s: stopping after this step (again to stop at once)", name, signalName(sig))
					continue
				}
				signal.Stop(sigs)
				logf("%s: received %s, shutting down", name, signalName(sig))
				cancel(&SignalError{Signal: sig})
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		cancel(context.Canceled)
		<-exited
	}
}
