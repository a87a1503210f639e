package comm

import (
	"fmt"
	"unsafe"
)

// F32Bytes returns the bytes of f without copying: 4 bytes per element in the host's byte order
// (little-endian on every platform spargo supports: amd64, arm64). Writing through the view
// changes f. It is how collectives and hooks put float32 data on the wire.
func F32Bytes(f []float32) []byte { return bytesOf(f) }

// bytesOf is F32Bytes for any element type: the unsafe.Sizeof(T) host-order bytes of each
// element, without copying (nil for an empty s).
func bytesOf[T Element](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*elementSize[T]())
}

// elementSize is the number of bytes of one T.
func elementSize[T Element]() int {
	var x T
	return int(unsafe.Sizeof(x))
}

// BytesF32 is the inverse view of F32Bytes: b read as host-order (little-endian) float32 without
// copying. It refuses a length that is not a multiple of 4 or a start that is not 4-byte aligned
// (buffers from F32Bytes, or from make with a multiple of 4 bytes, are aligned).
func BytesF32(b []byte) ([]float32, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("comm: BytesF32: length %d bytes is not a multiple of 4", len(b))
	}
	p := unsafe.Pointer(&b[0])
	if uintptr(p)%unsafe.Alignof(float32(0)) != 0 {
		return nil, fmt.Errorf("comm: BytesF32: buffer at %p is not 4-byte aligned", p)
	}
	return unsafe.Slice((*float32)(p), len(b)/4), nil
}
