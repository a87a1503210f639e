package plot

import (
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeVGGRun writes a metrics file as examples/vgg does: one line per epoch, then a
// summary repeating the epochs with the config.
func writeVGGRun(t testing.TB, dir, name, hook string, epochs int, lossScale float64) string {
	t.Helper()
	path := filepath.Join(dir, name)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	var eps []map[string]any
	for e := 1; e <= epochs; e++ {
		rec := map[string]any{"epoch": e, "steps": 390, "train_loss": lossScale * 2 / float64(e), "train_acc": 1 - 0.8/float64(e),
			"test_loss": lossScale * 2.2 / float64(e), "test_acc": 1 - 0.85/float64(e), "img_s": 900.5, "train_s": 55.1,
			"total_s": 60.0 * float64(e), "lr": 0.1}
		eps = append(eps, rec)
		if err := enc.Encode(rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := enc.Encode(map[string]any{"config": map[string]any{"hook": hook, "model": "vgg16"}, "epochs": eps, "summary": true,
		"final_test_acc": 0.9}); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeLMRun writes per-step records with perplexity and an epoch record with validation
// perplexity, as the language-model examples log.
func writeLMRun(t testing.TB, dir string) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintln(&b, `{"hook":"spardl:density=0.01"}`)
	for s := 1; s <= 60; s++ {
		loss := 6 - 2*math.Log1p(float64(s)/10)
		fmt.Fprintf(&b, `{"step":%d,"loss":%g,"ppl":%g,"total_s":%g,"steps_per_epoch":20}`+"\n", s, loss, math.Exp(loss), 0.5*float64(s))
		if s%20 == 0 {
			fmt.Fprintf(&b, `{"epoch":%d,"steps":20,"val_loss":%g,"val_ppl":%g,"total_s":%g}`+"\n\n", s/20, loss+0.1, math.Exp(loss+0.1), 0.5*float64(s)+1)
		}
	}
	path := filepath.Join(dir, "lstm.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// decode checks that path is a PNG of w×h pixels and returns it.
func decode(t *testing.T, path string, w, h int) image.Image {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() != w || b.Dy() != h {
		t.Fatalf("%s is %d×%d pixels, want %d×%d", path, b.Dx(), b.Dy(), w, h)
	}
	return img
}

// colourPixels counts the pixels within a small distance of c.
func colourPixels(img image.Image, c color.Color) int {
	cr, cg, cb, _ := c.RGBA()
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if absDiff(r, cr)+absDiff(g, cg)+absDiff(bl, cb) < 3*0x1000 {
				n++
			}
		}
	}
	return n
}

func absDiff(a, b uint32) uint32 {
	if a > b {
		return a - b
	}
	return b - a
}

func TestFileDrawsOneRun(t *testing.T) {
	dir := t.TempDir()
	metrics := writeVGGRun(t, dir, "vgg.jsonl", "allreduce", 6, 1)
	out := filepath.Join(dir, "vgg.png")
	if err := File(metrics, out); err != nil {
		t.Fatal(err)
	}
	img := decode(t, out, 2*560, 2*380) // steps and time × loss and accuracy
	if n := colourPixels(img, runColor(0)); n < 500 {
		t.Errorf("only %d pixels in the run's colour: the curves are missing", n)
	}
	if n := colourPixels(img, color.White); n < img.Bounds().Dx()*img.Bounds().Dy()/2 {
		t.Errorf("only %d white pixels: not a chart on a white background", n)
	}
}

func TestCompareOverlaysRuns(t *testing.T) {
	dir := t.TempDir()
	files := []string{writeVGGRun(t, dir, "dense.jsonl", "allreduce", 5, 1), writeVGGRun(t, dir, "sparse.jsonl", "spardl:density=0.01", 5, 1.3),
		writeLMRun(t, dir)}
	out := filepath.Join(dir, "cmp.png")
	if err := CompareWith(files, out, Options{Axes: []Axis{Epochs}, Width: 700, Height: 900, Title: "dense vs sparse"}); err != nil {
		t.Fatal(err)
	}
	img := decode(t, out, 700, 900)
	for i := range files {
		if n := colourPixels(img, runColor(i)); n < 200 {
			t.Errorf("run %d (%s): %d pixels in its colour", i, files[i], n)
		}
	}
	if err := Compare(files, out); err != nil { // default: 3 rows (loss, accuracy, perplexity) × 2 axes
		t.Fatal(err)
	}
	decode(t, out, 2*560, 3*380)
}

func TestReadSchema(t *testing.T) {
	dir := t.TempDir()
	vgg, err := Read(writeVGGRun(t, dir, "v.jsonl", "allreduce:algorithm=ring", 3, 1))
	if err != nil {
		t.Fatal(err)
	}
	if vgg.HeldOut != "test" {
		t.Errorf("HeldOut %q for test_* records, want test", vgg.HeldOut)
	}
	if vgg.Name != "allreduce:algorithm=ring" || len(vgg.Epochs) != 3 || len(vgg.Steps) != 0 {
		t.Fatalf("vgg run: %q, %d epochs, %d steps", vgg.Name, len(vgg.Epochs), len(vgg.Steps))
	}
	if e := vgg.Epochs[2]; e.Step != 3*390 || e.Epoch != 3 || e.Time != 180 || e.Values[TestAcc] != 1-0.85/3 || len(e.Values) != 4 {
		t.Errorf("epoch 3: %+v", e)
	}
	lm, err := Read(writeLMRun(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	if lm.Name != "spardl:density=0.01" || len(lm.Steps) != 60 || len(lm.Epochs) != 3 {
		t.Fatalf("lm run: %q, %d steps, %d epochs", lm.Name, len(lm.Steps), len(lm.Epochs))
	}
	if s := lm.Steps[29]; s.Step != 30 || s.Epoch != 1.5 || s.Time != 15 || s.Values[TrainPPL] == 0 || s.Values[TrainLoss] == 0 {
		t.Errorf("step 30: %+v", s)
	}
	if e := lm.Epochs[1]; e.Step != 40 || e.Values[TestPPL] == 0 || e.Values[TestLoss] == 0 {
		t.Errorf("epoch 2: %+v", e)
	}

	// Only a summary: its epochs are the run's; no hook: the file name labels it.
	only := filepath.Join(dir, "summary-only.jsonl")
	os.WriteFile(only, []byte(`{"summary":true,"epochs":[{"epoch":1,"steps":10,"train_loss":1.5}],"config":{"model":"vgg11"}}`+"\n"), 0o644)
	r, err := Read(only)
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "summary-only" || len(r.Epochs) != 1 || r.Epochs[0].Step != 10 {
		t.Errorf("summary-only run: %+v", r)
	}
}

func TestErrorsNameFileAndLine(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		body, want string
	}{
		{"{\"epoch\":1,\"train_loss\":2}\n{\"epoch\":2,\"train_loss\":1.5\n", "bad.jsonl:2: "},
		{"\n\n{\"step\":3,\"loss\":\"high\"}\n", `bad.jsonl:3: field "loss": "high" is not a number`},
		{"{\"step\":1,\"loss\":1}\n[1,2]\n", "bad.jsonl:2: json: cannot unmarshal array"},
		{"{\"summary\":true,\"epochs\":[{\"epoch\":1},{\"epoch\":\"two\"}]}\n", `bad.jsonl:1: epochs[1]: field "epoch"`},
		{"{\"hook\":7}\n", `bad.jsonl:1: field "hook": 7 is not a string`},
		{"{\"img_s\":5}\n", "no loss, accuracy or perplexity values"},
	} {
		path := filepath.Join(dir, "bad.jsonl")
		if err := os.WriteFile(path, []byte(tc.body), 0o644); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "bad.png")
		err := File(path, out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.body, err, tc.want)
		}
		if _, serr := os.Stat(out); serr == nil {
			t.Errorf("%q: a PNG was left behind", tc.body)
			os.Remove(out)
		}
	}
	if err := File(filepath.Join(dir, "missing.jsonl"), filepath.Join(dir, "x.png")); err == nil || !strings.Contains(err.Error(), "missing.jsonl") {
		t.Errorf("missing file: %v", err)
	}
}

func TestRenderErrors(t *testing.T) {
	dir := t.TempDir()
	noTime := filepath.Join(dir, "notime.jsonl")
	os.WriteFile(noTime, []byte(`{"epoch":1,"train_loss":2}`+"\n"), 0o644)
	out := filepath.Join(dir, "o.png")
	for _, tc := range []struct {
		opt  Options
		want string
	}{
		{Options{Axes: []Axis{Time, Steps}}, "no value can be placed on the time or steps axis"},
		{Options{Axes: []Axis{"wall"}}, `unknown x axis "wall"`},
		{Options{Width: 10, Height: 300}, "image size 10×300 pixels"},
	} {
		if err := CompareWith([]string{noTime}, out, tc.opt); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error containing %q", tc.opt, err, tc.want)
		}
	}
	if err := CompareWith([]string{noTime}, out, Options{Axes: []Axis{Epochs}}); err != nil {
		t.Errorf("epochs axis: %v", err)
	}
	if err := Compare(nil, out); err == nil || !strings.Contains(err.Error(), "no metrics files") {
		t.Errorf("no files: %v", err)
	}
	if _, err := ParseAxes("steps,epoch"); err == nil || !strings.Contains(err.Error(), `"epoch"`) {
		t.Errorf("ParseAxes: %v", err)
	}
	if a, err := ParseAxes("time, epochs"); err != nil || len(a) != 2 || a[0] != Time || a[1] != Epochs {
		t.Errorf("ParseAxes: %v %v", a, err)
	}
}

// writeLSTMEvalRun writes a metrics file as examples/lstm -log-every 10 -eval-every 25
// does: training-loss step records, validation step records (val_loss, val_ppl) and one
// epoch record.
func writeLSTMEvalRun(t testing.TB, dir string) string {
	t.Helper()
	var b strings.Builder
	for s := 5; s <= 100; s += 5 {
		if s%10 == 0 {
			fmt.Fprintf(&b, `{"step":%d,"loss":%g,"lr":20,"total_s":%g,"steps_per_epoch":100}`+"\n", s, 9-math.Log(float64(s)), 0.4*float64(s))
		}
		if s%25 == 0 {
			fmt.Fprintf(&b, `{"step":%d,"val_loss":%g,"val_ppl":%g,"total_s":%g,"steps_per_epoch":100}`+"\n", s, 8.5-math.Log(float64(s)), math.Exp(8.5-math.Log(float64(s))), 0.4*float64(s)+1)
		}
	}
	fmt.Fprintf(&b, `{"epoch":1,"steps":100,"train_loss":4.7,"train_ppl":110,"val_loss":3.9,"val_ppl":49,"test_ppl":48,"total_s":45}`+"\n")
	fmt.Fprintf(&b, `{"summary":true,"config":{"hook":"topka"},"epochs":[]}`+"\n")
	path := filepath.Join(dir, "lstm-eval.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Validation perplexity in step records is the curve (not the one epoch point), and
// LogPerplexity draws it on a log axis labelled at 1, 2, 5 × 10^k.
func TestLogPerplexity(t *testing.T) {
	dir := t.TempDir()
	path := writeLSTMEvalRun(t, dir)
	run, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if run.HeldOut != "validation" {
		t.Errorf("HeldOut %q for val_* records, want validation (the legend's word)", run.HeldOut)
	}
	pts, marked := series(run, TestPPL, Epochs, 1)
	if marked || len(pts) != 4 || pts[0].X != 0.25 || pts[3].X != 1 {
		t.Fatalf("validation perplexity series %v (marked %v), want the 4 step records at epochs 0.25…1", pts, marked)
	}
	if pts, marked := series(run, TrainPPL, Epochs, 1); !marked || len(pts) != 1 || pts[0].Y != 110 {
		t.Fatalf("training perplexity series %v (marked %v), want the epoch record's", pts, marked)
	}
	for _, tc := range []struct {
		lo, hi float64
		want   string
	}{{150, 4000, "200 500 1000 2000"}, {550, 1300, "600 700 800 900 1000"}} {
		var labels []string
		for _, tk := range (logTicks{}).Ticks(tc.lo, tc.hi) {
			if tk.Label != "" {
				labels = append(labels, tk.Label)
			}
		}
		if strings.Join(labels, " ") != tc.want {
			t.Errorf("log ticks over %v…%v labelled %v, want %s", tc.lo, tc.hi, labels, tc.want)
		}
	}
	if (logTicks{}).Ticks(0, 10) != nil {
		t.Error("log ticks over a range from 0")
	}
	out := filepath.Join(dir, "lstm.png")
	files := []string{path, writeLMRun(t, dir)}
	if err := CompareWith(files, out, Options{Axes: []Axis{Epochs, Time}, Width: 800, Height: 600, LogPerplexity: true}); err != nil {
		t.Fatal(err)
	}
	img := decode(t, out, 800, 600)
	for i := range files {
		if n := colourPixels(img, runColor(i)); n < 200 {
			t.Errorf("run %d: %d pixels in its colour", i, n)
		}
	}
}
