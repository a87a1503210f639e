package hooks

import (
	"fmt"
	"testing"
)

// BenchmarkFormat16 times the slice conversions of the 16-bit hooks on 1 Mi elements:
// encode (float32 → 16 bits, divided by P = 4), decode (16 bits → float32) and add (one
// reduction step of AllReduce16: decode both operands, add, encode). The bytes are the
// float32 side's (4 per element), so MB/s is float32 bytes converted per second.
//
//	go test ./hooks -run '^$' -bench 'Format16' -benchtime 20x
func BenchmarkFormat16(b *testing.B) {
	const n = 1 << 20
	src := heavyTailed(1, 0, n)
	enc := make([]uint16, n)
	enc2 := make([]uint16, n)
	dec := make([]float32, n)
	for _, f := range []Format16{FP16, BF16} {
		f.encode(enc2, heavyTailed(1, 1, n), 4)
		b.Run(f.String()+"/encode", func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				f.encode(enc, src, 4)
			}
		})
		b.Run(f.String()+"/decode", func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				f.decode(dec, enc)
			}
		})
		b.Run(f.String()+"/add", func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				f.addInto(enc, enc, enc2)
			}
		})
	}
}

// BenchmarkCompress16 times one call of fp16, bf16 and allreduce on a 14.7 M-element bucket
// (56 MiB of float32) on 4 in-process ranks. Each call also copies every rank's input and
// output (the harness), the same for every hook.
//
//	go test ./hooks -run '^$' -bench 'Compress16' -benchtime 5x
func BenchmarkCompress16(b *testing.B) {
	const p, n = 4, 14_700_000
	gs := grads(1, p, n)
	for _, spec := range []string{"allreduce", "fp16", "bf16"} {
		b.Run(fmt.Sprintf("%s/P=%d/n=%d", spec, p, n), func(b *testing.B) {
			w := newWorld(b, p, spec)
			b.SetBytes(4 * n)
			for b.Loop() {
				w.call(b, 0, gs)
			}
		})
	}
}
