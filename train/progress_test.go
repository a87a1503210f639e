package train

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/nn"
)

// fakeClock is a progress output's clock that a test moves.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// linesOut is a non-terminal progress output on buf with a clock the test moves.
func linesOut(buf *bytes.Buffer) (*progressOut, *fakeClock) {
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	return &progressOut{w: buf, now: clk.now, every: ProgressEvery}, clk
}

// Off a terminal the progress is plain lines: no carriage return, one line per tenth of the
// epoch (and the last), each with the step, the total, the percentage and the time left.
func TestProgressLinesPerTenth(t *testing.T) {
	var buf bytes.Buffer
	o, clk := linesOut(&buf)
	p := newProgress(o, "step %d/%d", 20, 0, ProgressRecord{Phase: "train"})
	for s := 1; s <= 20; s++ {
		clk.t = clk.t.Add(time.Second)
		p.update(s, fmt.Sprintf("epoch 1/1 loss %.3f", 2.0/float64(s)))
	}
	p.Finish()
	out := buf.String()
	if strings.ContainsRune(out, '\r') {
		t.Fatalf("carriage return in line output:\n%q", out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 10 {
		t.Fatalf("%d lines, want one per tenth (10):\n%s", len(lines), out)
	}
	for i, l := range lines {
		step := 2 * (i + 1)
		want := fmt.Sprintf("step %d/20 (%d%%) eta %s", step, 10*(i+1), time.Duration(20-step)*time.Second)
		if !strings.Contains(l, want) || !strings.HasPrefix(l, "epoch 1/1 loss ") {
			t.Errorf("line %d = %q, want it to contain %q", i, l, want)
		}
	}
}

// A long phase prints a line at least every ProgressEvery even within a tenth, and none
// in between.
func TestProgressLinesEvery(t *testing.T) {
	var buf bytes.Buffer
	o, clk := linesOut(&buf)
	p := StartProgress(withProgress(context.Background(), o), 1000, "img")
	for i := 1; i <= 9; i++ { // 9 images, 4 s apart: within the first tenth
		clk.t = clk.t.Add(4 * time.Second)
		p.Add(1)
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	// lines at 12 s (3 img), 24 s (6), 36 s (9)
	if len(lines) != 3 || lines[0] != "eval 0 img/s 3/1000 img (0%) eta 1h6m28s" || !strings.HasPrefix(lines[2], "eval 0 img/s 9/1000 img (1%)") {
		t.Fatalf("lines %q, want 3 at 12 s intervals", lines)
	}
}

// On a terminal the bar's line, as the bar library renders it, fits the terminal's width
// (one column spare) at every refresh, however long the description; refreshes redraw the
// line (carriage returns) and never start a new one.
func TestProgressBarWidth(t *testing.T) {
	for _, cols := range []int{40, 80, 120, 200} {
		var buf bytes.Buffer
		o := &progressOut{w: &buf, bar: true, width: cols, now: time.Now, every: ProgressEvery}
		p := newProgress(o, "step %d/%d", 20, 0, ProgressRecord{Phase: "train"})
		for s := 1; s <= 20; s++ {
			p.update(s, fmt.Sprintf("epoch 1/100 loss %.3f acc %.1f%% %.0f img/s and a long tail of words", 2.3/float64(s), 100*float64(s)/20, 1234.5*float64(s)))
		}
		out := buf.String()
		if strings.ContainsRune(out, '\n') {
			t.Fatalf("%d columns: a refresh started a new line:\n%q", cols, out)
		}
		frames, counted := 0, map[int]bool{}
		for f := range strings.SplitSeq(out, "\r") {
			if w := utf8.RuneCountInString(f); w > cols-1 {
				t.Fatalf("%d columns: a frame is %d wide: %q", cols, w, f)
			}
			if !strings.Contains(f, "%") {
				continue
			}
			frames++
			// The text's count and the bar's percentage agree once the text is set (a redraw
			// draws the count, then the text: the frame between shows the previous text).
			var step, pct int
			if i := strings.Index(f, "step "); i >= 0 {
				if _, err := fmt.Sscanf(f[i:], "step %d/20", &step); err == nil {
					j := strings.Index(f, "%")
					fmt.Sscanf(strings.TrimSpace(f[j-4:j]), "%d", &pct)
					if pct != 5*step && pct != 5*(step+1) {
						t.Fatalf("%d columns: frame %q shows %d%% for step %d", cols, f, pct, step)
					}
					if pct == 5*step {
						counted[step] = true
					}
				}
			}
		}
		if frames < 38 {
			t.Errorf("%d columns: %d frames drawn, want about two per step", cols, frames)
		}
		if cols >= 80 && len(counted) < 19 {
			t.Errorf("%d columns: %d steps shown with their percentage, want 19 (the 20th clears the bar):\n%q", cols, len(counted), out)
		}
	}
}

// fit keeps the tail and cuts the detail, to exactly the width.
func TestProgressFit(t *testing.T) {
	for _, c := range []struct {
		detail, tail string
		width        int
		want         string
	}{
		{"epoch 1/3 loss 2.0", "step 1/9 eta 3s", 40, "epoch 1/3 loss 2.0 step 1/9 eta 3s      "},
		{"epoch 1/3 loss 2.0", "step 1/9 eta 3s", 25, "epoch 1/ step 1/9 eta 3s "},
		{"epoch 1/3 loss 2.0", "step 1/9 eta 3s", 10, "/9 eta 3s "},
		{"", "step 1/9", 12, "step 1/9    "},
	} {
		if got := fit(c.detail, c.tail, c.width); got != c.want || utf8.RuneCountInString(got) != c.width {
			t.Errorf("fit(%q, %q, %d) = %q, want %q", c.detail, c.tail, c.width, got, c.want)
		}
	}
}

// evalImages is an in-memory data set of n 2×1 RGB images of 3 classes.
func evalImages(n int) *datasets.Images {
	im := &datasets.Images{Name: "toy test", N: n, C: 3, H: 2, W: 1, Pixels: make([]uint8, n*6), Labels: make([]int32, n), Classes: 3,
		ClassNames: []string{"a", "b", "c"}, Mean: [3]float32{0.5, 0.5, 0.5}, Std: [3]float32{0.25, 0.25, 0.25}}
	for i := range im.Pixels {
		im.Pixels[i] = uint8(i * 37)
	}
	for i := range im.Labels {
		im.Labels[i] = int32(i % 3)
	}
	return im
}

// runToyWithProgress trains the toy loop for 2 epochs of 5 steps with rank 0's progress on
// progress and Evaluate over 40 images (batches of 4) at each epoch's end, and returns the
// ranks' errors.
func runToyWithProgress(t *testing.T, ctx context.Context, progress func(rank int) *Printer) []error {
	t.Helper()
	_, errs := toyLoopCtx(t, ctx, 2, 5, func(rank int, l *Loop[toyBatch]) {
		ld, err := datasets.NewLoader(evalImages(40), datasets.LoaderOptions{Batch: 4})
		if err != nil {
			t.Error(err)
			return
		}
		if p := progress(rank); p != nil {
			l.Progress = p.Out()
		}
		tape := nn.NewTape()
		l.EndEpoch = func(ctx context.Context, es EpochStats) error {
			_, _, err := Evaluate(ctx, l.Group, l.DDP, l.Model, tape, ld, 0, 6)
			return err
		}
	})
	return errs
}

// The loop shows the training's and Evaluate's progress on rank 0's output (a pipe here:
// plain lines), nothing on the others.
func TestLoopProgressWithEvaluation(t *testing.T) {
	var bufs [2]bytes.Buffer
	errs := runToyWithProgress(t, context.Background(), func(rank int) *Printer {
		p, _ := NewPrinter(&bufs[rank], "text")
		if rank == 0 {
			return p
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	out := bufs[0].String()
	for _, want := range []string{"epoch 1/2 loss ", "step 5/5 (100%)", "epoch 2/2 ", "eval ", "40/40 img (100%)", " img/s "} {
		if !strings.Contains(out, want) {
			t.Errorf("rank 0's progress lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "40/40 img (100%)"); n != 2 {
		t.Errorf("%d finished evaluations shown, want 2 (one per epoch):\n%s", n, out)
	}
	if strings.ContainsRune(out, '\r') {
		t.Errorf("carriage return off a terminal:\n%q", out)
	}
	if bufs[1].Len() != 0 {
		t.Errorf("rank 1 printed progress:\n%s", bufs[1].String())
	}
}

// Under -log-format json every line of the output is a JSON object: the program's own lines
// written through the Printer, its records, the training's and the evaluation's progress.
func TestJSONEveryLine(t *testing.T) {
	var buf bytes.Buffer
	p, err := NewPrinter(&buf, "json")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(p, "data: %s\n%s\n", "dir", "CIFAR-10 train: 16 records")
	fmt.Fprint(p, "model vgg11: ")
	fmt.Fprint(p, "9 parameters\n")
	if err := Print(p, "epoch", struct {
		Epoch int     `json:"epoch"`
		Loss  float64 `json:"train_loss"`
	}{1, 2.5}, "epoch 1 train_loss 2.5"); err != nil {
		t.Fatal(err)
	}
	_ = p.Error("vgg", errors.New("boom"), "vgg: boom")
	if errs := runToyWithProgress(t, context.Background(), func(rank int) *Printer {
		if rank == 0 {
			return p
		}
		return nil
	}); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	msgs := map[string]int{}
	phases := map[string]int{}
	for i, line := range strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("line %d is not JSON: %q: %v", i+1, line, err)
		}
		if rec["time"] == nil || rec["level"] == nil {
			t.Errorf("line %d lacks time or level: %q", i+1, line)
		}
		msg, _ := rec["msg"].(string)
		msgs[msg]++
		if msg == "progress" {
			phases[rec["phase"].(string)]++
		}
		if msg == "epoch" && (rec["epoch"] != 1.0 || rec["train_loss"] != 2.5) {
			t.Errorf("epoch record %q lost its fields", line)
		}
	}
	if msgs["model vgg11: 9 parameters"] != 1 || msgs["data: dir"] != 1 || msgs["vgg"] != 1 {
		t.Errorf("printed lines missing: %v", msgs)
	}
	if phases["train"] == 0 || phases["eval"] == 0 {
		t.Errorf("progress records per phase %v, want train and eval", phases)
	}
}

// A stop request (a signal under Main: cluster.NotifyGraceful) on one rank stops every rank
// at the same step boundary: they save a checkpoint there and return a *StoppedError whose
// cause is the signal; resuming from it continues exactly.
func TestLoopStopSavesCheckpoint(t *testing.T) {
	dir := t.TempDir()
	ctx, request := cluster.WithStopper(context.Background())
	sig := &cluster.SignalError{Signal: os.Interrupt}
	_, errs := toyLoopCtx(t, ctx, 2, 6, func(rank int, l *Loop[toyBatch]) {
		l.Checkpoints = &Checkpointer{Dir: dir, Meta: checkpoint.Meta{Model: "toy", Hook: "allreduce", World: 2}}
		step := l.Step
		n := 0
		l.Step = func(ctx context.Context, b toyBatch) (StepResult, error) {
			if n++; rank == 1 && n == 3 { // during epoch 1's third step, on rank 1 only
				request(sig)
			}
			return step(ctx, b)
		}
	})
	for r, err := range errs {
		var st *StoppedError
		if !errors.As(err, &st) {
			t.Fatalf("rank %d: %v, want a *StoppedError", r, err)
		}
		if st.Epoch != 1 || st.Step != 3 || st.Checkpoint == "" {
			t.Errorf("rank %d stopped at epoch %d step %d, checkpoint %q; want epoch 1 step 3 with a checkpoint", r, st.Epoch, st.Step, st.Checkpoint)
		}
		if !errors.Is(err, sig) {
			t.Errorf("rank %d: %v does not wrap the signal", r, err)
		}
	}
	path, err := checkpoint.Latest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, pos, err := checkpoint.ReadInfo(path); err != nil || pos.Epoch != 0 || pos.Step != 3 || pos.Iteration != 3 {
		t.Fatalf("checkpoint %s at %+v (%v), want epoch 0 step 3 iteration 3", path, pos, err)
	}
	// Resumed, the run ends where an uninterrupted one does.
	resumed := toyLoop(t, 2, 6, func(_ int, l *Loop[toyBatch]) {
		l.Checkpoints = &Checkpointer{Dir: dir, Resume: true, Meta: checkpoint.Meta{Model: "toy", Hook: "allreduce", World: 2}}
	})
	whole := toyLoop(t, 2, 6, func(int, *Loop[toyBatch]) {})
	for i, p := range whole[0] {
		for j, v := range p.Value.Data {
			if resumed[0][i].Value.Data[j] != v {
				t.Fatalf("parameter %s[%d]: resumed %g, uninterrupted %g", p.Name, j, resumed[0][i].Value.Data[j], v)
			}
		}
	}
}
