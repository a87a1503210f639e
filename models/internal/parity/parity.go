// Package parity checks spargo's models against PyTorch through exported weights: the
// same weights and the same batch must give the same loss (1e-4 relative) and the same
// gradients (1e-3 relative) in PyTorch.
//
// A Case names a catalogue model, a batch and a seed. Export builds the model from the
// seed (the catalogue's initialisation), draws the batch, runs one training-mode forward
// and backward, and writes into a directory:
//
//	case.json             the case, the family, the input's data set
//	weights.safetensors   parameters and buffers before the step (PyTorch's state-dict names)
//	batch.safetensors     the inputs ("x" images, "labels" as int64 for the image families)
//	spargo.safetensors    "loss", "grad/<param>" and "buffer/<buffer>" after the step
//
// scripts/torch_parity.py reads such a directory, builds the same model in PyTorch
// (scripts/torch_models.py), loads the weights, computes the loss and gradients on the same
// batch (in float64 by default) and reports the largest relative differences; with
// --golden it also writes a compact golden (torch's loss, and for every gradient and buffer
// its largest magnitude, norm and a fixed sample of elements) that Check compares a fresh
// spargo run against, so CI checks parity without Python:
//
//	go run ./models/internal/parity/export -model resnet20 -batch 8 /tmp/parity/resnet20
//	OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_parity.py --family resnet \
//	    --model resnet20 /tmp/parity/resnet20 --golden testdata/parity/resnet20.json
//
// Relative differences are per tensor, max|spargo − torch| / max|torch| (an element-wise
// ratio is meaningless for gradients that are near zero; see GradFloor for tensors whose
// gradient is zero). A family says how to feed its
// models and which loss to take (Family); the image classifiers (vgg, resnet) are here,
// other families add a case to family.
package parity

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"

	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
	"github.com/spargo-dl/spargo/safetensors"
)

// The parity criteria of issue 10.
const (
	LossRtol = 1e-4 // |loss_spargo − loss_torch| / |loss_torch|
	GradRtol = 1e-3 // max|g_spargo − g_torch| / max(max|g_torch|, GradFloor·G), per tensor
	// GradFloor: a tensor whose gradient is below GradFloor times the model's largest
	// gradient element G is compared on that scale. VGG's convolution biases feed a
	// training-mode BatchNorm, so their gradient is zero in exact arithmetic (torch's
	// float64 gives 1e-17, spargo's float32 1e-7): a ratio of rounding errors says nothing.
	GradFloor = 1e-3
)

// Case is one parity check: catalogue model Model, built from nn.NewRand(Seed), on a batch
// of Batch inputs drawn from nn.NewRand(Seed+1).
type Case struct {
	Model string `json:"model"`
	Batch int    `json:"batch"`
	// Size is the image height = width (0: the data set's); ImageNet ResNets run at 64
	// to keep the check quick.
	Size int    `json:"size,omitempty"`
	Seed uint64 `json:"seed"`
	// Steps > 0 also takes that many SGD steps on the same batch (the first with the
	// checked gradients) with LR, Momentum and WD, and exports the parameters and buffers
	// after them ("param/<name>", "buffer_steps/<name>"): the optimizer and BatchNorm's
	// running statistics over a short trajectory.
	Steps    int     `json:"steps,omitempty"`
	LR       float64 `json:"lr,omitempty"`
	Momentum float64 `json:"momentum,omitempty"`
	WD       float64 `json:"wd,omitempty"`
}

// Family feeds a model family's models in a parity check.
type Family struct {
	// Batch draws the case's inputs from rng, as the named tensors batch.safetensors holds.
	Batch func(c Case, e models.Entry, rng *rand.Rand) (map[string]safetensors.Tensor, error)
	// Loss runs m on the batch (training mode) and returns the scalar loss.
	Loss func(tape *nn.Tape, m nn.Module, batch map[string]safetensors.Tensor) (*nn.Var, error)
}

