package kernels

import (
	"fmt"
	"os"
	"strings"
)

// Winograd F(2×2, 3×3) convolution for stride-1 3×3 kernels.
//
// Every 2×2 block of outputs is computed from a 4×4 input patch with 16
// multiplications per (output channel, input channel) pair instead of 36:
//
//	Y = Aᵀ [ (G g Gᵀ) ⊙ (Bᵀ d B) ] A
//
// The 16 element-wise products over channels become 16 independent GEMMs
// U[ξ] (M×K) · V[ξ] (K×T), where ξ indexes the 4×4 transform positions, K the
// input channels and T the tiles of the whole batch. The GEMMs do 2.25× fewer
// flops than direct/im2col convolution; the price is the input, kernel and
// output transforms (memory passes) and a small loss of accuracy (the
// transforms' constants are 0, ±1 and ±½, so it stays within a few ulps of
// the GEMM result).

// WinogradOK reports whether WinogradConv3x3 can run geometry g: a 3×3 kernel,
// stride 1, equal padding of at most 2 (so every tile overlaps the image).
func WinogradOK(g ConvGeom) bool {
	return g.KH == 3 && g.KW == 3 && g.StrideH == 1 && g.StrideW == 1 &&
		g.PadH == g.PadW && g.PadH >= 0 && g.PadH <= 2 && g.OutH() > 0 && g.OutW() > 0
}

// convAlgo is SPARGO_CONV: "gemm" (default: the indirect NHWC GEMM where
// UseConvNHWC allows it, else the implicit-im2col GEMM), "im2col" (the
// implicit-im2col GEMM only) or "winograd".
var convAlgo = func() string {
	v := strings.ToLower(strings.TrimSpace(os.Getenv("SPARGO_CONV")))
	switch v {
	case "", "gemm":
		return "gemm"
	case "winograd", "im2col":
		return v
	}
	fmt.Fprintf(os.Stderr, "spargo/kernels: ignoring unknown SPARGO_CONV=%q (want gemm|im2col|winograd)\n", v)
	return "gemm"
}()

// UseWinograd reports whether a convolution of geometry g runs through
// WinogradConv3x3 rather than the implicit-im2col GEMM: only when the
// environment variable SPARGO_CONV=winograd asks for it and g is a stride-1
// 3×3 convolution. It is not the default because, measured on the VGG CIFAR
// layers at batch 32 on 2 Zen 5 cores (BenchmarkConvLayer, forward+backward),
// it is 10% faster on 16×16 maps but 3–5% slower on 32×32 and 8×8 maps and
// 1.4–3× slower on 4×4 and 2×2 maps: its transforms are scalar Go, while the
// GEMM path runs at 260–330 GFLOP/s. Its results differ from the GEMM's in
// the last bits.
func UseWinograd(g ConvGeom) bool {
	return convAlgo == "winograd" && WinogradOK(g)
}

// WinogradConv3x3 computes the stride-1 3×3 convolution y = x ⊛ w (+ bias)
// with Winograd F(2×2, 3×3). x is [N, K, H, W] as described by g (g.C = K).
// Without flip, w is a convolution weight [M, K, 3, 3]; with flip, w is stored
// as [K, M, 3, 3] and the kernel used is its transpose with every 3×3 kernel
// rotated by 180° — the kernel of the input gradient of a convolution whose
// weight is w, so that dx = WinogradConv3x3(dy, w, flip=true) with padding
// 2 - P. y is [N, M, OH, OW]; it is overwritten, or accumulated into when
// accumulate is set. bias (length M) may be nil. Parallel; deterministic.
func WinogradConv3x3(g ConvGeom, x, w []float32, m int, flip bool, bias []float32, y []float32, accumulate bool) {
	if !WinogradOK(g) {
		panic(fmt.Sprintf("kernels.WinogradConv3x3: geometry %+v is not a stride-1 3×3 convolution with padding ≤ 2", g))
	}
	g.checkImage("WinogradConv3x3", len(x))
	k := g.C
	if len(w) != m*k*9 {
		panic(fmt.Sprintf("kernels.WinogradConv3x3: w has %d elements, want %d×%d×3×3", len(w), m, k))
	}
	oh, ow := g.OutH(), g.OutW()
	if len(y) != g.N*m*oh*ow {
		panic(fmt.Sprintf("kernels.WinogradConv3x3: y has %d elements, want %d×%d×%d×%d", len(y), g.N, m, oh, ow))
	}
	if bias != nil && len(bias) != m {
		panic(fmt.Sprintf("kernels.WinogradConv3x3: bias has %d elements, want %d", len(bias), m))
	}
	if g.N == 0 || m == 0 {
		return
	}
	th, tw := (oh+1)/2, (ow+1)/2
	t := g.N * th * tw
	ub, vb, mb := getShared(16*m*k), getShared(16*k*t), getShared(16*m*t)
	u, v, mo := *ub, *vb, *mb

	winogradKernel(u, w, m, k, flip)
	winogradInput(v, x, g, th, tw)
	for xi := range 16 {
		Sgemm(false, false, m, t, k, 1, u[xi*m*k:(xi+1)*m*k], k, v[xi*k*t:(xi+1)*k*t], t, 0, mo[xi*m*t:(xi+1)*m*t], t)
	}
	winogradOutput(y, mo, bias, g.N, m, oh, ow, th, tw, accumulate)
	putShared(ub)
	putShared(vb)
	putShared(mb)
}

