package kernels

import (
	"fmt"
	"runtime"
)

// PackedB is op(B) of an Sgemm packed once into the micro-kernel's panel layout, for a
// run of products that share B and differ in A: an LSTM's recurrent weight multiplies
// the hidden state of every time step, and packing it again at each step cost as much as
// a third of those small products. SgemmPackedB with it computes bit for bit what Sgemm
// computes from the unpacked B (the same panels, blocking and micro-kernel).
//
// The packed copy lives in a pooled buffer: Release returns it, after which the value
// must not be used. PackedB holds no reference to B; changing B afterwards does not
// change the packed copy. The zero value is empty (k = n = 0).
type PackedB struct {
	p    *gemmImpl // the implementation that packed it (its NR, KC and kernel)
	k, n int
	nPad int
	buf  *[]float32
}

// PackB packs op(B), k×n: if transB, B is stored n×k (ldb >= k), else k×n (ldb >= n),
// as Sgemm's B. It packs in parallel over GOMAXPROCS for large B.
func PackB(transB bool, k, n int, b []float32, ldb int) PackedB {
	if k < 0 || n < 0 {
		panic(fmt.Sprintf("kernels.PackB: negative dimension k=%d n=%d", k, n))
	}
	bRows, bCols := k, n
	if transB {
		bRows, bCols = n, k
	}
	checkMatrix("B", b, bRows, bCols, ldb)
	pb := PackedB{p: impl, k: k, n: n}
	if k == 0 || n == 0 {
		return pb
	}
	j := jobPool.Get().(*gemmJob)
	*j = gemmJob{p: impl, transB: transB, n: n, k: k, b: b, ldb: ldb}
	nw := 1
	if k*n >= 1<<16 {
		nw = runtime.GOMAXPROCS(0)
	}
	pb.buf = j.prepackB(nw)
	pb.nPad = j.nPad
	*j = gemmJob{}
	jobPool.Put(j)
	return pb
}

// K returns the number of rows of the packed op(B).
func (pb *PackedB) K() int { return pb.k }

// N returns the number of columns of the packed op(B).
func (pb *PackedB) N() int { return pb.n }

// Release returns the packed copy's buffer to the pool and empties pb.
func (pb *PackedB) Release() {
	if pb.buf != nil {
		putShared(pb.buf)
	}
	*pb = PackedB{}
}

// SgemmPackedB computes C = alpha*op(A)*B + beta*C as Sgemm does, with op(B) (k×n) the
// one PackB packed; op(A) is m×k (transA and lda as Sgemm's), C m×n.
func SgemmPackedB(transA bool, m int, alpha float32, a []float32, lda int, pb *PackedB, beta float32, c []float32, ldc int) {
	if m < 0 {
		panic(fmt.Sprintf("kernels.SgemmPackedB: negative dimension m=%d", m))
	}
	n, k := pb.n, pb.k
	aRows, aCols := m, k
	if transA {
		aRows, aCols = k, m
	}
	checkMatrix("A", a, aRows, aCols, lda)
	checkMatrix("C", c, m, n, ldc)
	if trivialGemm(m, n, k, alpha, beta, c, ldc) {
		return
	}
	if pb.buf == nil {
		panic("kernels.SgemmPackedB: the PackedB was released")
	}
	j := jobPool.Get().(*gemmJob)
	*j = gemmJob{
		p: pb.p, transA: transA, m: m, n: n, k: k, alpha: alpha, beta: beta, a: a, c: c, lda: lda, ldc: ldc,
		sharedB: *pb.buf, nPad: pb.nPad,
	}
	j.execute()
}
