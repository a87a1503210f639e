package datasets

import (
	"math"
	"slices"
	"testing"
)

// testImage is a 3×h×w image whose bytes are all different enough to
// catch misplaced pixels.
func testImage(h, w int) []uint8 {
	img := make([]uint8, 3*h*w)
	for i := range img {
		img[i] = uint8(i*37 + i/7)
	}
	return img
}

func TestNormalizeValues(t *testing.T) {
	n, err := NewNormalizer(CIFAR10Mean, CIFAR10Std)
	if err != nil {
		t.Fatal(err)
	}
	// (v/255 - mean)/std, computed by hand.
	for _, c := range []struct {
		channel int
		v       uint8
		want    float64
	}{
		{0, 0, -0.4914 / 0.2470},
		{0, 255, (1 - 0.4914) / 0.2470},
		{1, 128, (128.0/255 - 0.4822) / 0.2435},
		{2, 59, (59.0/255 - 0.4465) / 0.2616},
	} {
		if got := n.Value(c.channel, c.v); math.Abs(float64(got)-c.want) > 1e-5 {
			t.Errorf("channel %d value %d: %v, want %v", c.channel, c.v, got, c.want)
		}
	}
	img := testImage(4, 5)
	out := make([]float32, len(img))
	n.Normalize(out, img, 4, 5)
	for i, v := range img {
		if want := n.Value(i/20, v); out[i] != want {
			t.Fatalf("pixel %d: %v, want %v", i, out[i], want)
		}
	}
	if _, err := NewNormalizer(CIFAR10Mean, [3]float32{1, 0, 1}); err == nil {
		t.Error("zero std accepted")
	}
}

func TestCropFlip(t *testing.T) {
	const h, w = 32, 32
	n, _ := NewNormalizer(CIFAR10Mean, CIFAR10Std)
	img := testImage(h, w)
	plain := make([]float32, len(img))
	n.Normalize(plain, img, h, w)
	at := func(x []float32, c, y, xx int) float32 { return x[c*h*w+y*w+xx] }

	out := make([]float32, len(img))
	n.CropFlip(out, img, h, w, CropPad, CropPad, false)
	if !slices.Equal(out, plain) {
		t.Error("crop at offset 4,4 without flip is not the identity")
	}

	n.CropFlip(out, img, h, w, CropPad, CropPad, true)
	for c := range 3 {
		for y := range h {
			for x := range w {
				if at(out, c, y, x) != at(plain, c, y, w-1-x) {
					t.Fatalf("flip: (%d,%d,%d) is not the mirror", c, y, x)
				}
			}
		}
	}

	// Window at top=0,left=8: rows shift down by 4 (zeros on top), columns
	// shift left by 4 (zeros on the right). Padding is 0 after normalising.
	n.CropFlip(out, img, h, w, 0, 2*CropPad, false)
	for c := range 3 {
		for y := range h {
			for x := range w {
				sy, sx := y-4, x+4
				want := float32(0)
				if sy >= 0 && sx < w {
					want = at(plain, c, sy, sx)
				}
				if got := at(out, c, y, x); got != want {
					t.Fatalf("crop 0,8: (%d,%d,%d) = %v, want %v", c, y, x, got, want)
				}
			}
		}
	}

	// Crop then flip: flipped window at top=8,left=1.
	n.CropFlip(out, img, h, w, 2*CropPad, 1, true)
	for c := range 3 {
		for y := range h {
			for x := range w {
				cx := w - 1 - x // column in the unflipped crop
				sy, sx := y+4, cx-3
				want := float32(0)
				if sy < h && sx >= 0 {
					want = at(plain, c, sy, sx)
				}
				if got := at(out, c, y, x); got != want {
					t.Fatalf("crop 8,1 flipped: (%d,%d,%d) = %v, want %v", c, y, x, got, want)
				}
			}
		}
	}
}