// family returns how to feed the models of a catalogue family.
func family(name string) (Family, error) {
	switch name {
	case "vgg", "resnet":
		return Family{Batch: imageBatch, Loss: imageLoss}, nil
	}
	return Family{}, fmt.Errorf("parity: no parity check for family %q yet (have vgg, resnet)", name)
}

// imageBatch draws standard-normal images and uniform labels.
func imageBatch(c Case, e models.Entry, rng *rand.Rand) (map[string]safetensors.Tensor, error) {
	in := e.Input
	if in.Size == 0 {
		return nil, fmt.Errorf("parity: %s is not an image classifier", e.Name)
	}
	size := in.Size
	if c.Size > 0 {
		size = c.Size
	}
	x := make([]float32, c.Batch*in.Channels*size*size)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	labels := make([]int64, c.Batch)
	for i := range labels {
		labels[i] = int64(rng.IntN(in.Classes))
	}
	return map[string]safetensors.Tensor{
		"x":      safetensors.FromFloat32(x, c.Batch, in.Channels, size, size),
		"labels": safetensors.FromInt64(labels),
	}, nil
}

// imageLoss is the mean cross-entropy of the logits of batch "x" against "labels".
func imageLoss(tape *nn.Tape, m nn.Module, batch map[string]safetensors.Tensor) (*nn.Var, error) {
	xt, lt := batch["x"], batch["labels"]
	xv, err := xt.Float32()
	if err != nil {
		return nil, fmt.Errorf("batch x: %w", err)
	}
	lv, err := lt.Int64()
	if err != nil {
		return nil, fmt.Errorf("batch labels: %w", err)
	}
	x, err := nn.FromSlice(xv, xt.Shape...)
	if err != nil {
		return nil, err
	}
	labels := make([]int, len(lv))
	for i, l := range lv {
		labels[i] = int(l)
	}
	return nn.CrossEntropy(m.Forward(tape.Const(x)), labels), nil
}

// Result is one spargo step of a case.
type Result struct {
	Entry   models.Entry
	Model   nn.Module
	Batch   map[string]safetensors.Tensor
	Weights *safetensors.File // parameters and buffers before the step
	Loss    float32
	// Grads and Buffers are the gradients and buffers after the first forward and
	// backward, by name; After holds "param/<name>" and "buffer_steps/<name>" after
	// Case.Steps SGD steps (empty without).
	Grads, Buffers, After map[string]*nn.Tensor
}

// Run builds c's model and batch and runs one training-mode forward and backward: the
// gradients are in the model's parameters, the updated running statistics in its buffers.
func Run(c Case) (*Result, error) {
	if c.Batch < 1 {
		return nil, fmt.Errorf("parity: case %s: batch %d, want at least 1", c.Model, c.Batch)
	}
	e, err := models.Lookup(c.Model)
	if err != nil {
		return nil, err
	}
	fam, err := family(e.Family)
	if err != nil {
		return nil, err
	}
	m, err := e.Build(nn.NewRand(c.Seed))
	if err != nil {
		return nil, err
	}
	batch, err := fam.Batch(c, e, nn.NewRand(c.Seed+1))
	if err != nil {
		return nil, err
	}
	weights := safetensors.New()
	for _, p := range nn.Parameters(m) {
		weights.Tensors[p.Name] = safetensors.FromFloat32(p.Value.Data, p.Value.Shape...)
	}
	for _, b := range nn.Buffers(m) {
		weights.Tensors[b.Name] = safetensors.FromFloat32(b.Value.Data, b.Value.Shape...)
	}
	nn.SetTraining(m, true)
	nn.ZeroGrad(nn.Parameters(m))
	tape := nn.NewTape()
	loss, err := fam.Loss(tape, m, batch)
	if err != nil {
		return nil, fmt.Errorf("parity: %s: %w", c.Model, err)
	}
	if err := tape.Backward(loss); err != nil {
		return nil, fmt.Errorf("parity: %s: %w", c.Model, err)
	}
	r := &Result{Entry: e, Model: m, Batch: batch, Weights: weights, Loss: loss.Item(),
		Grads: map[string]*nn.Tensor{}, Buffers: map[string]*nn.Tensor{}, After: map[string]*nn.Tensor{}}
	params := nn.Parameters(m)
	for _, p := range params {
		r.Grads[p.Name] = p.Grad.Clone()
	}
	for _, b := range nn.Buffers(m) {
		r.Buffers[b.Name] = b.Value.Clone()
	}
	if c.Steps > 0 {
		opt, err := optim.NewSGD(params, optim.SGDConfig{LR: c.LR, Momentum: c.Momentum, WeightDecay: c.WD})
		if err != nil {
			return nil, err
		}
		opt.Step()
		for s := 1; s < c.Steps; s++ {
			tape.Reset()
			opt.ZeroGrad()
			loss, err := fam.Loss(tape, m, batch)
			if err == nil {
				err = tape.Backward(loss)
			}
			if err != nil {
				return nil, fmt.Errorf("parity: %s: step %d: %w", c.Model, s+1, err)
			}
			opt.Step()
		}
		for _, p := range params {
			r.After["param/"+p.Name] = p.Value.Clone()
		}
		for _, b := range nn.Buffers(m) {
			r.After["buffer_steps/"+b.Name] = b.Value.Clone()
		}
	}
	return r, nil
}

