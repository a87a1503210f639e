package datasets

import (
	"context"
	"errors"
	"fmt"
	"image"
	"image/color"
	_ "image/jpeg" // registers the JPEG decoder with image.Decode
	_ "image/png"  // registers the PNG decoder with image.Decode
	"io/fs"
	"iter"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// ImageNet normalisation constants (R, G, B), as in torchvision's reference
// scripts.
var (
	ImageNetMean = [3]float32{0.485, 0.456, 0.406}
	ImageNetStd  = [3]float32{0.229, 0.224, 0.225}
)

// ImageSample is one image file of an ImageFolder and its class index.
type ImageSample struct {
	Path  string
	Label int
}

// ImageFolder is the file list of a directory laid out as torchvision's
// datasets.ImageFolder expects: root/<class>/…/<image>. Classes are the
// sub-directories of root sorted by name (byte order, which for UTF-8 is
// Python's code-point order); class i has label i. Samples are the files
// with a .jpg, .jpeg or .png extension (any case) found by walking each
// class directory recursively in lexical order, like torchvision's
// make_dataset.
type ImageFolder struct {
	Root    string
	Classes []string
	Samples []ImageSample
}

// imageExtensions are the file types ImageFolder decodes.
var imageExtensions = []string{".jpg", ".jpeg", ".png"}

// NewImageFolder lists root. It is an error if root has no class
// directory or if a class directory holds no image (torchvision raises the
// same), naming the directory.
func NewImageFolder(root string) (*ImageFolder, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("datasets: ImageFolder: %w", err)
	}
	f := &ImageFolder{Root: root}
	for _, e := range entries {
		if e.IsDir() {
			f.Classes = append(f.Classes, e.Name())
		}
	}
	if len(f.Classes) == 0 {
		return nil, fmt.Errorf("datasets: ImageFolder: %s has no class directories", root)
	}
	slices.Sort(f.Classes)
	for label, class := range f.Classes {
		dir := filepath.Join(root, class)
		before := len(f.Samples)
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				return nil
			}
			ext := strings.ToLower(filepath.Ext(path))
			if slices.Contains(imageExtensions, ext) {
				f.Samples = append(f.Samples, ImageSample{Path: path, Label: label})
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("datasets: ImageFolder: %w", err)
		}
		if len(f.Samples) == before {
			return nil, fmt.Errorf("datasets: ImageFolder: class directory %s has no .jpg, .jpeg or .png file", dir)
		}
	}
	return f, nil
}

// RGB is a decoded image as three float32 planes of values in [0, 1]
// (R, then G, then B), each H×W row-major.
type RGB struct {
	H, W int
	Pix  []float32 // 3*H*W
}

// DecodeImageFile decodes a JPEG or PNG file into RGB. Grey images are
// replicated to three channels and alpha is dropped (PIL's convert("RGB")).
// Errors name the file.
func DecodeImageFile(path string) (*RGB, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("datasets: %w", err)
	}
	defer f.Close()
	img, _, err := image.Decode(f)
	if err != nil {
		return nil, fmt.Errorf("datasets: decode %s: %w", path, err)
	}
	b := img.Bounds()
	if b.Dx() <= 0 || b.Dy() <= 0 {
		return nil, fmt.Errorf("datasets: decode %s: empty image", path)
	}
	return toRGB(img), nil
}

func toRGB(img image.Image) *RGB {
	b := img.Bounds()
	h, w := b.Dy(), b.Dx()
	out := &RGB{H: h, W: w, Pix: make([]float32, 3*h*w)}
	plane := h * w
	r, g, bl := out.Pix[:plane], out.Pix[plane:2*plane], out.Pix[2*plane:]
	const inv = 1.0 / 255
	set := func(i int, cr, cg, cb uint8) {
		r[i], g[i], bl[i] = float32(cr)*inv, float32(cg)*inv, float32(cb)*inv
	}
	switch m := img.(type) {
	case *image.YCbCr:
		for y := range h {
			for x := range w {
				yi := m.YOffset(b.Min.X+x, b.Min.Y+y)
				ci := m.COffset(b.Min.X+x, b.Min.Y+y)
				cr, cg, cb := color.YCbCrToRGB(m.Y[yi], m.Cb[ci], m.Cr[ci])
				set(y*w+x, cr, cg, cb)
			}
		}
	case *image.Gray:
		for y := range h {
			for x := range w {
				v := m.Pix[m.PixOffset(b.Min.X+x, b.Min.Y+y)]
				set(y*w+x, v, v, v)
			}
		}
	case *image.NRGBA:
		for y := range h {
			for x := range w {
				p := m.Pix[m.PixOffset(b.Min.X+x, b.Min.Y+y):]
				set(y*w+x, p[0], p[1], p[2])
			}
		}
	default:
		for y := range h {
			for x := range w {
				c := color.NRGBAModel.Convert(img.At(b.Min.X+x, b.Min.Y+y)).(color.NRGBA)
				set(y*w+x, c.R, c.G, c.B)
			}
		}
	}
	return out
}

