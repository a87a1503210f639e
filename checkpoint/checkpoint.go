// Package checkpoint saves and restores the whole state of a (data-parallel) training run,
// so that a resumed run continues bit for bit where the saved one stopped.
//
// A checkpoint is a directory under the run's checkpoint directory, one per save, named
// after the iteration ("ckpt-0000001234"); the file "latest" names the newest one, and a
// Saver keeps the newest Keep of them:
//
//	ckpt-0000001234/
//	    meta.json            Meta (model, hook spec, world size, flags, spargo version), Position
//	                         and every file's SHA-256 digests, whole and per tensor (FileDigest)
//	    model.safetensors    parameters and buffers (BatchNorm running statistics) by dotted name, F32;
//	                         PyTorch loads it (scripts/read_safetensors.py)
//	    optimizer.safetensors  the optimizer's State() (momentum buffers, …)
//	    rank-0.safetensors   per-rank state: the comm hook's (residuals, thresholds, counters),
//	    rank-1.safetensors   DDP's (iteration, pending late results), the random generators',
//	    …                    the loop's own arrays (State.Arrays: an LSTM's carried hidden
//	                         state) and whatever model or optimizer entries differ from rank 0's
//	latest                   "ckpt-0000001234\n"
//
// With DDP every rank calls Saver.Save at the same step (it is a collective over the DDP's
// group): rank 0 writes the replicated state once, each rank writes its own rank file, and
// entries of the model or optimizer state that differ between ranks (BatchNorm statistics
// under -dist-bn reduce, LGP's corrections) are found by comparing digests and go to the rank
// files. The ranks must share the checkpoint directory (one machine, or a shared file
// system). Files are written to a temporary directory that is renamed into place once every
// rank has written, and "latest" is replaced atomically, so a crash never leaves a partial
// checkpoint as the latest one.
//
// Load restores every rank's state from a checkpoint after checking that it was saved by the
// same model and hook (and flags, Meta.Config); the error says what differs. A checkpoint
// taken at an epoch's end also resumes on another number of ranks: the model and optimizer
// load as they are, and a Redistributor hook's residuals are merged so that their sum over
// the ranks is kept (other hook state is reset, with a warning); see resize.go.
// The data position (Position) is the caller's to act on: datasets.Loader.EpochFrom resumes
// an epoch at a step.
//
// Load checks every file it reads against the digests in meta.json and refuses a corrupt
// checkpoint, naming the file and the tensors whose bytes changed; Verify checks a whole
// checkpoint. A checkpoint written before digests were recorded loads with a warning.
//
// Diff and Compare tell whether two checkpoints hold the same state, tensor by tensor, and
// where they differ (`spargo diff A B` on the command line): the check of an exact resume.
package checkpoint

import (
	"encoding"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
)

// Optimizer is what a checkpoint needs of an optimizer: its state by name (optim.SGD has
// it, and so do the other optimizers of package optim).
type Optimizer interface {
	State() map[string][]float32
	LoadState(map[string][]float32) error
}

// RandState is a random generator whose state can be saved: *rand.PCG and *rand.ChaCha8
// of math/rand/v2 are.
type RandState interface {
	encoding.BinaryMarshaler
	encoding.BinaryUnmarshaler
}

// Meta describes the run a checkpoint belongs to. Load refuses a checkpoint whose Model,
// Hook or Config differs from the resuming run's, and one of another World unless it was
// taken at an epoch's end (then it redistributes; resize.go).
type Meta struct {
	// Model names the architecture ("vgg11").
	Model string `json:"model"`
	// Hook is the comm hook's spec ("spardl:density=0.01"), empty without DDP.
	Hook string `json:"hook"`
	// World is the number of ranks.
	World int `json:"world_size"`
	// Config holds the flags that must match on resume (batch size, learning rate, seed…),
	// as the program formats them.
	Config map[string]string `json:"config,omitempty"`
	// Version is spargo's version (module version or VCS revision); Save fills it in.
	// It is informative: Load does not compare it.
	Version string `json:"spargo_version"`
	// Canonical, when set on the resuming run's Meta, rewrites the saved Hook (field "hook")
	// and Config values (field: the key) into the form this run writes before Check compares
	// them, so that a checkpoint that holds a spec as it was typed still resumes. Not saved.
	Canonical func(field, value string) string `json:"-"`
}

