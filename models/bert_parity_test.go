package models

// PyTorch parity through exported weights: spargo writes a BertForPreTraining's weights
// (Hugging Face names) and a fixed batch into a safetensors file; scripts/torch_parity_bert.py
// loads that file into the plain-torch HF-layout BertForPreTraining of
// scripts/gen_bert_goldens.py (strictly: every name must map), computes the loss, logits and
// gradients in float64 with dropout off, and writes them as the golden bert.json. Regenerate
// with (from the repository root):
//
//	go test ./models -run TestBertParityFile -update-parity   # rewrites testdata/parity/bert_tiny.safetensors
//	OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_parity_bert.py \
//	    testdata/parity/bert_tiny.safetensors testdata/goldens/bert.json
//
// TestGoldenBertForPreTraining (CI, no Python) loads the weights from the committed file and
// compares with bert.json; TestTorchParityBertLive writes a fresh file and runs the script
// when /usr/bin/python3 has torch.

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/internal/golden"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
	"github.com/spargo-dl/spargo/safetensors"
)

var updateParity = flag.Bool("update-parity", false, "rewrite testdata/parity/bert_tiny.safetensors")

// parityConfig is the exported model's configuration: small enough for a committed file,
// with 2 layers, 2 heads, padding and both token types; dropout off.
func parityConfig() BertConfig {
	return BertConfig{VocabSize: 40, Hidden: 16, Layers: 2, Heads: 2, Intermediate: 32, MaxPositions: 12, TypeVocabSize: 2,
		LayerNormEps: 1e-12, InitRange: 0.2}
}

// parityBatch is the fixed batch: ids, token types, attention mask (3 × 7, padded with id 0),
// MLM labels (−100 where not predicted) and NSP labels.
type parityBatch struct {
	n, seq                int
	ids, types, mask      []int32
	mlmLabels, nspLabels  []int
	mlmPositions, mlmKept []int // the labelled positions and their labels, for ForwardMaskedLM
}

func newParityBatch(seed uint64, vocab int) parityBatch {
	rng := nn.NewRand(seed)
	b := parityBatch{n: 3, seq: 7}
	b.types = []int32{0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1}
	b.mask = []int32{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0}
	for i, m := range b.mask {
		id := int32(1 + rng.IntN(vocab-1))
		if m == 0 {
			id, b.types[i] = 0, 0
		}
		b.ids = append(b.ids, id)
		label := nn.IgnoreIndex
		if m == 1 && (i%3 == 1 || i == 4) {
			label = rng.IntN(vocab)
			b.mlmPositions = append(b.mlmPositions, i)
			b.mlmKept = append(b.mlmKept, label)
		}
		b.mlmLabels = append(b.mlmLabels, label)
	}
	b.nspLabels = []int{0, 1, 1}
	return b
}

// newParityModel is BERT initialised by spargo from seed, then moved away from the identity-ish
// initialisation so that every path matters: LayerNorm weights 1 + N(0, 0.3²), biases N(0, 0.2²).
func newParityModel(t testing.TB, seed uint64) *BertForPreTraining {
	m, err := NewBertForPreTraining(parityConfig(), nn.NewRand(seed))
	if err != nil {
		t.Fatal(err)
	}
	rng := nn.NewRand(seed + 1)
	for _, p := range nn.Parameters(m) {
		switch {
		case strings.HasSuffix(p.Name, "LayerNorm.weight"):
			nn.Normal(p.Value.Data, 0.3, rng)
			for i := range p.Value.Data {
				p.Value.Data[i]++
			}
		case strings.HasSuffix(p.Name, "bias"):
			nn.Normal(p.Value.Data, 0.2, rng)
		}
	}
	return m
}

// writeParityFile writes m's parameters under their (Hugging Face) names, the batch under
// batch.*, and the configuration as the "config" metadata (gen_bert_goldens.py's keys).
func writeParityFile(t testing.TB, path string, m *BertForPreTraining, b parityBatch) {
	f := safetensors.New()
	f.Metadata["format"] = "pt"
	c := m.Config
	cfg, _ := json.Marshal(map[string]any{"vocab": c.VocabSize, "hidden": c.Hidden, "layers": c.Layers, "heads": c.Heads,
		"intermediate": c.Intermediate, "positions": c.MaxPositions, "types": c.TypeVocabSize, "eps": c.LayerNormEps})
	f.Metadata["config"] = string(cfg)
	for _, p := range nn.Parameters(m) {
		f.Tensors[p.Name] = safetensors.FromFloat32(p.Value.Data, p.Value.Shape...)
	}
	i64 := func(v []int) []int64 {
		out := make([]int64, len(v))
		for i, x := range v {
			out[i] = int64(x)
		}
		return out
	}
	i32to := func(v []int32) []int {
		out := make([]int, len(v))
		for i, x := range v {
			out[i] = int(x)
		}
		return out
	}
	f.Tensors["batch.input_ids"] = safetensors.FromInt64(i64(i32to(b.ids)), b.n, b.seq)
	f.Tensors["batch.token_type_ids"] = safetensors.FromInt64(i64(i32to(b.types)), b.n, b.seq)
	f.Tensors["batch.attention_mask"] = safetensors.FromInt64(i64(i32to(b.mask)), b.n, b.seq)
	f.Tensors["batch.mlm_labels"] = safetensors.FromInt64(i64(b.mlmLabels), b.n, b.seq)
	f.Tensors["batch.nsp_labels"] = safetensors.FromInt64(i64(b.nspLabels), b.n)
	if err := f.WriteFile(path); err != nil {
		t.Fatal(err)
	}
}

