package train

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// ProgressEvery is how long a non-terminal progress output waits at most between two lines
// (besides one line per tenth of the work).
const ProgressEvery = 10 * time.Second

// progressOut is where rank 0's progress goes and how: a bar fitted to the terminal's width
// when the writer is a terminal, else plain lines (JSON records on a JSON Printer), one per
// tenth of the work and at least one every ProgressEvery.
type progressOut struct {
	w        io.Writer
	printer  *Printer // JSON lines; nil otherwise
	bar      bool     // a terminal: draw a bar
	width    int      // the terminal's columns
	now      func() time.Time
	every    time.Duration
	throttle time.Duration // a bar's least time between two redraws
}

// newProgressOut looks at w: a JSON Printer prints records, a terminal gets a bar as wide as
// it is (80 columns when it does not say), anything else (a file, a pipe, a launcher's log)
// plain lines.
func newProgressOut(w io.Writer) *progressOut {
	o := &progressOut{w: w, now: time.Now, every: ProgressEvery, throttle: 100 * time.Millisecond}
	if p, ok := w.(*Printer); ok {
		if p.JSON() {
			o.printer = p
			return o
		}
		w = p.Writer()
		o.w = w
	}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		o.bar, o.width = true, 80
		if cols, _, err := term.GetSize(int(f.Fd())); err == nil && cols > 0 {
			o.width = cols
		}
	}
	return o
}

// progressKey is the context key of rank 0's progress output (withProgress).
type progressKey struct{}

// withProgress makes o the progress output of ctx's phases (StartProgress).
func withProgress(ctx context.Context, o *progressOut) context.Context {
	if o == nil {
		return ctx
	}
	return context.WithValue(ctx, progressKey{}, o)
}

// ProgressRecord is a progress line's record under -log-format json ("msg": "progress").
type ProgressRecord struct {
	Phase   string  `json:"phase"`           // "train" or "eval"
	Epoch   int     `json:"epoch,omitempty"` // from 1 (train)
	Epochs  int     `json:"epochs,omitempty"`
	Done    int     `json:"done"`  // steps (train) or samples (eval) done
	Total   int     `json:"total"` // of this phase
	Percent float64 `json:"percent"`
	Loss    float64 `json:"loss,omitempty"` // the epoch's running mean (train)
	Acc     float64 `json:"acc,omitempty"`
	Rate    float64 `json:"rate"` // Unit per second, over all ranks
	Unit    string  `json:"unit"`
	ETASec  float64 `json:"eta_s"`
}

// Progress shows one phase's progress (an epoch, an evaluation) on rank 0: a bar on a
// terminal, else periodic lines (see Loop.Progress). A nil *Progress shows nothing, so every
// rank may call its methods.
type Progress struct {
	out        *progressOut
	count      string // "step %d/%d" or "%d/%d img"
	total      int
	done, from int // now; when it started (a resumed epoch)
	start      time.Time
	rec        ProgressRecord
	detail     string // what precedes the count
	bar        *progressbar.ProgressBar
	descWidth  int
	lastLine   time.Time // the last line printed, or the bar's last redraw
	lastTenth  int
}

// StartProgress starts an evaluation's progress over total samples of unit ("img", "words")
// on ctx's progress output: the one a Loop with Progress gives its EndEpoch and Eval on rank
// 0. It returns nil (which shows nothing) elsewhere. Evaluate uses it; a program's own
// evaluation loop calls Add per batch and Finish at the end.
func StartProgress(ctx context.Context, total int, unit string) *Progress {
	o, _ := ctx.Value(progressKey{}).(*progressOut)
	if o == nil || total <= 0 {
		return nil
	}
	return newProgress(o, "%d/%d "+unit, total, 0, ProgressRecord{Phase: "eval", Unit: unit})
}

