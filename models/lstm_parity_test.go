package models

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/safetensors"
)

// PyTorch parity through exported weights: spargo writes an LSTM language model's weights,
// a batch and its own loss and gradients (two bptt windows, the state carried detached) to
// a safetensors file; scripts/torch_lstm_parity.py loads the weights into
// word_language_model's RNNModel and checks the loss (1e-4 relative) and the gradients (1e-3).
//
//	/usr/bin/python3 scripts/torch_lstm_parity.py FILE.safetensors
func TestLSTMLMPyTorchParity(t *testing.T) {
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skipf("skipped: %s is absent, so PyTorch cannot check the model (%v)", python, err)
	}
	if out, err := exec.Command(python, "-c", "import torch").CombinedOutput(); err != nil {
		t.Skipf("skipped: %s has no torch module (install python3-torch): %v\n%s", python, err, out)
	}
	const vocab, bptt, n = 37, 5, 3
	m, err := NewLSTMLM(LSTMLMConfig{Vocab: vocab, Embed: 8, Hidden: 12, Layers: 2}, nn.NewRand(7))
	if err != nil {
		t.Fatal(err)
	}
	rng := nn.NewRand(8)
	ids := make([]int32, (2*bptt+1)*n)
	for i := range ids {
		ids[i] = int32(rng.IntN(vocab))
	}
	m.State = m.NewState(n)
	var loss *nn.Var
	for w := 0; w < 2; w++ {
		tape := nn.NewTape()
		x := nn.NewTensor(bptt, n)
		labels := make([]int, bptt*n)
		for i := range labels {
			x.Data[i] = float32(ids[w*bptt*n+i])
			labels[i] = int(ids[(w*bptt+1)*n+i])
		}
		nn.ZeroGrad(nn.Parameters(m))
		loss = nn.CrossEntropy(m.Forward(tape.Const(x)), labels)
		if err := tape.Backward(loss); err != nil {
			t.Fatal(err)
		}
	}
	f := safetensors.New()
	f.Metadata["bptt"] = strconv.Itoa(bptt)
	f.Tensors["ids"] = safetensors.FromInt32(ids, 2*bptt+1, n)
	f.Tensors["spargo.loss"] = safetensors.FromFloat32([]float32{loss.Item()})
	for _, p := range nn.Parameters(m) {
		f.Tensors[p.Name] = safetensors.FromFloat32(p.Value.Data, p.Value.Shape...)
		f.Tensors["spargo.grad."+p.Name] = safetensors.FromFloat32(p.Grad.Data, p.Grad.Shape...)
	}
	path := filepath.Join(t.TempDir(), "lstm.safetensors")
	if err := f.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(python, "../scripts/torch_lstm_parity.py", path).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "parity ok") {
		t.Fatalf("PyTorch disagrees: %v\n%s", err, out)
	}
	t.Log(strings.TrimSpace(string(out)))
}
