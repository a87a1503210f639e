//go:build linux

package comm

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// BenchmarkAllReduceTransport compares the all-reduce (Auto) on shared memory and on TCP over
// loopback, P ranks in this process, at 4 KiB, 1 MiB and 64 MiB per rank: ns/op is the time
// of one all-reduce on every rank, MB/s the vector's size over that time.
//
//	go test ./comm -run '^$' -bench AllReduceTransport -benchtime 20x
func BenchmarkAllReduceTransport(b *testing.B) {
	for _, tr := range []string{"shm", "tcp"} {
		for _, p := range []int{2, 4} {
			for _, size := range []int{4 << 10, 1 << 20, 64 << 20} {
				b.Run(fmt.Sprintf("%s/P=%d/%s", tr, p, sizeName(size)), func(b *testing.B) {
					var groups []Group
					if tr == "shm" {
						groups = newShm(b, p)
					} else {
						groups = newTCP(b, p)
					}
					bufs := make([][]float32, p)
					for r := range bufs {
						bufs[r] = make([]float32, size/4)
					}
					ctx := context.Background()
					run := func() {
						var wg sync.WaitGroup
						for r, g := range groups {
							wg.Go(func() {
								if err := AllReduce(ctx, g, 1, bufs[r], Auto); err != nil {
									b.Error(err)
								}
							})
						}
						wg.Wait()
					}
					run() // warm up: pages, pools, connections
					b.SetBytes(int64(size))
					b.ResetTimer()
					for range b.N {
						run()
					}
				})
			}
		}
	}
}

// BenchmarkMemCopy is the physical limit the shared-memory transport works against: one core
// copying a buffer of the size into another (MB/s counts the bytes copied, each read once and
// written once).
func BenchmarkMemCopy(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20, 64 << 20} {
		b.Run(sizeName(size), func(b *testing.B) {
			src, dst := make([]byte, size), make([]byte, size)
			for i := range src {
				src[i] = byte(i)
			}
			copy(dst, src)
			b.SetBytes(int64(size))
			b.ResetTimer()
			for range b.N {
				copy(dst, src)
			}
		})
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