// readParityFile builds the model the file describes and loads its weights by name: every
// parameter of the model must be in the file and every tensor of the file (but the batch)
// must be a parameter, with the same shape.
func readParityFile(t testing.TB, path string) (*BertForPreTraining, parityBatch) {
	t.Helper()
	f, err := safetensors.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]float64
	if err := json.Unmarshal([]byte(f.Metadata["config"]), &c); err != nil {
		t.Fatalf("%s: config metadata: %v", path, err)
	}
	cfg := BertConfig{VocabSize: int(c["vocab"]), Hidden: int(c["hidden"]), Layers: int(c["layers"]), Heads: int(c["heads"]),
		Intermediate: int(c["intermediate"]), MaxPositions: int(c["positions"]), TypeVocabSize: int(c["types"]), LayerNormEps: c["eps"]}
	m, err := NewBertForPreTraining(cfg, nn.NewRand(0))
	if err != nil {
		t.Fatal(err)
	}
	params := map[string]*nn.Param{}
	for _, p := range nn.Parameters(m) {
		params[p.Name] = p
		v, err := f.Float32(p.Name)
		if err != nil {
			t.Fatalf("%s: parameter %s: %v", path, p.Name, err)
		}
		if fmt.Sprint(f.Tensors[p.Name].Shape) != fmt.Sprint(p.Value.Shape) {
			t.Fatalf("%s: %s has shape %v, the model's %v", path, p.Name, f.Tensors[p.Name].Shape, p.Value.Shape)
		}
		copy(p.Value.Data, v)
	}
	ints := func(name string) []int {
		v, err := f.Tensors[name].Int64()
		if err != nil {
			t.Fatalf("%s: %s: %v", path, name, err)
		}
		out := make([]int, len(v))
		for i, x := range v {
			out[i] = int(x)
		}
		return out
	}
	int32s := func(name string) []int32 {
		out := []int32{}
		for _, x := range ints(name) {
			out = append(out, int32(x))
		}
		return out
	}
	for _, name := range f.Names() {
		if _, ok := params[name]; !ok && !strings.HasPrefix(name, "batch.") {
			t.Fatalf("%s: tensor %s is not a parameter of the model", path, name)
		}
	}
	shape := f.Tensors["batch.input_ids"].Shape
	b := parityBatch{n: shape[0], seq: shape[1], ids: int32s("batch.input_ids"), types: int32s("batch.token_type_ids"),
		mask: int32s("batch.attention_mask"), mlmLabels: ints("batch.mlm_labels"), nspLabels: ints("batch.nsp_labels")}
	for i, l := range b.mlmLabels {
		if l != nn.IgnoreIndex {
			b.mlmPositions, b.mlmKept = append(b.mlmPositions, i), append(b.mlmKept, l)
		}
	}
	return m, b
}

