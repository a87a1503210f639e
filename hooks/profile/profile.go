package profile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spargo-dl/spargo/nn"
)

// Profile holds the costs that planners (OMGS) and simulators use, measured by
// Measure on one model, one group and one machine: when each parameter's gradient
// becomes ready in backward, what an exact top-k selection costs on this CPU, and what an
// all-gather costs on this group. Every rank gets rank 0's numbers, so every rank plans the
// same buckets. It prints with %v (a summary) or %+v (and one line per parameter), and saves
// to and loads from JSON (Save, Load) so a run can reuse it.
type Profile struct {
	// P is the world size the all-gather was timed at.
	P int `json:"p"`
	// Params and Sizes name the model's parameters in declaration order and give their
	// elements; Check compares them with a model.
	Params []string `json:"params"`
	Sizes  []int    `json:"sizes"`
	// ParamBackward[i] is the time from the start of backward until parameter i's gradient
	// was ready, averaged over the measured iterations (rank 0's). A parameter the forward did
	// not use counts as ready when backward returned (it is listed in Unused).
	ParamBackward []time.Duration `json:"param_backward_ns"`
	// Forward is the mean time from the start of a step until it called backward (the forward
	// pass, with whatever the step did before it); Backward the mean duration of backward.
	Forward  time.Duration `json:"forward_ns"`
	Backward time.Duration `json:"backward_ns"`
	// Warmup and Iterations are the steps run before measuring and measured.
	Warmup     int      `json:"warmup"`
	Iterations int      `json:"iterations"`
	Unused     []string `json:"unused,omitempty"`
	TopK       TopKCost `json:"topk"`
	// AllGather is the cost of the all-gather the sparse hooks use (comm.AllGatherBytesSized).
	AllGather AllGatherCost `json:"allgather"`
	// AllReduce is the cost of the dense all-reduce (comm.AllReduce, comm.Auto) that the
	// layer-wise hooks use for small tensors (hooks' dense_below); Size in its samples is
	// bytes per rank. A profile saved before it was measured has none (no samples).
	AllReduce AllReduceCost `json:"allreduce,omitzero"`
}

// TopKCost is the top-k model of the OMGS paper (its Eq. 10): selecting the
// k = Density·n largest magnitudes of n elements takes Gamma·n·log2(n) seconds, with Gamma
// fitted by least squares to timings of the real selection kernel.
type TopKCost struct {
	Gamma   float64 `json:"gamma_s"`
	Density float64 `json:"density"`
	// Samples are the timings (Size in elements; the median of the repeats).
	Samples []CostSample `json:"samples"`
	// MaxRelErr is the fit's largest relative error over the samples.
	MaxRelErr float64 `json:"max_rel_err"`
}

// Seconds is the modelled time to select from n elements (0 for n <= 1).
func (c TopKCost) Seconds(n float64) float64 {
	if n <= 1 {
		return 0
	}
	return c.Gamma * n * math.Log2(n)
}

// AllGatherCost is the communication model of the OMGS paper (its Eq. 11): an all-gather in
// which every rank contributes b bytes takes Alpha + Beta·b seconds, fitted by weighted
// least squares (relative error) to timings on the real group.
type AllGatherCost struct {
	Alpha float64 `json:"alpha_s"`
	Beta  float64 `json:"beta_s_per_byte"`
	// Samples are the timings (Size in bytes per rank; the median of the repeats).
	Samples   []CostSample `json:"samples"`
	MaxRelErr float64      `json:"max_rel_err"`
}

// Seconds is the modelled time of an all-gather of b bytes per rank.
func (c AllGatherCost) Seconds(b float64) float64 { return c.Alpha + c.Beta*b }

// AllReduceCost is the same model for a dense all-reduce of b bytes per rank: Alpha + Beta·b
// seconds, fitted the same way.
type AllReduceCost = AllGatherCost

// CostSample is one timed size.
type CostSample struct {
	Size    int     `json:"size"`
	Seconds float64 `json:"s"`
}

// Check reports whether the profile was measured on a model with these parameters (names
// and sizes in declaration order); the error names the first difference.
func (p *Profile) Check(params []*nn.Param) error {
	if p == nil {
		return errors.New("profile: no profile")
	}
	if len(p.Params) != len(params) || len(p.Sizes) != len(params) || len(p.ParamBackward) != len(params) {
		return fmt.Errorf("profile: the profile has %d parameters (%d sizes, %d times), the model %d: measured on another model", len(p.Params), len(p.Sizes), len(p.ParamBackward), len(params))
	}
	for i, q := range params {
		if p.Params[i] != q.Name || p.Sizes[i] != q.Len() {
			return fmt.Errorf("profile: the profile's parameter %d is %s (%d elements), the model's %s (%d elements): measured on another model", i, p.Params[i], p.Sizes[i], q.Name, q.Len())
		}
	}
	return nil
}

// Order returns the parameter indices in the order their gradients became ready (the
// backward order), earliest first; equal times keep reverse declaration order.
func (p *Profile) Order() []int {
	n := len(p.ParamBackward)
	order := make([]int, n)
	for i := range order {
		order[i] = n - 1 - i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return int(min(max(p.ParamBackward[a]-p.ParamBackward[b], -1), 1))
	})
	return order
}

