package comm_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/comm"
)

// Three ranks of one process over real loopback sockets, authenticated with a shared secret,
// sum their vectors exactly as in-process ranks would.
func ExampleNewTCPLoopback() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	groups, err := comm.NewTCPLoopback(ctx, 3, []byte("shared secret"))
	if err != nil {
		panic(err)
	}
	results := make([][]float32, len(groups))
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() {
			r := float32(g.Rank())
			buf := []float32{r, 10 * r, 1}
			if err := comm.AllReduce(ctx, g, 0, buf, comm.Auto); err != nil {
				panic(err)
			}
			results[g.Rank()] = buf
		})
	}
	wg.Wait()
	for _, g := range groups {
		g.Close()
	}
	for r, buf := range results {
		fmt.Println("rank", r, buf)
	}
	// Output:
	// rank 0 [3 30 3]
	// rank 1 [3 30 3]
	// rank 2 [3 30 3]
}

// One rank of a multi-process job. The launcher provides the rank, the size and every rank's
// address; each process binds its own listener first. (Not run: it needs the other ranks.)
func ExampleNewTCP() {
	rank, size := 0, 2
	addrs := []string{"10.0.0.1:29600", "10.0.0.2:29600"}
	ln, err := net.Listen("tcp", ":29600")
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	g, err := comm.NewTCP(ctx, comm.TCPConfig{
		Rank: rank, Size: size, Listener: ln, Addrs: addrs,
		Secret:  []byte(os.Getenv("SPARGO_SECRET")),
		Timeout: 30 * time.Second, // a peer silent this long has failed
	})
	if err != nil {
		panic(err) // names the ranks that never connected
	}
	defer g.Close()
	grads := make([]float32, 1<<20)
	if err := comm.AllReduce(ctx, g, 0, grads, comm.Auto); err != nil {
		panic(err) // e.g. "peer rank 1 failed: connection reset by peer"
	}
}
