package kernels

import "fmt"

// Layout conversions between NCHW tensors and the channel-major matrices the
// convolution GEMMs produce and consume ([C, N·plane]: one row per channel).

// CNToNC writes src, a [c, n, plane] array, into dst as [n, c, plane], adding
// bias[ch] to every element of channel ch when bias is non-nil, and
// accumulating into dst instead of overwriting it when accumulate is set.
// Parallel over channels.
func CNToNC(dst, src []float32, c, n, plane int, bias []float32, accumulate bool) {
	layoutCheck("CNToNC", dst, src, c, n, plane)
	if bias != nil && len(bias) != c {
		panic(fmt.Sprintf("kernels.CNToNC: bias has %d elements, want %d", len(bias), c))
	}
	parallelFor(c, n*plane, func(lo, hi int) {
		for ch := lo; ch < hi; ch++ {
			var b float32
			if bias != nil {
				b = bias[ch]
			}
			for i := range n {
				s := src[(ch*n+i)*plane : (ch*n+i+1)*plane]
				d := dst[(i*c+ch)*plane : (i*c+ch+1)*plane]
				switch {
				case accumulate && b == 0:
					for q, v := range s {
						d[q] += v
					}
				case accumulate:
					for q, v := range s {
						d[q] += v + b
					}
				case b == 0:
					copy(d, s)
				default:
					for q, v := range s {
						d[q] = v + b
					}
				}
			}
		}
	})
}

// NCToCN writes src, an [n, c, plane] array, into dst as [c, n, plane].
// Parallel over channels.
func NCToCN(dst, src []float32, n, c, plane int) {
	layoutCheck("NCToCN", dst, src, c, n, plane)
	parallelFor(c, n*plane, func(lo, hi int) {
		for ch := lo; ch < hi; ch++ {
			for i := range n {
				copy(dst[(ch*n+i)*plane:(ch*n+i+1)*plane], src[(i*c+ch)*plane:(i*c+ch+1)*plane])
			}
		}
	})
}

func layoutCheck(fn string, dst, src []float32, c, n, plane int) {
	if c < 0 || n < 0 || plane < 0 {
		panic(fmt.Sprintf("kernels.%s: negative dimension c=%d n=%d plane=%d", fn, c, n, plane))
	}
	if need := c * n * plane; len(dst) != need || len(src) != need {
		panic(fmt.Sprintf("kernels.%s: dst has %d and src %d elements, want %d (c=%d n=%d plane=%d)", fn, len(dst), len(src), need, c, n, plane))
	}
}
