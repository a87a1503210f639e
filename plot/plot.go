package plot

import (
	"bufio"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Axis is a panel column's x axis.
type Axis string

// The x axes a panel can use.
const (
	Steps  Axis = "steps"  // optimizer steps done
	Time   Axis = "time"   // wall time since the start
	Epochs Axis = "epochs" // epochs done
)

// ParseAxes reads a comma-separated list of axes ("steps", "time", "epochs"), as
// `spargo plot -x` takes it.
func ParseAxes(s string) ([]Axis, error) {
	var axes []Axis
	for _, f := range strings.Split(s, ",") {
		a := Axis(strings.TrimSpace(f))
		switch a {
		case Steps, Time, Epochs:
			axes = append(axes, a)
		default:
			return nil, fmt.Errorf("plot: unknown x axis %q (want steps, time or epochs)", f)
		}
	}
	return axes, nil
}

// Options shape a rendering; the zero value is the default.
type Options struct {
	// Axes gives the columns' x axes; default Steps and Time.
	Axes []Axis
	// Width and Height are the image size in pixels; default 560 per column and 380 per
	// row (rows: loss, then accuracy and/or perplexity when the runs have them).
	Width, Height int
	// Title heads the image; default none.
	Title string
	// LogPerplexity draws the perplexity panels on a logarithmic y axis (ticks at 1, 2 and 5
	// times the powers of ten): a language model's perplexity falls by orders of magnitude
	// early on, which a linear axis squeezes into the bottom of the panel.
	LogPerplexity bool
}

// maxPixels bounds Width and Height.
const maxPixels = 16384

// dpi is the resolution of the images: the fonts' point sizes scale with it.
const dpi = 96

// File draws one metrics file as a PNG at png with the default options. Examples call it
// for -plot FILE.png after writing -metrics (rank 0, once the metrics file is closed):
//
//	if *plotPath != "" {
//		if err := plot.File(*metricsPath, *plotPath); err != nil { … }
//	}
func File(metrics, png string) error {
	return Compare([]string{metrics}, png)
}

// Compare overlays several runs' metrics files in one PNG at out (default options), one
// colour per run, labelled by the runs' hooks: dense all-reduce against each sparse hook.
func Compare(files []string, out string) error {
	return CompareWith(files, out, Options{})
}

// CompareWith is Compare with options.
func CompareWith(files []string, out string, opt Options) error {
	if len(files) == 0 {
		return errors.New("plot: no metrics files given")
	}
	runs := make([]*Run, len(files))
	for i, f := range files {
		r, err := Read(f)
		if err != nil {
			return err
		}
		runs[i] = r
	}
	fh, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	w := bufio.NewWriter(fh)
	err = Render(w, runs, opt)
	if err == nil {
		err = w.Flush()
	}
	if cerr := fh.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("plot: %w", cerr)
	}
	if err != nil {
		os.Remove(out)
		return err
	}
	return nil
}

// row is one quantity's panels: its train and test values.
type row struct {
	label       string
	train, test string
}

var rows = []row{
	{"loss", TrainLoss, TestLoss},
	{"accuracy", TrainAcc, TestAcc},
	{"perplexity", TrainPPL, TestPPL},
}

