package cluster

import (
	"context"
	"fmt"
	"os"
	"os/signal"
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