// Crop is a window of an image: Top, Left, Height, Width in pixels. It may
// reach outside the image (a center crop larger than the image); pixels
// there are black, as torchvision's CenterCrop pads.
type Crop struct{ Top, Left, Height, Width int }

// RandomResizedCropParams is torchvision's RandomResizedCrop.get_params:
// up to 10 attempts to draw an area fraction in scale and a log-uniform
// aspect ratio in ratio whose window fits the h×w image; then the
// central crop with the aspect ratio clamped to ratio. Rounding is
// Python's round-half-to-even, as in torchvision.
func RandomResizedCropParams(rng *rand.Rand, h, w int, scale, ratio [2]float64) Crop {
	area := float64(h * w)
	logLo, logHi := math.Log(ratio[0]), math.Log(ratio[1])
	for range 10 {
		target := area * (scale[0] + rng.Float64()*(scale[1]-scale[0]))
		aspect := math.Exp(logLo + rng.Float64()*(logHi-logLo))
		cw := int(math.RoundToEven(math.Sqrt(target * aspect)))
		ch := int(math.RoundToEven(math.Sqrt(target / aspect)))
		if cw > 0 && cw <= w && ch > 0 && ch <= h {
			top := rng.IntN(h - ch + 1)
			left := rng.IntN(w - cw + 1)
			return Crop{Top: top, Left: left, Height: ch, Width: cw}
		}
	}
	inRatio := float64(w) / float64(h)
	cw, ch := w, h
	if inRatio < min(ratio[0], ratio[1]) {
		ch = int(math.RoundToEven(float64(w) / min(ratio[0], ratio[1])))
	} else if inRatio > max(ratio[0], ratio[1]) {
		cw = int(math.RoundToEven(float64(h) * max(ratio[0], ratio[1])))
	}
	return Crop{Top: (h - ch) / 2, Left: (w - cw) / 2, Height: ch, Width: cw}
}

// ResizeShorter is the size torchvision's Resize(size) gives an h×w image:
// the shorter side becomes size, the longer one keeps the aspect ratio
// (truncated, as torchvision's int()).
func ResizeShorter(h, w, size int) (nh, nw int) {
	if h <= w {
		return size, int(float64(size) * float64(w) / float64(h))
	}
	return int(float64(size) * float64(h) / float64(w)), size
}

// CenterCropWindow is torchvision's CenterCrop placement of an oh×ow
// window in an h×w image (top = round((h-oh)/2), half to even).
func CenterCropWindow(h, w, oh, ow int) Crop {
	return Crop{
		Top:    int(math.RoundToEven(float64(h-oh) / 2)),
		Left:   int(math.RoundToEven(float64(w-ow) / 2)),
		Height: oh, Width: ow,
	}
}

// bilinearWeights are PIL's separable bilinear (triangle filter)
// coefficients for resampling in input pixels onto out pixels; when
// shrinking, the filter is widened by the scale factor, so downscaling is
// antialiased (PIL's Image.resize, torchvision's antialias=True). Taps that
// fall outside the input are dropped and the rest renormalised, as PIL
// does at the borders.
type bilinearWeights struct {
	start []int       // first input index of each output pixel
	w     [][]float32 // its weights, summing to 1
}

func newBilinearWeights(in, out int) bilinearWeights {
	scale := float64(in) / float64(out)
	filterScale := max(scale, 1)
	support := filterScale // the triangle's support is 1, widened when shrinking
	bw := bilinearWeights{start: make([]int, out), w: make([][]float32, out)}
	for o := range out {
		center := (float64(o) + 0.5) * scale
		lo := max(int(center-support+0.5), 0)
		hi := min(int(center+support+0.5), in)
		ws := make([]float32, 0, hi-lo)
		var sum float64
		for x := lo; x < hi; x++ {
			v := max(1-math.Abs((float64(x)-center+0.5)/filterScale), 0)
			ws = append(ws, float32(v))
			sum += v
		}
		for i := range ws {
			ws[i] = float32(float64(ws[i]) / sum)
		}
		bw.start[o], bw.w[o] = lo, ws
	}
	return bw
}

