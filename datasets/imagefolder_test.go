package datasets

import (
	"context"
	"errors"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// writeImage saves a solid-colour w×h image (JPEG quality 100 or PNG by
// extension) at path, creating its directory.
func writeImage(t *testing.T, path string, w, h int, c color.NRGBA) {
	t.Helper()
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.SetNRGBA(x, y, c)
		}
	}
	writeImageOf(t, path, img)
}

func writeImageOf(t *testing.T, path string, img image.Image) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	switch strings.ToLower(filepath.Ext(path)) {
	case ".png":
		err = png.Encode(f, img)
	default:
		err = jpeg.Encode(f, img, &jpeg.Options{Quality: 100})
	}
	if err != nil {
		t.Fatal(err)
	}
}

// classColours are the solid colours of the fixture's classes.
var classColours = map[string]color.NRGBA{
	"ant":   {R: 200, G: 30, B: 90, A: 255},
	"bee":   {R: 10, G: 220, B: 128, A: 255},
	"Zebra": {R: 64, G: 64, B: 250, A: 255},
}

// imageFolderFixture writes root/<class>/… with PNGs of the class colour
// and a few distractors; it returns root.
func imageFolderFixture(t *testing.T) string {
	root := t.TempDir()
	writeImage(t, filepath.Join(root, "bee", "b2.png"), 40, 30, classColours["bee"])
	writeImage(t, filepath.Join(root, "bee", "b1.PNG"), 30, 50, classColours["bee"])
	writeImage(t, filepath.Join(root, "ant", "sub", "a3.png"), 25, 25, classColours["ant"])
	writeImage(t, filepath.Join(root, "ant", "a1.png"), 60, 20, classColours["ant"])
	writeImage(t, filepath.Join(root, "Zebra", "z.png"), 33, 47, classColours["Zebra"])
	os.WriteFile(filepath.Join(root, "ant", "notes.txt"), []byte("not an image"), 0o644)
	os.WriteFile(filepath.Join(root, "README"), []byte("top-level file"), 0o644)
	return root
}

func TestNewImageFolder(t *testing.T) {
	root := imageFolderFixture(t)
	f, err := NewImageFolder(root)
	if err != nil {
		t.Fatal(err)
	}
	// Byte order, as Python's sorted(): upper case first.
	if want := []string{"Zebra", "ant", "bee"}; !slices.Equal(f.Classes, want) {
		t.Fatalf("classes %q, want %q", f.Classes, want)
	}
	var got []string
	for _, s := range f.Samples {
		rel, _ := filepath.Rel(root, s.Path)
		got = append(got, filepath.ToSlash(rel)+":"+f.Classes[s.Label])
	}
	want := []string{"Zebra/z.png:Zebra", "ant/a1.png:ant", "ant/sub/a3.png:ant", "bee/b1.PNG:bee", "bee/b2.png:bee"}
	if !slices.Equal(got, want) {
		t.Fatalf("samples %q, want %q", got, want)
	}

	os.MkdirAll(filepath.Join(root, "empty"), 0o755)
	if _, err := NewImageFolder(root); err == nil || !strings.Contains(err.Error(), filepath.Join(root, "empty")) {
		t.Errorf("empty class: error = %v", err)
	}
	if _, err := NewImageFolder(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no class directories") {
		t.Errorf("no classes: error = %v", err)
	}
	if _, err := NewImageFolder(filepath.Join(root, "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing root: error = %v", err)
	}
}

func TestBilinearResizeValues(t *testing.T) {
	// Upscaling 2 → 4 is half-pixel bilinear: [0, 1] → [0, .25, .75, 1].
	src := &RGB{H: 1, W: 2, Pix: []float32{0, 1, 0, 1, 0, 1}}
	out := resizeCrop(src, Crop{Height: 1, Width: 2}, 1, 4)
	if want := []float32{0, 0.25, 0.75, 1}; !closeSlices(out.Pix[:4], want, 1e-6) {
		t.Errorf("upscale = %v, want %v", out.Pix[:4], want)
	}
	// Downscaling 4 → 2 widens the triangle to support 2 (PIL's
	// antialiasing): output 0 has centre 1, taps x=0,1,2 with weights
	// .75, .75, .25 (normalised by 1.75): (0·.75 + 1·.75 + 2·.25)/1.75.
	src = &RGB{H: 1, W: 4, Pix: slices.Repeat([]float32{0, 1, 2, 3}, 3)}
	out = resizeCrop(src, Crop{Height: 1, Width: 4}, 1, 2)
	if want := []float32{1.25 / 1.75, 3 - 1.25/1.75}; !closeSlices(out.Pix[:2], want, 1e-6) {
		t.Errorf("downscale = %v, want %v", out.Pix[:2], want)
	}
	// A crop window: columns 1..2 of [0 1 2 3] resized to 2 is [1 2].
	out = resizeCrop(src, Crop{Left: 1, Height: 1, Width: 2}, 1, 2)
	if want := []float32{1, 2}; !closeSlices(out.Pix[:2], want, 1e-6) {
		t.Errorf("crop = %v, want %v", out.Pix[:2], want)
	}
}

