package hooks

import (
	"fmt"
	"testing"
)

// BenchmarkHooks times one call of each sparse hook on P in-process ranks (spargo bench comm
// is the command-line version with more control).
func BenchmarkHooks(b *testing.B) {
	const p, n = 8, 1 << 20
	gs := grads(1, p, n)
	for _, spec := range []string{"spardl:density=0.01", "spardl:density=0.01,teams=2", "topka:density=0.01", "topkdsa:density=0.01", "gtopk:density=0.01"} {
		b.Run(fmt.Sprintf("%s/P=%d/n=%d", spec, p, n), func(b *testing.B) {
			w := newWorld(b, p, spec)
			for b.Loop() {
				w.call(b, 0, gs)
			}
		})
	}
}
