package hooks

import (
	"fmt"
	"testing"
)

// BenchmarkOkTopkGaussianK times one call of oktopk and gaussiank on P in-process ranks, as
// BenchmarkHooks does for the other sparse hooks (spargo bench comm is the command-line
// version). The calls repeat on the same bucket, so Ok-Topk reuses its thresholds (tau_prime
// = 32) and boundaries (tau = 64) as in training.
func BenchmarkOkTopkGaussianK(b *testing.B) {
	const p, n = 8, 1 << 20
	gs := grads(1, p, n)
	for _, spec := range []string{"oktopk:density=0.01", "oktopk:density=0.01,balance=never", "oktopk:density=0.01,tau_prime=1,tau=1", "gaussiank:density=0.01"} {
		b.Run(fmt.Sprintf("%s/P=%d/n=%d", spec, p, n), func(b *testing.B) {
			w := newWorld(b, p, spec)
			for b.Loop() {
				w.call(b, 0, gs)
			}
		})
	}
}