func closeSlices(a, b []float32, tol float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(float64(a[i]-b[i])) > tol {
			return false
		}
	}
	return true
}

func TestRandomResizedCropParams(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	scale, ratio := [2]float64{0.08, 1}, [2]float64{3.0 / 4, 4.0 / 3}
	for range 2000 {
		h, w := 20+rng.IntN(200), 20+rng.IntN(200)
		c := RandomResizedCropParams(rng, h, w, scale, ratio)
		if c.Top < 0 || c.Left < 0 || c.Height < 1 || c.Width < 1 || c.Top+c.Height > h || c.Left+c.Width > w {
			t.Fatalf("%d×%d: crop %+v outside the image", h, w, c)
		}
		// Rounding of each side may move the area and ratio by about one pixel.
		area := float64(c.Height*c.Width) / float64(h*w)
		r := float64(c.Width) / float64(c.Height)
		if area > 1 || r < ratio[0]*(1-2.0/float64(c.Height)) || r > ratio[1]*(1+2.0/float64(c.Width)) {
			if !(c.Height == h || c.Width == w) { // not the fallback
				t.Fatalf("%d×%d: crop %+v: area %.3f ratio %.3f", h, w, c, area, r)
			}
		}
	}
	// A 1×100 strip can never fit a window of ratio ≤ 4/3: the fallback is
	// the central crop with the ratio clamped: 1×round(4/3) = 1×1 at (0, 49).
	if c := RandomResizedCropParams(rng, 1, 100, scale, ratio); c != (Crop{Top: 0, Left: 49, Height: 1, Width: 1}) {
		t.Errorf("fallback crop %+v", c)
	}
	// 100×10 (tall): width kept, height = round(10/(3/4)) = 13, centred.
	if c := RandomResizedCropParams(rng, 100, 10, [2]float64{0.99, 1}, ratio); c != (Crop{Top: 43, Left: 0, Height: 13, Width: 10}) {
		t.Errorf("tall fallback crop %+v", c)
	}
	if h, w := ResizeShorter(300, 500, 256); h != 256 || w != 426 {
		t.Errorf("ResizeShorter(300, 500) = %d×%d, want 256×426", h, w)
	}
	if c := CenterCropWindow(256, 427, 224, 224); c != (Crop{Top: 16, Left: 102, Height: 224, Width: 224}) {
		t.Errorf("CenterCropWindow = %+v", c) // (427-224)/2 = 101.5 rounds to even 102
	}
}

// A solid-colour image must come out of every transform as that colour,
// normalised: crop, resize and flip only move pixels of one value.
func TestImageTransformSolidColour(t *testing.T) {
	dir := t.TempDir()
	c := color.NRGBA{R: 200, G: 30, B: 90, A: 255}
	pngPath := filepath.Join(dir, "solid.png")
	jpgPath := filepath.Join(dir, "solid.jpg")
	writeImage(t, pngPath, 70, 45, c)
	writeImage(t, jpgPath, 70, 45, c)
	for _, tc := range []struct {
		path string
		tol  float64 // in normalised units
	}{
		{pngPath, 1e-5},
		{jpgPath, 3.0 / 255 / 0.224}, // JPEG's colour conversion rounds
	} {
		img, err := DecodeImageFile(tc.path)
		if err != nil {
			t.Fatal(err)
		}
		for _, tr := range []ImageTransform{
			{Train: true, Size: 24},
			{Train: true, Size: 96}, // upscaling
			{Size: 32, ResizeSize: 40},
			{Size: 64, ResizeSize: 50}, // crop larger than the image: black border
		} {
			tr, err := tr.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			n := tr.Size
			dst := make([]float32, 3*n*n)
			if err := tr.Apply(dst, img, rand.New(rand.NewPCG(3, 4))); err != nil {
				t.Fatal(err)
			}
			rh, rw := ResizeShorter(img.H, img.W, tr.ResizeSize)
			win := CenterCropWindow(rh, rw, n, n)
			for ch, v := range []uint8{c.R, c.G, c.B} {
				want := (float32(v)/255 - ImageNetMean[ch]) / ImageNetStd[ch]
				black := -ImageNetMean[ch] / ImageNetStd[ch]
				for y := range n {
					for x := range n {
						w := want
						if !tr.Train && (win.Top+y < 0 || win.Top+y >= rh || win.Left+x < 0 || win.Left+x >= rw) {
							w = black
						}
						if got := dst[ch*n*n+y*n+x]; math.Abs(float64(got-w)) > tc.tol {
							t.Fatalf("%s %+v: channel %d pixel (%d,%d) = %v, want %v", filepath.Base(tc.path), tr, ch, y, x, got, w)
						}
					}
				}
			}
		}
	}
}