// Export runs c and writes the directory scripts/torch_parity.py reads (see the package
// documentation).
func Export(dir string, c Case) (*Result, error) {
	r, err := Run(c)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	info := struct {
		Case
		Family  string         `json:"family"`
		Dataset models.Dataset `json:"dataset"`
	}{c, r.Entry.Family, r.Entry.Input}
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "case.json"), append(b, '\n'), 0o644); err != nil {
		return nil, err
	}
	batch := safetensors.New()
	batch.Tensors = r.Batch
	out := safetensors.New()
	loss := safetensors.FromFloat32([]float32{r.Loss})
	loss.Shape = []int{} // a scalar, like PyTorch's loss
	out.Tensors["loss"] = loss
	for prefix, ts := range map[string]map[string]*nn.Tensor{"grad/": r.Grads, "buffer/": r.Buffers, "": r.After} {
		for name, t := range ts {
			out.Tensors[prefix+name] = safetensors.FromFloat32(t.Data, t.Shape...)
		}
	}
	for name, f := range map[string]*safetensors.File{"weights": r.Weights, "batch": batch, "spargo": out} {
		f.Metadata["generator"] = "internal/parity.Export"
		f.Metadata["model"] = c.Model
		if err := f.WriteFile(filepath.Join(dir, name+".safetensors")); err != nil {
			return nil, fmt.Errorf("parity: %s: %w", name, err)
		}
	}
	return r, nil
}

// Golden is what scripts/torch_parity.py --golden writes: the case and PyTorch's results on
// it, compactly.
type Golden struct {
	Generator    string  `json:"generator"`
	TorchVersion string  `json:"torch_version"`
	DType        string  `json:"compute_dtype"`
	Family       string  `json:"family"`
	Case         Case    `json:"case"`
	Loss         float64 `json:"loss"`
	// Tensors holds, by name, every weight ("weight/<name>": its sum, to detect a changed
	// initialisation), input ("input/<name>": its sum), gradient ("grad/<param>") and
	// buffer after the step ("buffer/<buffer>").
	Tensors map[string]TensorSummary `json:"tensors"`
	// Report is the comparison the script printed when it wrote the golden.
	Report map[string]float64 `json:"report"`
}

// TensorSummary describes a tensor by a few numbers and a sample of its elements.
type TensorSummary struct {
	Shape  []int     `json:"shape"`
	Sum    float64   `json:"sum"`
	AbsSum float64   `json:"abs_sum"`
	MaxAbs float64   `json:"max_abs"`
	Norm   float64   `json:"norm"`
	Index  []int     `json:"index"`  // sampled flat indices: evenly spaced, and the largest magnitude
	Values []float64 `json:"values"` // torch's values at Index
}