// LayerBackward returns, for the parameters in order, the backward time attributed to each:
// the time between the previous parameter's gradient being ready and its own (the paper's
// t_b^(l)); the first one's is counted from the start of backward.
func (p *Profile) LayerBackward(order []int) []time.Duration {
	tb := make([]time.Duration, len(order))
	var prev time.Duration
	for j, i := range order {
		tb[j] = max(p.ParamBackward[i]-prev, 0)
		prev = max(prev, p.ParamBackward[i])
	}
	return tb
}

// String is the summary %v prints.
func (p *Profile) String() string { return fmt.Sprintf("%v", p) }

// Format implements fmt.Formatter: %v and %s print a summary, %+v adds one line per
// parameter in backward order (ready time, its own backward time, elements, name).
func (p *Profile) Format(f fmt.State, verb rune) {
	if p == nil {
		io.WriteString(f, "<nil profile>")
		return
	}
	total := 0
	for _, s := range p.Sizes {
		total += s
	}
	fmt.Fprintf(f, "profile: %d parameters (%d elements), P=%d, %d warm-up + %d measured steps: forward %v, backward %v\n",
		len(p.Params), total, p.P, p.Warmup, p.Iterations, p.Forward.Round(time.Microsecond), p.Backward.Round(time.Microsecond))
	fmt.Fprintf(f, "  top-k (density %g): %.4g ns · n·log2 n (max fit error %.0f%%; %s)\n",
		p.TopK.Density, p.TopK.Gamma*1e9, 100*p.TopK.MaxRelErr, samples(p.TopK.Samples, "n"))
	fmt.Fprintf(f, "  all-gather: α = %v, β = %.4g ns/byte per rank (max fit error %.0f%%; %s)",
		seconds(p.AllGather.Alpha), p.AllGather.Beta*1e9, 100*p.AllGather.MaxRelErr, samples(p.AllGather.Samples, "B"))
	if len(p.AllReduce.Samples) > 0 {
		fmt.Fprintf(f, "\n  all-reduce: α = %v, β = %.4g ns/byte per rank (max fit error %.0f%%; %s)",
			seconds(p.AllReduce.Alpha), p.AllReduce.Beta*1e9, 100*p.AllReduce.MaxRelErr, samples(p.AllReduce.Samples, "B"))
	}
	if len(p.Unused) > 0 {
		fmt.Fprintf(f, "\n  unused by the forward: %s", strings.Join(p.Unused, ", "))
	}
	if verb != 'v' || !f.Flag('+') {
		return
	}
	order := p.Order()
	tb := p.LayerBackward(order)
	fmt.Fprintf(f, "\n  %4s %12s %12s %10s  %s", "#", "ready", "t_b", "elements", "parameter (backward order)")
	for j, i := range order {
		fmt.Fprintf(f, "\n  %4d %12v %12v %10d  %s", i, p.ParamBackward[i].Round(time.Microsecond/10), tb[j].Round(time.Microsecond/10), p.Sizes[i], p.Params[i])
	}
}

func seconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(time.Microsecond / 10)
}

func samples(ss []CostSample, unit string) string {
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = fmt.Sprintf("%d%s %v", s.Size, unit, seconds(s.Seconds))
	}
	return strings.Join(parts, ", ")
}

// WriteJSON writes the profile as indented JSON.
func (p *Profile) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(p)
}

// Read reads a profile written by WriteJSON and checks that it is complete.
func Read(r io.Reader) (*Profile, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var p Profile
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("profile: reading a profile: %w", err)
	}
	if err := p.validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// validate checks what a planner relies on.
func (p *Profile) validate() error {
	switch {
	case p.P < 1:
		return fmt.Errorf("profile: P = %d", p.P)
	case len(p.Params) == 0 || len(p.Sizes) != len(p.Params) || len(p.ParamBackward) != len(p.Params):
		return fmt.Errorf("profile: %d parameters, %d sizes, %d backward times", len(p.Params), len(p.Sizes), len(p.ParamBackward))
	case !(p.TopK.Gamma >= 0) || !(p.TopK.Density > 0 && p.TopK.Density <= 1):
		return fmt.Errorf("profile: top-k cost γ = %v at density %v", p.TopK.Gamma, p.TopK.Density)
	case !(p.AllGather.Alpha >= 0) || !(p.AllGather.Beta >= 0):
		return fmt.Errorf("profile: all-gather cost α = %v, β = %v", p.AllGather.Alpha, p.AllGather.Beta)
	case !(p.AllReduce.Alpha >= 0) || !(p.AllReduce.Beta >= 0):
		return fmt.Errorf("profile: all-reduce cost α = %v, β = %v", p.AllReduce.Alpha, p.AllReduce.Beta)
	}
	for i, d := range p.ParamBackward {
		if d < 0 {
			return fmt.Errorf("profile: parameter %s ready at %v", p.Params[i], d)
		}
	}
	return nil
}

// Save writes the profile to path as JSON.
func (p *Profile) Save(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("profile: saving the profile: %w", err)
	}
	if err := p.WriteJSON(f); err != nil {
		f.Close()
		return fmt.Errorf("profile: saving the profile to %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("profile: saving the profile to %s: %w", path, err)
	}
	return nil
}

// Load reads a profile saved with Save.
func Load(path string) (*Profile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("profile: loading a profile: %w", err)
	}
	defer f.Close()
	p, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("%w (file %s)", err, path)
	}
	return p, nil
}