func TestImageTransformFlipAndGrey(t *testing.T) {
	// A left-black, right-white image: with Scale (1,1) and Ratio of the
	// image, the crop is the whole image, so a flipped output starts white.
	img := image.NewGray(image.Rect(0, 0, 8, 8))
	for y := range 8 {
		for x := 4; x < 8; x++ {
			img.SetGray(x, y, color.Gray{Y: 255})
		}
	}
	path := filepath.Join(t.TempDir(), "half.png")
	writeImageOf(t, path, img)
	rgb, err := DecodeImageFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tr, _ := ImageTransform{Train: true, Size: 8, Scale: [2]float64{1, 1}, Ratio: [2]float64{1, 1}, Mean: [3]float32{0, 0, 0}, Std: [3]float32{1, 1, 1}}.withDefaults()
	flips := 0
	for seed := range uint64(200) {
		dst := make([]float32, 3*64)
		if err := tr.Apply(dst, rgb, rand.New(rand.NewPCG(seed, 0))); err != nil {
			t.Fatal(err)
		}
		for ch := range 3 { // grey is replicated to three channels
			if dst[ch*64] != dst[0] || dst[ch*64+7] != dst[7] {
				t.Fatal("grey channels differ")
			}
		}
		switch {
		case dst[0] == 1 && dst[7] == 0:
			flips++
		case dst[0] == 0 && dst[7] == 1:
		default:
			t.Fatalf("corners %v %v: not the image or its mirror", dst[0], dst[7])
		}
	}
	if flips < 70 || flips > 130 { // p = 1/2 over 200 draws: ±4.2σ
		t.Errorf("%d flips of 200", flips)
	}
}

func TestImageTransformApplyErrors(t *testing.T) {
	img := &RGB{H: 2, W: 2, Pix: make([]float32, 12)}
	if err := (ImageTransform{Size: 4}).Apply(make([]float32, 47), img, nil); err == nil || !strings.Contains(err.Error(), "47 floats") {
		t.Errorf("short dst: %v", err)
	}
	if err := (ImageTransform{Size: 4, Ratio: [2]float64{2, 1}}).Apply(make([]float32, 48), img, nil); err == nil || !strings.Contains(err.Error(), "Ratio") {
		t.Errorf("bad ratio: %v", err)
	}
	if err := (ImageTransform{Size: 4}).Apply(make([]float32, 48), &RGB{H: 2, W: 2}, nil); err == nil {
		t.Error("malformed image accepted")
	}
	// Defaults fill zero fields: a 2×2 image evaluated at Size 4, ResizeSize 4.
	if err := (ImageTransform{Size: 4, ResizeSize: 4}).Apply(make([]float32, 48), img, nil); err != nil {
		t.Errorf("valid call: %v", err)
	}
}

func collectImages(t *testing.T, l *ImageFolderLoader, epoch int) ([]float32, []int) {
	t.Helper()
	var xs []float32
	var ys []int
	for b, err := range l.Epoch(context.Background(), epoch) {
		if err != nil {
			t.Fatal(err)
		}
		n := l.Options().Transform.Size
		if len(b.X) != b.N*3*n*n || len(b.Y) != b.N {
			t.Fatalf("batch shapes X %d Y %d N %d", len(b.X), len(b.Y), b.N)
		}
		xs = append(xs, b.X...)
		ys = append(ys, b.Y...)
	}
	return xs, ys
}

