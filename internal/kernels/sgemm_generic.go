package kernels

// genericImpl is the portable pure-Go micro-kernel: a 4×8 register tile.
var genericImpl = &gemmImpl{
	name: "generic",
	mr:   4, nr: 8,
	mc: 128, kc: 256, nc: 2048,
	kernel:   kernelGeneric4x8,
	indirect: indirectGeneric, indirectNarrow: indirectGenericNarrow,
	bIndirect: func(k int, a, x []float32, base, split int, offs []int, c []float32, ldc int, beta float32) {
		bIndirectGeneric(4, 8, k, a, x, base, split, offs, c, ldc, beta)
	},
	vec:  genericVec,
	half: genericHalf,
}

// kernelGeneric4x8 computes a 4×8 tile from packed slivers (see gemmImpl.kernel).
func kernelGeneric4x8(k int, a, b, c []float32, ldc int, alpha, beta float32) {
	var acc [4][8]float32
	a = a[:4*k]
	b = b[:8*k]
	for p := 0; p < k; p++ {
		ap := a[4*p : 4*p+4 : 4*p+4]
		bp := b[8*p : 8*p+8 : 8*p+8]
		b0, b1, b2, b3, b4, b5, b6, b7 := bp[0], bp[1], bp[2], bp[3], bp[4], bp[5], bp[6], bp[7]
		for i := range 4 {
			ai := ap[i]
			r := &acc[i]
			r[0] += ai * b0
			r[1] += ai * b1
			r[2] += ai * b2
			r[3] += ai * b3
			r[4] += ai * b4
			r[5] += ai * b5
			r[6] += ai * b6
			r[7] += ai * b7
		}
	}
	for i := range 4 {
		row := c[i*ldc : i*ldc+8 : i*ldc+8]
		if beta == 0 {
			for j := range 8 {
				row[j] = alpha * acc[i][j]
			}
		} else {
			for j := range 8 {
				row[j] = alpha*acc[i][j] + beta*row[j]
			}
		}
	}
}

// kernelGeneric is the portable micro-kernel for an mr×nr tile (mr ≤ 8, nr ≤ 32;
// see gemmImpl.kernel).
func kernelGeneric(mr, nr int) func(k int, a, b, c []float32, ldc int, alpha, beta float32) {
	return func(k int, a, b, c []float32, ldc int, alpha, beta float32) {
		var acc [8 * 32]float32
		for p := range k {
			bp := b[p*nr : p*nr+nr]
			for r, av := range a[p*mr : p*mr+mr] {
				row := acc[r*nr : r*nr+nr]
				for q, bv := range bp {
					row[q] += av * bv
				}
			}
		}
		for r := range mr {
			row := c[r*ldc : r*ldc+nr]
			for q := range row {
				if beta == 0 {
					row[q] = alpha * acc[r*nr+q]
				} else {
					row[q] = alpha*acc[r*nr+q] + beta*row[q]
				}
			}
		}
	}
}