// winogradKernel writes u[ξ][i][j] = (G g_ij Gᵀ)[ξ] for the M×K kernel matrix.
func winogradKernel(u, w []float32, m, k int, flip bool) {
	parallelFor(m, k*40, func(lo, hi int) {
		var gk [9]float32
		for i := lo; i < hi; i++ {
			for j := range k {
				if flip { // stored [K, M, 3, 3]; rotate by 180°
					src := w[(j*m+i)*9 : (j*m+i)*9+9]
					for q := range 9 {
						gk[q] = src[8-q]
					}
				} else {
					copy(gk[:], w[(i*k+j)*9:(i*k+j)*9+9])
				}
				// rows of G·g (4×3)
				var t [4][3]float32
				for c := range 3 {
					g0, g1, g2 := gk[c], gk[3+c], gk[6+c]
					t[0][c] = g0
					t[1][c] = 0.5 * (g0 + g1 + g2)
					t[2][c] = 0.5 * (g0 - g1 + g2)
					t[3][c] = g2
				}
				off := i*k + j
				for r := range 4 {
					a0, a1, a2 := t[r][0], t[r][1], t[r][2]
					u[(r*4+0)*m*k+off] = a0
					u[(r*4+1)*m*k+off] = 0.5 * (a0 + a1 + a2)
					u[(r*4+2)*m*k+off] = 0.5 * (a0 - a1 + a2)
					u[(r*4+3)*m*k+off] = a2
				}
			}
		}
	})
}

// winogradInput writes v[ξ][c][t] = (Bᵀ d B)[ξ] for every channel c and tile
// t. It works a row of tiles at a time: the four input rows a tile row reads
// are copied with their zero padding, combined down the columns (Bᵀ d), and
// then across (· B) into 16 contiguous output runs.
func winogradInput(v, x []float32, g ConvGeom, th, tw int) {
	k, hw := g.C, g.H*g.W
	t := g.N * th * tw
	stride := k * t // distance between transform positions in v
	pad := g.PadH
	width := 2*tw + 2 // input columns a row of tiles reads
	parallelFor(k*g.N, th*tw*48, func(lo, hi int) {
		var rowsBuf [4 * 520]float32
		var rows [4][]float32
		var heap []float32
		if 4*width > len(rowsBuf) {
			heap = make([]float32, 4*width)
		}
		for r := range 4 {
			if heap != nil {
				rows[r] = heap[r*width : (r+1)*width]
			} else {
				rows[r] = rowsBuf[r*width : (r+1)*width]
			}
		}
		x0 := -pad
		lo0, hi0 := max(0, -x0), min(width, g.W-x0) // columns of rows[] inside the image
		for u := lo; u < hi; u++ {
			c, n := u/g.N, u%g.N
			img := x[(n*k+c)*hw : (n*k+c+1)*hw]
			for ty := range th {
				y0 := 2*ty - pad
				for r := range 4 {
					row := rows[r]
					yy := y0 + r
					if yy < 0 || yy >= g.H || hi0 <= lo0 {
						clear(row)
						continue
					}
					clear(row[:lo0])
					copy(row[lo0:hi0], img[yy*g.W+x0+lo0:yy*g.W+x0+hi0])
					clear(row[hi0:])
				}
				// Bᵀ d down the columns, in place.
				r0, r1, r2, r3 := rows[0], rows[1][:width], rows[2][:width], rows[3][:width]
				for q := range r0 {
					d0, d1, d2, d3 := r0[q], r1[q], r2[q], r3[q]
					r0[q], r1[q], r2[q], r3[q] = d0-d2, d1+d2, d2-d1, d1-d3
				}
				o := c*t + (n*th+ty)*tw
				for r := range 4 {
					b := rows[r]
					v0 := v[(r*4+0)*stride+o : (r*4+0)*stride+o+tw]
					v1 := v[(r*4+1)*stride+o : (r*4+1)*stride+o+tw]
					v2 := v[(r*4+2)*stride+o : (r*4+2)*stride+o+tw]
					v3 := v[(r*4+3)*stride+o : (r*4+3)*stride+o+tw]
					for tx := range v0 {
						bb := b[2*tx : 2*tx+4 : 2*tx+4]
						b0, b1, b2, b3 := bb[0], bb[1], bb[2], bb[3]
						v0[tx], v1[tx], v2[tx], v3[tx] = b0-b2, b1+b2, b2-b1, b1-b3
					}
				}
			}
		}
	})
}