// resizeCrop crops the window c (inside src) and resamples it to an oh×ow
// image with antialiased bilinear filtering: torchvision's
// F.resized_crop (crop, then resize), also used for a plain resize with
// the whole image as window.
func resizeCrop(src *RGB, c Crop, oh, ow int) *RGB {
	wx := newBilinearWeights(c.Width, ow)
	wy := newBilinearWeights(c.Height, oh)
	out := &RGB{H: oh, W: ow, Pix: make([]float32, 3*oh*ow)}
	tmp := make([]float32, c.Height*ow) // the horizontal pass
	for ch := range 3 {
		s := src.Pix[ch*src.H*src.W : (ch+1)*src.H*src.W]
		for y := range c.Height {
			row := s[(c.Top+y)*src.W+c.Left : (c.Top+y)*src.W+c.Left+c.Width]
			for x := range ow {
				var acc float32
				for k, wt := range wx.w[x] {
					acc += wt * row[wx.start[x]+k]
				}
				tmp[y*ow+x] = acc
			}
		}
		d := out.Pix[ch*oh*ow : (ch+1)*oh*ow]
		for y := range oh {
			for x := range ow {
				var acc float32
				for k, wt := range wy.w[y] {
					acc += wt * tmp[(wy.start[y]+k)*ow+x]
				}
				d[y*ow+x] = acc
			}
		}
	}
	return out
}

// cropPadded copies the window c of src; pixels of the window outside src
// are black (torchvision's CenterCrop pads an image smaller than the crop).
func cropPadded(src *RGB, c Crop) *RGB {
	out := &RGB{H: c.Height, W: c.Width, Pix: make([]float32, 3*c.Height*c.Width)}
	for ch := range 3 {
		s := src.Pix[ch*src.H*src.W : (ch+1)*src.H*src.W]
		d := out.Pix[ch*c.Height*c.Width : (ch+1)*c.Height*c.Width]
		for y := range c.Height {
			sy := c.Top + y
			if sy < 0 || sy >= src.H {
				continue
			}
			for x := range c.Width {
				if sx := c.Left + x; sx >= 0 && sx < src.W {
					d[y*c.Width+x] = s[sy*src.W+sx]
				}
			}
		}
	}
	return out
}

// ImageTransform turns a decoded image into the network's input.
type ImageTransform struct {
	// Train selects RandomResizedCrop(Size, Scale, Ratio) + random
	// horizontal flip (p = 1/2); otherwise Resize(ResizeSize) (shorter
	// side) + CenterCrop(Size).
	Train bool
	// Size is the output side (default 224).
	Size int
	// ResizeSize is the shorter side before the evaluation center crop
	// (default 256).
	ResizeSize int
	// Scale and Ratio of RandomResizedCrop (defaults (0.08, 1) and
	// (3/4, 4/3)).
	Scale, Ratio [2]float64
	// Mean and Std normalise each channel after the crop (defaults
	// ImageNetMean, ImageNetStd).
	Mean, Std [3]float32
}

// withDefaults fills zero fields and validates the rest.
func (t ImageTransform) withDefaults() (ImageTransform, error) {
	if t.Size == 0 {
		t.Size = 224
	}
	if t.ResizeSize == 0 {
		t.ResizeSize = 256
	}
	if t.Scale == ([2]float64{}) {
		t.Scale = [2]float64{0.08, 1}
	}
	if t.Ratio == ([2]float64{}) {
		t.Ratio = [2]float64{3.0 / 4, 4.0 / 3}
	}
	if t.Mean == ([3]float32{}) && t.Std == ([3]float32{}) {
		t.Mean, t.Std = ImageNetMean, ImageNetStd
	}
	switch {
	case t.Size < 1:
		return t, fmt.Errorf("datasets: ImageTransform.Size = %d, must be >= 1", t.Size)
	case t.ResizeSize < 1:
		return t, fmt.Errorf("datasets: ImageTransform.ResizeSize = %d, must be >= 1", t.ResizeSize)
	case !(t.Scale[0] > 0 && t.Scale[0] <= t.Scale[1]):
		return t, fmt.Errorf("datasets: ImageTransform.Scale = %v, want 0 < lo <= hi", t.Scale)
	case !(t.Ratio[0] > 0 && t.Ratio[0] <= t.Ratio[1]):
		return t, fmt.Errorf("datasets: ImageTransform.Ratio = %v, want 0 < lo <= hi", t.Ratio)
	}
	for c := range 3 {
		if !(t.Std[c] > 0) {
			return t, fmt.Errorf("datasets: ImageTransform.Std[%d] = %v, must be > 0", c, t.Std[c])
		}
	}
	return t, nil
}

