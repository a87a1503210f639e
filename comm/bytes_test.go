package comm

import (
	"encoding/binary"
	"math"
	"testing"
)

func TestF32BytesViews(t *testing.T) {
	f := []float32{1.5, -2, float32(math.Inf(1)), 3e-39}
	b := F32Bytes(f)
	if len(b) != 16 {
		t.Fatalf("len %d", len(b))
	}
	for i, v := range f {
		if got := binary.LittleEndian.Uint32(b[4*i:]); got != math.Float32bits(v) {
			t.Errorf("element %d: bytes %08x, want little-endian %08x", i, got, math.Float32bits(v))
		}
	}
	back, err := BytesF32(b)
	if err != nil {
		t.Fatal(err)
	}
	back[1] = 7 // a view, not a copy
	if f[1] != 7 {
		t.Error("BytesF32 copied")
	}
	if F32Bytes(nil) != nil {
		t.Error("F32Bytes(nil) not nil")
	}
	if _, err := BytesF32(make([]byte, 6)); err == nil {
		t.Error("length 6 accepted")
	}
	if _, err := BytesF32(b[1:13]); err == nil {
		t.Error("misaligned view accepted")
	}
}
