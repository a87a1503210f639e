package comm

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrClosed is returned (wrapped) by every operation on a Group after Close, by receives that
// were pending when their Group closed, and by operations that need a peer that has closed.
var ErrClosed = errors.New("comm: group closed")

// Group is a communicator among Size() ranks. All methods are safe for concurrent use by several
// goroutines of the same rank: different collectives may run concurrently on different tags.
//
// Messages are matched by (source rank, tag). Messages between one (sender, receiver, tag) triple
// arrive in the order they were sent (FIFO); nothing is promised across tags or senders.
type Group interface {
	// Rank is this member's index in [0, Size()).
	Rank() int
	// Size is the number of ranks.
	Size() int
	// Send delivers payload to rank `to` under `tag`. The payload may be reused by the caller
	// after Send returns.
	Send(ctx context.Context, to int, tag uint32, payload []byte) error
	// Recv receives the next message from `from` with `tag` into buf and returns its length.
	// A message longer than buf is consumed and reported as an error naming the ranks, the tag
	// and both sizes. Recv honours ctx: cancellation or a deadline returns ctx.Err() wrapped with
	// the rank and tag that were awaited.
	Recv(ctx context.Context, from int, tag uint32, buf []byte) (int, error)
	// Isend starts a send; payload must not be modified until the Request's Wait returns.
	Isend(ctx context.Context, to int, tag uint32, payload []byte) *Request
	// Irecv starts a receive into buf; buf must not be touched until the Request's Wait returns.
	// Receives posted on one (from, tag) are matched to messages in the order they were posted.
	Irecv(ctx context.Context, from int, tag uint32, buf []byte) *Request
	// Counters are this rank's communication statistics.
	Counters() *Counters
	// Close makes pending and later operations of this rank fail with ErrClosed, and the
	// other ranks' operations that need this rank (a receive from it, a send to it) fail
	// with an error wrapping ErrClosed that names this rank. A rank that returns early or
	// fails closes its group (defer g.Close()), so the others get an error instead of
	// waiting for it forever.
	Close() error
}

// Request is a pending non-blocking operation (Isend or Irecv). It completes exactly once.
type Request struct {
	done chan struct{}
	n    int
	err  error

	onWait   func()    // set by Observe before the request is handed out; may be nil
	waitOnce sync.Once // runs onWait once
}

func newRequest() *Request { return &Request{done: make(chan struct{})} }

// complete records the result and releases waiters. It must be called exactly once.
func (r *Request) complete(n int, err error) {
	r.n, r.err = n, err
	close(r.done)
}

// DoneRequest returns an already completed Request, for transports whose operation finished
// synchronously.
func DoneRequest(n int, err error) *Request {
	r := newRequest()
	r.complete(n, err)
	return r
}

// GoRequest runs fn on its own goroutine and returns a Request completed with its result;
// it lets transports and Group wrappers outside this package build Isend/Irecv from blocking calls.
func GoRequest(fn func() (int, error)) *Request {
	r := newRequest()
	go func() { r.complete(fn()) }()
	return r
}

// Wait blocks until the operation completes and returns the number of bytes sent or received.
// A receive's context is honoured by the transport, so Wait never outlives it.
func (r *Request) Wait() (int, error) {
	<-r.done
	if r.onWait != nil {
		r.waitOnce.Do(r.onWait)
	}
	return r.n, r.err
}

// Observe arranges for fn to run once, on the goroutine of the first Wait, after the operation
// has completed and before that Wait returns, and returns r. A simulated transport (comm/simnet)
// uses it to move a rank's virtual clock at the moment the rank learns a result, which is a
// point of the rank's own program order. Call it before handing r out; Done does not run fn.
func (r *Request) Observe(fn func()) *Request {
	r.onWait = fn
	return r
}

// Done is closed when the operation has completed; Wait then returns without blocking.
func (r *Request) Done() <-chan struct{} { return r.done }

// WaitAll waits for every request (nil entries are skipped) and returns the first error
// in argument order, or nil.
func WaitAll(reqs ...*Request) error {
	var first error
	for _, r := range reqs {
		if r == nil {
			continue
		}
		if _, err := r.Wait(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// checkPeer reports a clear error for a peer rank outside [0, size).
func checkPeer(op string, self, peer, size int, tag uint32) error {
	if peer < 0 || peer >= size {
		return fmt.Errorf("comm: rank %d: %s rank %d tag %d: rank out of range [0, %d)", self, op, peer, tag, size)
	}
	return nil
}

// sendRefusal is why a transport must refuse at once a send of n bytes from rank self to rank
// to (of size ranks) under tag, or nil: a peer out of range, a group already failed or closed
// (term), a context already done, a message over the transport's limit.
func sendRefusal(ctx context.Context, self, size, to int, tag uint32, term error, n, limit int) error {
	if err := checkPeer("send to", self, to, size, tag); err != nil {
		return err
	}
	var err error
	switch {
	case term != nil:
		err = term
	case ctx.Err() != nil:
		err = ctx.Err()
	case n > limit:
		err = fmt.Errorf("message of %d bytes exceeds the transport's limit of %d bytes", n, limit)
	default:
		return nil
	}
	return fmt.Errorf("comm: rank %d: send to rank %d tag %d: %w", self, to, tag, err)
}
