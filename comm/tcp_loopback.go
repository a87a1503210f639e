package comm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
)

// NewTCPLoopback starts size ranks in this process, connected by NewTCP over real sockets on
// 127.0.0.1 (ports chosen by the kernel), and returns their Groups. It is meant for tests and for
// measuring the transport on one machine.
func NewTCPLoopback(ctx context.Context, size int, secret []byte) ([]Group, error) {
	return newTCPLoopback(ctx, size, func(c *TCPConfig) { c.Secret = secret })
}

// newTCPLoopback is NewTCPLoopback with a hook that adjusts each rank's configuration.
func newTCPLoopback(ctx context.Context, size int, configure func(*TCPConfig)) ([]Group, error) {
	if size < 1 {
		return nil, fmt.Errorf("comm: NewTCPLoopback: size %d, want >= 1", size)
	}
	lns := make([]net.Listener, size)
	addrs := make([]string, size)
	for r := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			for _, l := range lns[:r] {
				l.Close()
			}
			return nil, fmt.Errorf("comm: NewTCPLoopback: rank %d: %w", r, err)
		}
		lns[r], addrs[r] = ln, ln.Addr().String()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	groups := make([]Group, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() {
			cfg := TCPConfig{Rank: r, Size: size, Listener: lns[r], Addrs: addrs}
			if configure != nil {
				configure(&cfg)
			}
			groups[r], errs[r] = NewTCP(ctx, cfg)
			if errs[r] != nil {
				cancel() // the others would wait for this rank until their dial timeout
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, g := range groups {
			if g != nil {
				g.Close()
			}
		}
		return nil, err
	}
	return groups, nil
}