// Position is where training stands when a checkpoint is taken.
type Position struct {
	// Epoch is the epoch in progress (from 0) and Step the steps of it done: a checkpoint at
	// the end of epoch e has Epoch e+1, Step 0.
	Epoch int `json:"epoch"`
	Step  int `json:"step"`
	// Samples counts the training samples seen by all ranks, Iteration the optimizer steps.
	Samples   int64 `json:"samples"`
	Iteration int64 `json:"iteration"`
	// Totals are the training loop's running sums within the epoch (loss, correct…), so that
	// a resumed epoch reports the same statistics. They are per rank: each rank's are saved in
	// its rank file and Load returns this rank's (meta.json shows rank 0's).
	Totals map[string]float64 `json:"totals,omitempty"`
}

// State is one rank's training state: what Save writes and Load fills in. Only Model is
// required.
type State struct {
	Model nn.Module
	// DDP, when set, provides the group, DDP's own state and the comm hook's (when the hook
	// is ddp.Stateful).
	DDP       *ddp.DDP
	Optimizer Optimizer
	// RNG are named generators of the training loop (the layers' own generators, such as
	// Dropout's, are found in Model and saved under "model/<path>").
	RNG map[string]RandState
	// Arrays are the training loop's own per-rank arrays by name, such as the hidden state a
	// language model carries from one bptt window to the next: Save writes each rank's into
	// its rank file with its shape, Load copies them back in place and refuses an entry whose
	// shape differs, one missing from the checkpoint and one the run does not have.
	Arrays map[string]Array
}

// Array is a float32 array of State.Arrays: Data holds the values of Shape, row-major; Axes,
// when set, names Shape's axes in errors ("layers", "batch", "hidden").
type Array struct {
	Data  []float32
	Shape []int
	Axes  []string
}

func (a Array) describe(shape []int) string {
	if len(a.Axes) == 0 {
		return fmt.Sprint(shape)
	}
	return fmt.Sprintf("%v (%s)", shape, strings.Join(a.Axes, ", "))
}

func (st State) group() comm.Group {
	if st.DDP != nil {
		return st.DDP.Group()
	}
	return nil
}

// Version returns spargo's version as the build records it: the module version, or
// "devel" with the VCS revision.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	if bi.Main.Path != "github.com/spargo-dl/spargo" {
		for _, d := range bi.Deps {
			if d.Path == "github.com/spargo-dl/spargo" {
				v = d.Version
			}
		}
	}
	if v == "" || v == "(devel)" {
		v = "devel"
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				v += " " + s.Value
			}
		}
	}
	return v
}

// Check compares a checkpoint's Meta (saved) with the resuming run's and lists every
// difference; nil when they match. Version is not compared.
func (saved Meta) Check(run Meta) error {
	if run.Canonical != nil {
		saved.Hook = run.Canonical("hook", saved.Hook)
		cfg := make(map[string]string, len(saved.Config))
		for k, v := range saved.Config {
			cfg[k] = run.Canonical(k, v)
		}
		saved.Config = cfg
	}
	var diffs []string
	if saved.Model != run.Model {
		diffs = append(diffs, fmt.Sprintf("model %q, this run %q", saved.Model, run.Model))
	}
	if saved.Hook != run.Hook {
		diffs = append(diffs, fmt.Sprintf("hook %q, this run %q", saved.Hook, run.Hook))
	}
	if saved.World != run.World {
		diffs = append(diffs, fmt.Sprintf("world size %d, this run %d", saved.World, run.World))
	}
	keys := map[string]bool{}
	for k := range saved.Config {
		keys[k] = true
	}
	for k := range run.Config {
		keys[k] = true
	}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		a, inA := saved.Config[k]
		b, inB := run.Config[k]
		switch {
		case !inA:
			diffs = append(diffs, fmt.Sprintf("%s not saved, this run %q", k, b))
		case !inB:
			diffs = append(diffs, fmt.Sprintf("%s %q, this run has none", k, a))
		case a != b:
			diffs = append(diffs, fmt.Sprintf("%s %q, this run %q", k, a, b))
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("saved with %s", strings.Join(diffs, "; "))
	}
	return nil
}