// LoadGolden reads a golden written by scripts/torch_parity.py --golden.
func LoadGolden(path string) (*Golden, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var g Golden
	if err := json.Unmarshal(b, &g); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if g.Case.Model == "" || len(g.Tensors) == 0 {
		return nil, fmt.Errorf("%s: no case or no tensors", path)
	}
	return &g, nil
}

// Diff is the largest relative difference of one tensor.
type Diff struct {
	Name string
	Rel  float64
}

// Check runs the golden's case in spargo and compares it with PyTorch's results: the
// weights and inputs must be the exported ones (their sums), the loss within LossRtol and
// every sampled gradient and buffer element within GradRtol of the tensor's largest
// magnitude (at least GradFloor of the model's largest gradient), its norm within GradRtol
// (for tensors whose largest magnitude is above that floor). It returns the loss's relative difference and the
// largest difference of each tensor, and an error listing every violation.
func Check(g *Golden) (lossRel float64, diffs []Diff, err error) {
	r, err := Run(g.Case)
	if err != nil {
		return 0, nil, err
	}
	have := map[string][]float32{}
	for name, t := range r.Weights.Tensors {
		if have["weight/"+name], err = t.Float32(); err != nil {
			return 0, nil, err
		}
	}
	for name, t := range r.Batch {
		if t.DType == safetensors.F32 {
			have["input/"+name], _ = t.Float32()
		}
	}
	for name, t := range r.Grads {
		have["grad/"+name] = t.Data
	}
	for name, t := range r.Buffers {
		have["buffer/"+name] = t.Data
	}
	gmax := 0.0
	for name, want := range g.Tensors {
		if strings.HasPrefix(name, "grad/") {
			gmax = math.Max(gmax, want.MaxAbs)
		}
	}
	var bad []string
	lossRel = math.Abs(float64(r.Loss)-g.Loss) / math.Abs(g.Loss)
	if !(lossRel <= LossRtol) {
		bad = append(bad, fmt.Sprintf("loss %.8g, torch %.8g (relative %.2g > %g)", r.Loss, g.Loss, lossRel, LossRtol))
	}
	for name, want := range g.Tensors {
		got, ok := have[name]
		if !ok {
			bad = append(bad, fmt.Sprintf("%s: not in spargo's model", name))
			continue
		}
		if len(got) != numel(want.Shape) {
			bad = append(bad, fmt.Sprintf("%s: %d elements, torch's shape %v", name, len(got), want.Shape))
			continue
		}
		if strings.HasPrefix(name, "weight/") || strings.HasPrefix(name, "input/") {
			// Exported values, not results: their sum must match (the order of summation
			// may differ by a few ulps of the absolute sum).
			var s float64
			for _, v := range got {
				s += float64(v)
			}
			if math.Abs(s-want.Sum) > 1e-6*(want.AbsSum+1) {
				bad = append(bad, fmt.Sprintf("%s: sum %.8g, exported %.8g: the model's initialisation or the batch changed; regenerate the golden", name, s, want.Sum))
			}
			continue
		}
		scale := want.MaxAbs
		if strings.HasPrefix(name, "grad/") {
			scale = math.Max(scale, GradFloor*gmax)
		}
		if scale == 0 {
			scale = 1
		}
		worst := 0.0
		for i, idx := range want.Index {
			worst = math.Max(worst, math.Abs(float64(got[idx])-want.Values[i])/scale)
		}
		var sq float64
		for _, v := range got {
			sq += float64(v) * float64(v)
		}
		if want.Norm > 0 && want.MaxAbs >= scale {
			worst = math.Max(worst, math.Abs(math.Sqrt(sq)-want.Norm)/want.Norm)
		}
		diffs = append(diffs, Diff{name, worst})
		if !(worst <= GradRtol) {
			bad = append(bad, fmt.Sprintf("%s: relative difference %.2g > %g", name, worst, GradRtol))
		}
	}
	if len(bad) > 0 {
		return lossRel, diffs, fmt.Errorf("parity %s: %d mismatches: %v", g.Case.Model, len(bad), bad)
	}
	return lossRel, diffs, nil
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}
