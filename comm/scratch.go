package comm

import (
	"math/bits"
	"sync"
	"unsafe"
)

// sizedPool recycles byte buffers by power-of-two capacity class. Unlike a
// sync.Pool it survives garbage collections, so the multi-megabyte buffers
// that gradient messages and collective scratch need are reused step after
// step instead of being allocated (and zeroed) again; at most perClass idle
// buffers are kept per class.
type sizedPool struct {
	mu      sync.Mutex
	classes [64][][]byte
}

const perClass = 32

// get returns a buffer of length n (contents unspecified).
func (p *sizedPool) get(n int) []byte {
	if n == 0 {
		return nil
	}
	c := bits.Len(uint(n - 1))
	p.mu.Lock()
	if l := p.classes[c]; len(l) > 0 {
		b := l[len(l)-1]
		p.classes[c] = l[:len(l)-1]
		p.mu.Unlock()
		return b[:n]
	}
	p.mu.Unlock()
	return make([]byte, n, 1<<c)
}

// put hands b back; buffers that did not come from get are ignored.
func (p *sizedPool) put(b []byte) {
	c := bits.Len(uint(cap(b) - 1))
	if cap(b) == 0 || cap(b) != 1<<c {
		return
	}
	p.mu.Lock()
	if len(p.classes[c]) < perClass {
		p.classes[c] = append(p.classes[c], b[:0])
	}
	p.mu.Unlock()
}

// scratchPool serves the collectives' temporary vectors.
var scratchPool sizedPool

// getScratch returns n float32s of scratch (contents unspecified); return it
// with putScratch when the collective is done with it.
func getScratch(n int) []float32 { return getScratchOf[float32](n) }

func putScratch(s []float32) { putScratchOf(s) }

// getScratchOf returns n elements of scratch (contents unspecified); return it
// with putScratchOf when the collective is done with it.
func getScratchOf[T Element](n int) []T {
	if n == 0 {
		return nil
	}
	size := elementSize[T]()
	b := scratchPool.get(size * n)
	// View the whole capacity (a power of two, so a multiple of the element
	// size; make aligns it) so that putScratchOf can hand the full buffer back.
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), cap(b)/size)[:n]
}

func putScratchOf[T Element](s []T) {
	if cap(s) == 0 {
		return
	}
	scratchPool.put(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), elementSize[T]()*cap(s)))
}
