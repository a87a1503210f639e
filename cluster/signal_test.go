package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"
)

// The first SIGINT under NotifyGraceful asks for a stop and leaves the context running; the
// second cancels it with the signal as its cause.
func TestNotifyGraceful(t *testing.T) {
	logged := make(chan string, 2)
	ctx, stop := NotifyGraceful(context.Background(), "rank 0", func(format string, args ...any) {
		logged <- fmt.Sprintf(format, args...)
	})
	defer stop()
	if cause, ok := Stopping(ctx); !ok || cause != nil {
		t.Fatalf("before a signal: Stopping = %v, %v; want nil, true", cause, ok)
	}
	wait := func() string {
		select {
		case l := <-logged:
			return l
		case <-time.After(10 * time.Second): // did not hang: a signal to ourselves arrives at once
			t.Fatal("no signal handled in 10 s")
			return ""
		}
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if l := wait(); l != "rank 0: received SIGINT: stopping after this step (again to stop at once)" {
		t.Fatalf("first signal logged %q", l)
	}
	var sig *SignalError
	if cause, _ := Stopping(ctx); !errors.As(cause, &sig) || sig.Signal != os.Interrupt {
		t.Fatalf("after the first signal Stopping = %v", cause)
	}
	if ctx.Err() != nil {
		t.Fatal("the first signal cancelled the context")
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if l := wait(); l != "rank 0: received SIGTERM, shutting down" {
		t.Fatalf("second signal logged %q", l)
	}
	<-ctx.Done()
	if !errors.As(context.Cause(ctx), &sig) || sig.Signal != syscall.SIGTERM {
		t.Fatalf("cause %v, want the SIGTERM", context.Cause(ctx))
	}
}

// WithStopper keeps the first cause; a context without one reports ok false.
func TestWithStopper(t *testing.T) {
	if _, ok := Stopping(context.Background()); ok {
		t.Fatal("a plain context carries a stop request")
	}
	ctx, request := WithStopper(context.Background())
	first, second := errors.New("first"), errors.New("second")
	request(first)
	request(second)
	if cause, ok := Stopping(ctx); !ok || cause != first {
		t.Fatalf("Stopping = %v, %v; want the first cause", cause, ok)
	}
}