// Render draws runs as a PNG to w. It is an error when no run has a value that can be
// placed on any requested axis (for example only epoch records without "steps" and
// Axes = steps).
func Render(w io.Writer, runs []*Run, opt Options) error {
	axes := opt.Axes
	if len(axes) == 0 {
		axes = []Axis{Steps, Time}
	}
	for _, a := range axes {
		if a != Steps && a != Time && a != Epochs {
			return fmt.Errorf("plot: unknown x axis %q (want steps, time or epochs)", a)
		}
	}
	labels := uniqueNames(runs)
	var used []row
	for _, r := range rows {
		if anyValue(runs, r.train) || anyValue(runs, r.test) {
			used = append(used, r)
		}
	}
	if len(used) == 0 {
		return fmt.Errorf("plot: %s: no loss, accuracy or perplexity values", runPaths(runs))
	}
	width, height := opt.Width, opt.Height
	if width == 0 {
		width = 560 * len(axes)
	}
	if height == 0 {
		height = 380 * len(used)
	}
	if width < 64 || height < 64 || width > maxPixels || height > maxPixels {
		return fmt.Errorf("plot: image size %d×%d pixels: want 64 to %d each way", width, height, maxPixels)
	}

	plots := make([][]*gplot.Plot, len(used))
	drawn := 0
	for i, r := range used {
		plots[i] = make([]*gplot.Plot, len(axes))
		for j, a := range axes {
			p, n, err := panel(runs, labels, r, a)
			if err != nil {
				return err
			}
			if opt.LogPerplexity && r.train == TrainPPL && n > 0 {
				p.Y.Scale, p.Y.Tick.Marker = gplot.LogScale{}, logTicks{}
				p.Y.Label.Text += " (log scale)"
			}
			plots[i][j] = p
			drawn += n
		}
	}
	if drawn == 0 {
		return fmt.Errorf("plot: %s: no value can be placed on the %s axis (see the package doc for the fields each needs)",
			runPaths(runs), axisNames(axes))
	}

	px := func(n int) vg.Length { return vg.Length(n) * vg.Inch / dpi }
	img := vgimg.NewWith(vgimg.UseWH(px(width), px(height)), vgimg.UseDPI(dpi))
	dc := draw.New(img)
	if opt.Title != "" {
		font := gplot.DefaultFont
		font.Size = vg.Points(13)
		sty := draw.TextStyle{Color: color.Black, Font: font, XAlign: draw.XCenter, YAlign: draw.YTop,
			Handler: gplot.DefaultTextHandler}
		dc.FillText(sty, vg.Point{X: dc.Center().X, Y: dc.Max.Y - vg.Points(4)}, opt.Title)
		dc.Max.Y -= sty.Height(opt.Title) + vg.Points(8)
	}
	tiles := draw.Tiles{Rows: len(used), Cols: len(axes), PadX: vg.Points(12), PadY: vg.Points(12),
		PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(8)}
	canvases := gplot.Align(plots, tiles, dc)
	for i := range plots {
		for j := range plots[i] {
			plots[i][j].Draw(canvases[i][j])
		}
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("plot: writing the PNG: %w", err)
	}
	return nil
}

// panel draws one quantity against one axis for every run; n counts the points drawn.
func panel(runs []*Run, labels []string, r row, a Axis) (*gplot.Plot, int, error) {
	p := gplot.New()
	p.Title.Text = r.label
	p.Y.Label.Text = r.label
	p.Legend.Top = r.label != "accuracy" // accuracy rises: keep the legend low
	p.Add(plotter.NewGrid())
	scale, unit := 1.0, ""
	if a == Time {
		scale, unit = timeUnit(runs)
	}
	switch a {
	case Steps:
		p.X.Label.Text = "optimizer steps"
	case Time:
		p.X.Label.Text = "wall time (" + unit + ")"
	case Epochs:
		p.X.Label.Text = "epochs"
	}
	n := 0
	for i, run := range runs {
		for _, split := range []struct {
			q, name string
			dashed  bool
		}{{r.train, "train", false}, {r.test, heldOutName(run), true}} {
			pts, marked := series(run, split.q, a, scale)
			if len(pts) == 0 {
				continue
			}
			n += len(pts)
			label := split.name
			if len(runs) > 1 {
				label = labels[i] + " " + split.name
			}
			line, err := plotter.NewLine(pts)
			if err != nil {
				return nil, 0, fmt.Errorf("plot: %s: %s: %w", run.Path, split.q, err)
			}
			line.Color = runColor(i)
			line.Width = vg.Points(1.5)
			if split.dashed {
				line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
			}
			p.Add(line)
			p.Legend.Add(label, line)
			if marked {
				sc, err := plotter.NewScatter(pts)
				if err != nil {
					return nil, 0, fmt.Errorf("plot: %s: %s: %w", run.Path, split.q, err)
				}
				sc.Color = runColor(i)
				sc.Shape = plotutil.Shape(i / len(runPalette))
				sc.Radius = vg.Points(2.5)
				p.Add(sc)
			}
		}
	}
	if n == 0 {
		p.Title.Text += " (no data on this axis)"
		p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = 0, 1, 0, 1
	}
	return p, n, nil
}

