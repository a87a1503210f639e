package datasets

import "fmt"

// CropPad is the zero padding on each side for the random crop: the crop
// window's top-left corner ranges over 0..2*CropPad in padded coordinates,
// and CropPad,CropPad is the uncropped image (the usual CIFAR recipe:
// RandomCrop(32, padding=4)).
const CropPad = 4

// Normalizer turns uint8 CHW images with 3 channels into float32
// (x/255 - mean[c]) / std[c], optionally cropped and flipped. It precomputes
// the 256 values of each channel, so a pixel costs one table lookup.
//
// Order of operations, as in the project's PyTorch yardstick: normalise,
// then zero-pad by CropPad and crop, then flip. The padding is 0 in
// normalised space (the channel mean), not black.
type Normalizer struct {
	table [3][256]float32
}

// NewNormalizer builds the lookup table; every std must be positive.
func NewNormalizer(mean, std [3]float32) (*Normalizer, error) {
	n := new(Normalizer)
	for c := range 3 {
		if !(std[c] > 0) {
			return nil, fmt.Errorf("datasets: normalisation std[%d] = %v, must be > 0", c, std[c])
		}
		for v := range 256 {
			n.table[c][v] = (float32(v)/255 - mean[c]) / std[c]
		}
	}
	return n, nil
}

// Value is the normalised value of pixel byte v in channel c.
func (n *Normalizer) Value(c int, v uint8) float32 { return n.table[c][v] }

// Normalize writes the normalised image src (3×h×w bytes) to dst (3×h×w).
func (n *Normalizer) Normalize(dst []float32, src []uint8, h, w int) {
	plane := h * w
	for c := range 3 {
		t := &n.table[c]
		s, d := src[c*plane:(c+1)*plane], dst[c*plane:(c+1)*plane]
		for i, v := range s {
			d[i] = t[v]
		}
	}
}

// CropFlip writes to dst the h×w window at (top, left) of the normalised
// image src zero-padded by CropPad on every side, mirrored left-right when
// flip is set. top and left range over 0..2*CropPad; CropFlip(dst, src, h,
// w, CropPad, CropPad, false) equals Normalize.
func (n *Normalizer) CropFlip(dst []float32, src []uint8, h, w, top, left int, flip bool) {
	plane := h * w
	dy, dx := top-CropPad, left-CropPad // source offset of the window
	for c := range 3 {
		t := &n.table[c]
		s, d := src[c*plane:(c+1)*plane], dst[c*plane:(c+1)*plane]
		for y := range h {
			row := d[y*w : (y+1)*w]
			sy := y + dy
			if sy < 0 || sy >= h {
				clear(row)
				continue
			}
			srow := s[sy*w : (sy+1)*w]
			// Output columns x whose source column x+dx is inside the image.
			x0, x1 := max(0, -dx), min(w, w-dx)
			for x := range w {
				out := x
				if flip {
					out = w - 1 - x
				}
				if x < x0 || x >= x1 {
					row[out] = 0
				} else {
					row[out] = t[srow[x+dx]]
				}
			}
		}
	}
}