func newProgress(o *progressOut, count string, total, from int, rec ProgressRecord) *Progress {
	p := &Progress{out: o, count: count, total: total, done: from, from: from, start: o.now(), rec: rec}
	p.lastLine, p.lastTenth = p.start, 10*from/max(total, 1)
	p.rec.Total = total
	if o.bar {
		budget := o.width - 1 // the last column would wrap on some terminals
		// The bar's line is the description, " NNN% |", the bar, "| " and a space.
		const frame = 10
		barWidth := min(40, max(10, budget-frame-64))
		p.descWidth = max(1, budget-frame-barWidth)
		p.bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(o.w), progressbar.OptionSetWidth(barWidth),
			progressbar.OptionSetPredictTime(false), progressbar.OptionSetElapsedTime(false),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionSetDescription(fit("", p.tail(), p.descWidth)))
		_ = p.bar.Set(from)
	}
	return p
}

// Add records n more samples evaluated.
func (p *Progress) Add(n int) {
	if p == nil {
		return
	}
	p.rec.Rate = 0
	if sec := p.out.now().Sub(p.start).Seconds(); sec > 0 {
		p.rec.Rate = float64(p.done+n-p.from) / sec
	}
	p.update(p.done+n, fmt.Sprintf("eval %.0f %s/s", p.rec.Rate, p.rec.Unit))
}

// update sets the phase's progress to done, with detail before the count ("epoch 1/3 loss
// 2.301 acc 10.2% 120 img/s"), and shows it.
func (p *Progress) update(done int, detail string) {
	p.done, p.detail = min(done, p.total), detail
	now := p.out.now()
	if p.bar != nil {
		// At most one redraw per throttle (the last always): the count, then the text.
		if now.Sub(p.lastLine) < p.out.throttle && p.done < p.total {
			return
		}
		p.lastLine = now
		_ = p.bar.Set(p.done)
		p.bar.Describe(fit(detail, p.tail(), p.descWidth))
		return
	}
	tenth := 10 * p.done / p.total
	if tenth <= p.lastTenth && now.Sub(p.lastLine) < p.out.every && p.done < p.total {
		return
	}
	p.lastTenth, p.lastLine = tenth, now
	p.line()
}

// eta is the time left at the phase's rate so far.
func (p *Progress) eta() time.Duration {
	if p.done <= p.from {
		return 0
	}
	el := p.out.now().Sub(p.start)
	return time.Duration(float64(el) / float64(p.done-p.from) * float64(p.total-p.done)).Round(time.Second)
}

// tail is the bar's end of the description: the count and the time left.
func (p *Progress) tail() string {
	return fmt.Sprintf(p.count, p.done, p.total) + " eta " + p.eta().String()
}

// line prints one progress line: text, or a JSON record.
func (p *Progress) line() {
	eta := p.eta()
	p.rec.Done, p.rec.Percent, p.rec.ETASec = p.done, 100*float64(p.done)/float64(p.total), eta.Seconds()
	text := fmt.Sprintf("%s "+p.count+" (%.0f%%) eta %s", p.detail, p.done, p.total, p.rec.Percent, eta)
	if p.out.printer != nil {
		_ = p.out.printer.Record("progress", p.rec, text)
		return
	}
	_, _ = io.WriteString(p.out.w, text+"\n")
}

// Finish ends the phase: a bar is cleared; lines end with the last one if it was not
// printed.
func (p *Progress) Finish() {
	if p == nil {
		return
	}
	if p.bar != nil {
		_ = p.bar.Finish()
		return
	}
	if p.lastTenth < 10 && p.done > p.from {
		p.lastTenth = 10
		p.line()
	}
}

// fit is a bar's description of exactly width columns: detail, cut short when it must be,
// then tail and a space (tail is cut only when nothing else is left).
func fit(detail, tail string, width int) string {
	d, t := []rune(detail), []rune(tail+" ")
	if len(t) >= width {
		return string(t[len(t)-width:])
	}
	room := width - len(t)
	if len(d) > 0 {
		room-- // the space between them
		if len(d) > room {
			d = d[:max(room, 0)]
		}
		d = append(d, ' ')
	}
	s := string(d) + string(t)
	for n := len(d) + len(t); n < width; n++ {
		s += " "
	}
	return s
}