// series returns a run's values of quantity q against axis a (scaled), from its step records
// when they have q, else from its epoch records (then marked: drawn with markers too).
func series(run *Run, q string, a Axis, scale float64) (plotter.XYs, bool) {
	from, marked := run.Steps, false
	if !hasValue(run.Steps, q) {
		from, marked = run.Epochs, true
	}
	var pts plotter.XYs
	for _, pt := range from {
		y, ok := pt.Values[q]
		var x float64
		switch a {
		case Steps:
			x = pt.Step
		case Time:
			x = pt.Time / scale
		case Epochs:
			x = pt.Epoch
		}
		if !ok || math.IsNaN(x) || math.IsInf(x, 0) || math.IsNaN(y) || math.IsInf(y, 0) {
			continue
		}
		pts = append(pts, plotter.XY{X: x, Y: y})
	}
	return pts, marked
}

// timeUnit picks seconds, minutes or hours for the runs' longest wall time.
func timeUnit(runs []*Run) (float64, string) {
	longest := 0.0
	for _, r := range runs {
		for _, set := range [][]Point{r.Steps, r.Epochs} {
			for _, p := range set {
				if !math.IsNaN(p.Time) {
					longest = max(longest, p.Time)
				}
			}
		}
	}
	switch {
	case longest >= 3*3600:
		return 3600, "h"
	case longest >= 20*60:
		return 60, "min"
	}
	return 1, "s"
}

// logTicks marks a logarithmic axis at the integer multiples of the powers of ten,
// labelling 1, 2 and 5 times them, or every one when fewer than 3 of those fall in the
// range (a range within a decade or two still gets several labels).
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []gplot.Tick {
	if !(lo > 0) || !(hi >= lo) {
		return nil
	}
	var ticks []gplot.Tick
	labelled := 0
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for m := 1; m <= 9; m++ {
			v := float64(m) * math.Pow(10, e)
			if v < lo || v > hi {
				continue
			}
			t := gplot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = strconv.FormatFloat(v, 'g', -1, 64)
				labelled++
			}
			ticks = append(ticks, t)
		}
	}
	if labelled < 3 {
		for i := range ticks {
			ticks[i].Label = strconv.FormatFloat(ticks[i].Value, 'g', -1, 64)
		}
	}
	return ticks
}

func hasValue(ps []Point, q string) bool {
	for _, p := range ps {
		if _, ok := p.Values[q]; ok {
			return true
		}
	}
	return false
}

func anyValue(runs []*Run, q string) bool {
	for _, r := range runs {
		if hasValue(r.Steps, q) || hasValue(r.Epochs, q) {
			return true
		}
	}
	return false
}

// uniqueNames returns the runs' labels, adding the file name where two runs share one.
func uniqueNames(runs []*Run) []string {
	count := map[string]int{}
	for _, r := range runs {
		count[r.Name]++
	}
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.Name
		if count[r.Name] > 1 {
			out[i] = fmt.Sprintf("%s (%s)", r.Name, filepath.Base(r.Path))
		}
	}
	return out
}

func runPaths(runs []*Run) string {
	ps := make([]string, len(runs))
	for i, r := range runs {
		ps[i] = r.Path
	}
	return strings.Join(ps, ", ")
}

func axisNames(axes []Axis) string {
	ns := make([]string, len(axes))
	for i, a := range axes {
		ns[i] = string(a)
	}
	return strings.Join(ns, " or ")
}

// runPalette tells up to a dozen runs apart (a hook comparison overlays that many);
// runs beyond it reuse the colours with another marker shape. Tableau 10 plus two.
var runPalette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, {0xff, 0x7f, 0x0e, 0xff}, {0x2c, 0xa0, 0x2c, 0xff}, {0xd6, 0x27, 0x28, 0xff},
	{0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff}, {0xe3, 0x77, 0xc2, 0xff}, {0x7f, 0x7f, 0x7f, 0xff},
	{0xbc, 0xbd, 0x22, 0xff}, {0x17, 0xbe, 0xcf, 0xff}, {0x00, 0x00, 0x00, 0xff}, {0x80, 0x00, 0x80, 0xff},
}

// runColor is run i's colour.
func runColor(i int) color.Color { return runPalette[i%len(runPalette)] }

// heldOutName is the legend word of a run's held-out series: its HeldOut, "test" if unset.
func heldOutName(run *Run) string {
	if run.HeldOut == "" {
		return "test"
	}
	return run.HeldOut
}