// checkAgainstTorch runs the model on the batch (all positions, then only the masked ones
// through ForwardMaskedLM) and compares the loss (1e-4 relative), the logits and every
// gradient (1e-3 relative) with PyTorch's, then five AdamW steps' losses.
func checkAgainstTorch(t *testing.T, m *BertForPreTraining, b parityBatch, c *golden.Case) {
	t.Helper()
	nn.SetTraining(m, false) // dropout off, as in the script
	ps := nn.Parameters(m)
	for _, masked := range []bool{false, true} {
		nn.ZeroGrad(ps)
		tape := nn.NewTape()
		var mlm, nsp, loss *nn.Var
		if masked {
			mlm, nsp = m.ForwardMaskedLM(tape, b.ids, b.types, b.mask, b.n, b.seq, b.mlmPositions)
			loss = m.Loss(mlm, nsp, b.mlmKept, b.nspLabels)
		} else {
			mlm, nsp = m.ForwardPreTraining(tape, b.ids, b.types, b.mask, b.n, b.seq)
			loss = m.Loss(mlm, nsp, b.mlmLabels, b.nspLabels)
		}
		if err := tape.Backward(loss); err != nil {
			t.Fatal(err)
		}
		what := map[bool]string{false: "all positions", true: "masked positions"}[masked]
		golden.AssertClose(t, what+": loss", loss.Value.Data, c.Outputs["loss"].Data, 0, 1e-4)
		if !masked {
			golden.AssertArrayClose(t, "mlm logits", mlm.Shape(), mlm.Value.Data, c.Outputs["mlm_logits"], 1e-5, 1e-4)
		}
		golden.AssertArrayClose(t, what+": nsp logits", nsp.Shape(), nsp.Value.Data, c.Outputs["nsp_logits"], 1e-5, 1e-4)
		if len(c.Grads) != len(ps) {
			t.Fatalf("PyTorch has %d gradients, spargo %d parameters", len(c.Grads), len(ps))
		}
		for _, p := range ps {
			want, ok := c.Grads[p.Name]
			if !ok {
				t.Fatalf("no PyTorch gradient for %s", p.Name)
			}
			golden.AssertArrayClose(t, what+": grad "+p.Name, p.Grad.Shape, p.Grad.Data, want, 1e-6, 1e-3)
		}
	}
	// Five AdamW steps (lr 1e-2, wd 0.01, BERT's no-decay groups) from the same weights: the
	// loss before each step, 1e-4 relative. The model is left trained.
	opt, err := optim.ParseOptimizer("adamw:wd=0.01,no_decay=true", ps, 1e-2)
	if err != nil {
		t.Fatal(err)
	}
	want := c.Outputs["adamw_losses"].Data
	got := make([]float32, len(want))
	for s := range got {
		nn.ZeroGrad(ps)
		tape := nn.NewTape()
		mlm, nsp := m.ForwardMaskedLM(tape, b.ids, b.types, b.mask, b.n, b.seq, b.mlmPositions)
		loss := m.Loss(mlm, nsp, b.mlmKept, b.nspLabels)
		if err := tape.Backward(loss); err != nil {
			t.Fatal(err)
		}
		opt.Step()
		got[s] = loss.Item()
	}
	golden.AssertClose(t, "AdamW step losses", got, want, 0, 1e-4)
}

func parityFile(t testing.TB) string {
	root, err := golden.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "testdata", "parity", "bert_tiny.safetensors")
}

// The committed weights file is what spargo writes for its model: reading it and writing the
// model back gives the same bytes (-update-parity rewrites it from the seed).
func TestBertParityFile(t *testing.T) {
	path := parityFile(t)
	if *updateParity {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		writeParityFile(t, path, newParityModel(t, 2000), newParityBatch(2001, parityConfig().VocabSize))
	}
	m, b := readParityFile(t, path)
	again := filepath.Join(t.TempDir(), "again.safetensors")
	writeParityFile(t, again, m, b)
	x, _ := os.ReadFile(path)
	y, _ := os.ReadFile(again)
	if !bytes.Equal(x, y) {
		t.Fatalf("writing the model read from %s gives another file (%d vs %d bytes)", path, len(y), len(x))
	}
}

// The whole tiny BertForPreTraining against PyTorch, the weights travelling through spargo's
// safetensors file: loss to 1e-4 relative, logits and every gradient to 1e-3 relative, for
// the full MLM head and for the head at the masked positions only.
func TestGoldenBertForPreTraining(t *testing.T) {
	c, err := golden.MustLoad(t, "bert").Case("bert_tiny_pretraining")
	if err != nil {
		t.Fatal(err)
	}
	m, b := readParityFile(t, parityFile(t))
	checkAgainstTorch(t, m, b, c)
}

// The parity script on a file written now (another seed): needs /usr/bin/python3 with torch,
// skipped without it and in -short mode (CI uses the committed golden above).
func TestTorchParityBertLive(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped in -short mode: starts PyTorch")
	}
	const python = "/usr/bin/python3"
	if out, err := exec.Command(python, "-c", "import torch").CombinedOutput(); err != nil {
		t.Skipf("skipped: %s cannot import torch (%v): %s", python, err, out)
	}
	root, _ := golden.RepoRoot()
	dir := t.TempDir()
	weights, out := filepath.Join(dir, "bert.safetensors"), filepath.Join(dir, "bert.json")
	m := newParityModel(t, 77)
	b := newParityBatch(78, m.Config.VocabSize)
	writeParityFile(t, weights, m, b)
	cmd := exec.Command(python, filepath.Join(root, "scripts", "torch_parity_bert.py"), weights, out)
	cmd.Env = append(os.Environ(), "OPENBLAS_NUM_THREADS=1")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("torch_parity_bert.py: %v\n%s", err, msg)
	}
	f, err := golden.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	c, err := f.Case("bert_tiny_pretraining")
	if err != nil {
		t.Fatal(err)
	}
	checkAgainstTorch(t, m, b, c)
}
