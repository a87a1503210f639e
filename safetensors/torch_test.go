package safetensors

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// PyTorch 1.13 (Debian's python3-torch, /usr/bin/python3) loads a file spargo wrote with
// nothing but json and torch.frombuffer (scripts/read_safetensors.py): same names, dtypes,
// shapes and values. Run by hand:
//
//	/usr/bin/python3 scripts/read_safetensors.py --dump FILE
func TestPyTorchReadsSpargoFile(t *testing.T) {
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skipf("skipped: %s is absent, so PyTorch cannot check the file (%v)", python, err)
	}
	if out, err := exec.Command(python, "-c", "import torch").CombinedOutput(); err != nil {
		t.Skipf("skipped: %s has no torch module (install python3-torch): %v\n%s", python, err, out)
	}
	f := New()
	f.Metadata["format"] = "pt"
	f.Metadata["spargo"] = "test"
	w := make([]float32, 2*3*3*3)
	for i := range w {
		w[i] = float32(math.Sin(float64(i))) * 1e-3
	}
	f.Tensors["features.0.weight"] = FromFloat32(w, 2, 3, 3, 3)
	f.Tensors["features.1.running_var"] = FromFloat32([]float32{1, 0.5})
	f.Tensors["calls"] = FromInt64([]int64{-3, 1 << 50})
	f.Tensors["idx"] = FromInt32([]int32{5, -1})
	f.Tensors["rng"] = FromBytes([]byte{0, 255, 7})
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if err := f.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(python, "../scripts/read_safetensors.py", "--dump", path).Output()
	if err != nil {
		t.Fatalf("read_safetensors.py: %v", err)
	}
	var got struct {
		Metadata map[string]string
		Tensors  map[string]struct {
			DType  string    `json:"dtype"`
			Shape  []int     `json:"shape"`
			Values []float64 `json:"values"`
		}
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got.Metadata["spargo"] != "test" || len(got.Tensors) != len(f.Tensors) {
		t.Fatalf("metadata %v, %d tensors", got.Metadata, len(got.Tensors))
	}
	torchType := map[DType]string{F32: "float32", I64: "int64", I32: "int32", U8: "uint8"}
	for name, want := range f.Tensors {
		g, ok := got.Tensors[name]
		if !ok {
			t.Fatalf("PyTorch has no %q", name)
		}
		if g.DType != torchType[want.DType] || !slices.Equal(g.Shape, want.Shape) {
			t.Errorf("%s: PyTorch sees %s %v, want %s %v", name, g.DType, g.Shape, want.DType, want.Shape)
		}
		var wv []float64
		switch want.DType {
		case F32:
			v, _ := want.Float32()
			for _, x := range v {
				wv = append(wv, float64(x))
			}
		case I64:
			v, _ := want.Int64()
			for _, x := range v {
				wv = append(wv, float64(x))
			}
		case I32:
			v, _ := want.Int32()
			for _, x := range v {
				wv = append(wv, float64(x))
			}
		case U8:
			for _, x := range want.Data {
				wv = append(wv, float64(x))
			}
		}
		if !slices.Equal(g.Values, wv) {
			t.Errorf("%s: PyTorch reads %v, want %v", name, g.Values, wv)
		}
	}
}