func TestImageFolderLoader(t *testing.T) {
	root := imageFolderFixture(t)
	f, err := NewImageFolder(root)
	if err != nil {
		t.Fatal(err)
	}
	opt := ImageFolderLoaderOptions{Batch: 2, World: 2, Seed: 5, Shuffle: true, Workers: 1,
		Transform: ImageTransform{Train: true, Size: 12}}
	l1, err := NewImageFolderLoader(f, opt)
	if err != nil {
		t.Fatal(err)
	}
	opt.Workers = 3
	l3, _ := NewImageFolderLoader(f, opt)
	x1, y1 := collectImages(t, l1, 0)
	x3, y3 := collectImages(t, l3, 0)
	if !slices.Equal(x1, x3) || !slices.Equal(y1, y3) {
		t.Fatal("batches depend on the number of workers")
	}
	if len(y1) != 3 { // ceil(5/2)
		t.Fatalf("%d images on rank 0, want 3", len(y1))
	}
	// Each image is its class colour, normalised.
	n := 12
	for k, y := range y1 {
		c := classColours[f.Classes[y]]
		want := (float32(c.R)/255 - ImageNetMean[0]) / ImageNetStd[0]
		if got := x1[k*3*n*n]; math.Abs(float64(got-want)) > 1e-5 {
			t.Errorf("image %d (class %s): red %v, want %v", k, f.Classes[y], got, want)
		}
	}
	// Ranks 0 and 1 together see every image (6 slots: 5 images, one
	// repeated to pad).
	opt.Rank = 1
	l := must(NewImageFolderLoader(f, opt))
	_, yr1 := collectImages(t, l, 0)
	count := map[int]int{}
	for _, y := range append(slices.Clone(y1), yr1...) {
		count[y]++
	}
	if len(y1)+len(yr1) != 6 || count[0] < 1 || count[1] < 2 || count[2] < 2 {
		t.Errorf("labels over both ranks %v %v do not cover the 5 images", y1, yr1)
	}

	// Evaluation transform, unshuffled: labels in folder order.
	ev := must(NewImageFolderLoader(f, ImageFolderLoaderOptions{Batch: 5, Transform: ImageTransform{Size: 8, ResizeSize: 10}}))
	_, ye := collectImages(t, ev, 0)
	if !slices.Equal(ye, []int{0, 1, 1, 2, 2}) {
		t.Errorf("evaluation labels %v", ye)
	}
}

// The random crop depends on (Seed, epoch, Rank) and nothing else.
func TestImageFolderLoaderSeeding(t *testing.T) {
	root := t.TempDir()
	img := image.NewNRGBA(image.Rect(0, 0, 40, 30))
	for y := range 30 {
		for x := range 40 {
			img.SetNRGBA(x, y, color.NRGBA{R: uint8(6 * x), G: uint8(8 * y), B: uint8(3 * (x + y)), A: 255})
		}
	}
	writeImageOf(t, filepath.Join(root, "only", "g.png"), img)
	f := must(NewImageFolder(root))
	run := func(seed uint64, rank, epoch int) []float32 {
		l := must(NewImageFolderLoader(f, ImageFolderLoaderOptions{Batch: 1, Rank: rank, World: 2, Seed: seed,
			Transform: ImageTransform{Train: true, Size: 10}}))
		x, _ := collectImages(t, l, epoch)
		return x
	}
	base := run(1, 0, 0)
	if !slices.Equal(base, run(1, 0, 0)) {
		t.Fatal("same (seed, rank, epoch), different crops")
	}
	for _, other := range [][]float32{run(2, 0, 0), run(1, 1, 0), run(1, 0, 1)} {
		if slices.Equal(base, other) {
			t.Error("changing seed, rank or epoch left the crop unchanged")
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestImageFolderLoaderErrors(t *testing.T) {
	root := imageFolderFixture(t)
	bad := filepath.Join(root, "bee", "b3.jpg")
	if err := os.WriteFile(bad, []byte("\xff\xd8\xff\xe0 this is not a JPEG"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := NewImageFolder(root)
	if err != nil {
		t.Fatal(err)
	}
	l := must(NewImageFolderLoader(f, ImageFolderLoaderOptions{Batch: 4, Workers: 2, Transform: ImageTransform{Size: 8, ResizeSize: 8}}))
	var gotErr error
	batches := 0
	for _, err := range l.Epoch(context.Background(), 0) {
		if err != nil {
			gotErr = err
			break
		}
		batches++
	}
	if gotErr == nil || !strings.Contains(gotErr.Error(), bad) {
		t.Errorf("corrupt file: error = %v, want it to name %s", gotErr, bad)
	}
	if batches != 1 { // the first batch (4 good images) comes before the error
		t.Errorf("%d batches before the error, want 1", batches)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, err := range l.Epoch(ctx, 0) {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled: %v", err)
		}
	}
	for _, o := range []ImageFolderLoaderOptions{
		{Batch: 0},
		{Batch: 1, Workers: -1},
		{Batch: 1, Transform: ImageTransform{Scale: [2]float64{0.5, 0.1}}},
		{Batch: 1, Transform: ImageTransform{Std: [3]float32{1, 0, 1}, Mean: [3]float32{0, 0, 1}}},
	} {
		if _, err := NewImageFolderLoader(f, o); err == nil {
			t.Errorf("options %+v accepted", o)
		}
	}
}