// winogradOutput writes y[n][i][2ty+a][2tx+b] = (Aᵀ M A)[a][b] (+ bias[i]).
func winogradOutput(y, mo, bias []float32, nb, m, oh, ow, th, tw int, accumulate bool) {
	t := nb * th * tw
	stride := m * t
	plane := oh * ow
	parallelFor(m*nb, th*tw*40, func(lo, hi int) {
		for u := lo; u < hi; u++ {
			i, n := u/nb, u%nb
			var bv float32
			if bias != nil {
				bv = bias[i]
			}
			out := y[(n*m+i)*plane : (n*m+i+1)*plane]
			for ty := range th {
				o := i*t + (n*th+ty)*tw
				m0, m1, m2, m3 := mo[0*stride+o:0*stride+o+tw], mo[1*stride+o:1*stride+o+tw], mo[2*stride+o:2*stride+o+tw], mo[3*stride+o:3*stride+o+tw]
				m4, m5, m6, m7 := mo[4*stride+o:4*stride+o+tw], mo[5*stride+o:5*stride+o+tw], mo[6*stride+o:6*stride+o+tw], mo[7*stride+o:7*stride+o+tw]
				m8, m9, m10, m11 := mo[8*stride+o:8*stride+o+tw], mo[9*stride+o:9*stride+o+tw], mo[10*stride+o:10*stride+o+tw], mo[11*stride+o:11*stride+o+tw]
				m12, m13, m14, m15 := mo[12*stride+o:12*stride+o+tw], mo[13*stride+o:13*stride+o+tw], mo[14*stride+o:14*stride+o+tw], mo[15*stride+o:15*stride+o+tw]
				y0 := 2 * ty
				two := y0+1 < oh
				row0 := out[y0*ow : y0*ow+ow]
				row1 := row0
				if two {
					row1 = out[(y0+1)*ow : (y0+1)*ow+ow]
				}
				for tx := range m0 {
					// Aᵀ M: two rows of four.
					a0 := m0[tx] + m4[tx] + m8[tx]
					a1 := m1[tx] + m5[tx] + m9[tx]
					a2 := m2[tx] + m6[tx] + m10[tx]
					a3 := m3[tx] + m7[tx] + m11[tx]
					c0 := m4[tx] - m8[tx] - m12[tx]
					c1 := m5[tx] - m9[tx] - m13[tx]
					c2 := m6[tx] - m10[tx] - m14[tx]
					c3 := m7[tx] - m11[tx] - m15[tx]
					v00, v01 := a0+a1+a2+bv, a1-a2-a3+bv
					v10, v11 := c0+c1+c2+bv, c1-c2-c3+bv
					xx := 2 * tx
					if xx+1 < ow {
						if accumulate {
							row0[xx] += v00
							row0[xx+1] += v01
							if two {
								row1[xx] += v10
								row1[xx+1] += v11
							}
						} else {
							row0[xx], row0[xx+1] = v00, v01
							if two {
								row1[xx], row1[xx+1] = v10, v11
							}
						}
						continue
					}
					if accumulate {
						row0[xx] += v00
						if two {
							row1[xx] += v10
						}
					} else {
						row0[xx] = v00
						if two {
							row1[xx] = v10
						}
					}
				}
			}
		}
	})
}