// Apply transforms img into dst (3×Size×Size, CHW, normalised), drawing
// the crop and flip from rng (unused for evaluation). The draw order is
// torchvision's: the crop's parameters, then the flip. Zero fields take
// their defaults; bad options or a dst of the wrong length are errors.
func (t ImageTransform) Apply(dst []float32, img *RGB, rng *rand.Rand) error {
	t, err := t.withDefaults()
	if err != nil {
		return err
	}
	if len(dst) != 3*t.Size*t.Size {
		return fmt.Errorf("datasets: ImageTransform.Apply: dst has %d floats, want 3×%d×%d", len(dst), t.Size, t.Size)
	}
	if img == nil || img.H < 1 || img.W < 1 || len(img.Pix) != 3*img.H*img.W {
		return errors.New("datasets: ImageTransform.Apply: empty or malformed image")
	}
	t.apply(dst, img, rng)
	return nil
}

// apply is Apply for a transform that went through withDefaults.
func (t ImageTransform) apply(dst []float32, img *RGB, rng *rand.Rand) {
	var out *RGB
	flip := false
	if t.Train {
		c := RandomResizedCropParams(rng, img.H, img.W, t.Scale, t.Ratio)
		out = resizeCrop(img, c, t.Size, t.Size)
		flip = rng.Float64() < 0.5
	} else {
		rh, rw := ResizeShorter(img.H, img.W, t.ResizeSize)
		resized := img
		if rh != img.H || rw != img.W {
			resized = resizeCrop(img, Crop{Height: img.H, Width: img.W}, rh, rw)
		}
		out = cropPadded(resized, CenterCropWindow(rh, rw, t.Size, t.Size))
	}
	n := t.Size
	for ch := range 3 {
		s := out.Pix[ch*n*n : (ch+1)*n*n]
		d := dst[ch*n*n : (ch+1)*n*n]
		mean, inv := t.Mean[ch], 1/t.Std[ch]
		for y := range n {
			for x := range n {
				sx := x
				if flip {
					sx = n - 1 - x
				}
				d[y*n+x] = (s[y*n+sx] - mean) * inv
			}
		}
	}
}

// ImageFolderLoaderOptions configure an ImageFolderLoader.
type ImageFolderLoaderOptions struct {
	Batch       int // images per batch (per rank), > 0
	Rank, World int // World 0 means 1
	Seed        uint64
	Shuffle     bool // reshuffle every epoch (training)
	DropLast    bool // drop this rank's short last batch
	// Workers decode and transform images in parallel; 0 means
	// runtime.GOMAXPROCS(0).
	Workers   int
	Transform ImageTransform
}

// ImageFolderLoader yields NCHW float32 batches of an ImageFolder for one
// rank. Workers decode the images of a batch in parallel while the caller
// trains on the previous batch. Every image's random crop and flip come
// from a generator seeded by (Seed, epoch, Rank, position in the rank's
// epoch), so the batches do not depend on Workers or on scheduling.
type ImageFolderLoader struct {
	folder  *ImageFolder
	opt     ImageFolderLoaderOptions
	sampler DistributedSampler
	running atomic.Bool
}

// NewImageFolderLoader checks opt and fills its defaults.
func NewImageFolderLoader(folder *ImageFolder, opt ImageFolderLoaderOptions) (*ImageFolderLoader, error) {
	if folder == nil || len(folder.Samples) == 0 {
		return nil, errors.New("datasets: NewImageFolderLoader: empty folder")
	}
	s, err := newSampler("ImageFolderLoaderOptions", len(folder.Samples), opt.Batch, opt.Rank, opt.World, opt.Seed, opt.Shuffle)
	if err != nil {
		return nil, err
	}
	opt.World = s.World
	if opt.Workers < 0 {
		return nil, fmt.Errorf("datasets: ImageFolderLoaderOptions.Workers = %d, must be >= 0", opt.Workers)
	}
	if opt.Workers == 0 {
		opt.Workers = runtime.GOMAXPROCS(0)
	}
	if opt.Transform, err = opt.Transform.withDefaults(); err != nil {
		return nil, err
	}
	return &ImageFolderLoader{folder: folder, opt: opt, sampler: s}, nil
}

