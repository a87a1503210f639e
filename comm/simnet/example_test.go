package simnet_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/comm/simnet"
)

// Four ranks on a 1 Gbit/s network with 50 µs latency all-reduce 1 M floats with the ring
// algorithm: 6 rounds of α + 1 MB·β on the virtual clock.
func Example() {
	net, err := simnet.New(4, simnet.Config{Alpha: 50e-6, Beta: 8e-9})
	if err != nil {
		panic(err)
	}
	var wg sync.WaitGroup
	for _, g := range net.Groups() {
		wg.Go(func() {
			buf := make([]float32, 1<<20)
			if err := comm.AllReduce(context.Background(), g, 0, buf, comm.Ring); err != nil {
				panic(err)
			}
		})
	}
	wg.Wait()
	fmt.Printf("%.3f ms\n", net.Clock(0)*1e3)
	// Output: 50.632 ms
}