// Options returns the options in effect, defaults filled in.
func (l *ImageFolderLoader) Options() ImageFolderLoaderOptions { return l.opt }

// NumBatches is how many batches Epoch yields; the same on every rank.
func (l *ImageFolderLoader) NumBatches() int {
	return numBatches(l.sampler.NumSamples(), l.opt.Batch, l.opt.DropLast)
}

// splitmix64 is the SplitMix64 finaliser: a bijection of uint64 that
// spreads neighbouring inputs over unrelated outputs.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// seedPCG seeds pcg for one sample: the state from (seed, epoch), the
// stream from (rank, pos), so distinct ranks and positions (each below
// 2^32) never share a stream within an epoch.
func seedPCG(pcg *rand.PCG, seed uint64, epoch, rank, pos int) {
	pcg.Seed(splitmix64(seed^splitmix64(uint64(int64(epoch)))), splitmix64(uint64(uint32(rank))<<32|uint64(uint32(pos))))
}

// imageBatch is a prepared batch or the error that stopped it.
type imageBatch struct {
	b   Batch
	err error
}

// Epoch returns this rank's batches of one epoch (Batch.X is N×3×Size×Size).
// A file that cannot be decoded stops the epoch with an error naming it.
// Cancelling ctx, or breaking out of the loop, stops the workers before
// Epoch returns. Each batch is freshly allocated and may be kept.
func (l *ImageFolderLoader) Epoch(ctx context.Context, epoch int) iter.Seq2[Batch, error] {
	return func(yield func(Batch, error) bool) {
		if !l.running.CompareAndSwap(false, true) {
			yield(Batch{}, errors.New("datasets: ImageFolderLoader.Epoch: another epoch of this loader is running"))
			return
		}
		defer l.running.Store(false)
		if err := ctx.Err(); err != nil {
			yield(Batch{}, err)
			return
		}
		ctx, cancel := context.WithCancel(ctx)
		idx := l.sampler.Indices(epoch)
		nb := l.NumBatches()
		ready := make(chan imageBatch, 1) // one batch ahead
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(ready)
			for b := range nb {
				lo := b * l.opt.Batch
				hi := min(lo+l.opt.Batch, len(idx))
				bt, err := l.prepare(ctx, epoch, lo, idx[lo:hi])
				select {
				case ready <- imageBatch{bt, err}:
				case <-ctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
		}()
		defer func() {
			cancel()
			wg.Wait()
		}()
		for range nb {
			var ib imageBatch
			var ok bool
			select {
			case ib, ok = <-ready:
			case <-ctx.Done():
			}
			if err := ctx.Err(); err != nil {
				yield(Batch{}, err)
				return
			}
			if !ok {
				return
			}
			if ib.err != nil {
				yield(Batch{}, ib.err)
				return
			}
			if !yield(ib.b, nil) {
				return
			}
		}
	}
}

// prepare decodes and transforms the images idx (at positions first… of
// the rank's epoch) with the loader's workers.
func (l *ImageFolderLoader) prepare(ctx context.Context, epoch, first int, idx []int) (Batch, error) {
	size := l.opt.Transform.Size
	img := 3 * size * size
	bt := Batch{X: make([]float32, len(idx)*img), Y: make([]int, len(idx)), N: len(idx)}
	var next atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	for range min(l.opt.Workers, len(idx)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var pcg rand.PCG
			rng := rand.New(&pcg)
			for {
				k := int(next.Add(1) - 1)
				if k >= len(idx) || ctx.Err() != nil {
					return
				}
				s := l.folder.Samples[idx[k]]
				im, err := DecodeImageFile(s.Path)
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				seedPCG(&pcg, l.opt.Seed, epoch, l.opt.Rank, first+k)
				l.opt.Transform.apply(bt.X[k*img:(k+1)*img], im, rng)
				bt.Y[k] = s.Label
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return Batch{}, firstErr
	}
	if err := ctx.Err(); err != nil {
		return Batch{}, err
	}
	return bt, nil
}
