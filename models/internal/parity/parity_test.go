package parity

// The goldens in testdata/parity are PyTorch's results on cases that spargo exported,
// written by (from the repository root, for each model):
//
//	go run ./models/internal/parity/export -model resnet20 -batch 8 /tmp/parity/resnet20
//	OPENBLAS_NUM_THREADS=1 /usr/bin/python3 scripts/torch_parity.py --family resnet \
//	    --model resnet20 /tmp/parity/resnet20 --golden testdata/parity/resnet20.json
//
// with vgg11 (-batch 4) and resnet18 (-batch 2 -size 64 -seed 2) the same way. ResNet-18's
// golden uses seed 2: on seed 1's case one pre-activation sits within float32 rounding of a
// ReLU's kink, so whether it passes depends on the summation order of the convolution path
// (SPARGO_CONV=im2col passes, the NHWC path flips it and layer3.0.conv1's gradient moves by
// 14 %); seeds 2 and 3 agree with PyTorch's float64 to its own float32 floor on every path. ResNet-50 has no
// golden: on such small random cases its gradients are ill-conditioned in float32 —
// PyTorch's own float32 gradients differ from its float64 ones by up to 15 % of a tensor's
// largest element (batch 2 at 64×64; 11 % at batch 8) — so no float32 implementation meets
// the 1e-3 criterion there; spargo's loss agrees to 1.2e-6 and its gradients are closer to
// float64 than PyTorch's float32 (BENCHMARKS.md, "ResNet parity"). ResNet-34 is well
// conditioned (3e-5).

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestTorchParityGoldens(t *testing.T) {
	files, err := filepath.Glob("../../../testdata/parity/*.json")
	if err != nil || len(files) < 3 {
		t.Fatalf("goldens: %v %v", files, err)
	}
	for _, path := range files {
		name := strings.TrimSuffix(filepath.Base(path), ".json")
		t.Run(name, func(t *testing.T) {
			g, err := LoadGolden(path)
			if err != nil {
				t.Fatal(err)
			}
			if g.Case.Model != name {
				t.Fatalf("%s holds model %s", path, g.Case.Model)
			}
			lossRel, diffs, err := Check(g)
			if err != nil {
				t.Fatal(err)
			}
			worst := Diff{}
			for _, d := range diffs {
				if d.Rel >= worst.Rel {
					worst = d
				}
			}
			t.Logf("%s: loss relative %.2g, largest tensor difference %.2g (%s), %d tensors", name, lossRel, worst.Rel, worst.Name, len(diffs))
		})
	}
}

// Check fails when spargo and the golden disagree: a perturbed gradient sample, and a
// changed weight (the golden's case no longer matches the model's initialisation).
func TestCheckDetectsMismatch(t *testing.T) {
	g, err := LoadGolden("../../../testdata/parity/resnet20.json")
	if err != nil {
		t.Fatal(err)
	}
	s := g.Tensors["grad/layer2.0.conv1.weight"]
	s.Values[0] += 0.01 * s.MaxAbs
	if _, _, err := Check(g); err == nil || !strings.Contains(err.Error(), "grad/layer2.0.conv1.weight") {
		t.Errorf("perturbed gradient: %v", err)
	}
	s.Values[0] -= 0.01 * s.MaxAbs
	g.Case.Seed++
	if _, _, err := Check(g); err == nil || !strings.Contains(err.Error(), "regenerate the golden") {
		t.Errorf("other seed: %v", err)
	}
	g.Case.Seed--
	g.Loss *= 1.001
	if _, _, err := Check(g); err == nil || !strings.Contains(err.Error(), "loss") {
		t.Errorf("loss: %v", err)
	}
}

func TestExportErrors(t *testing.T) {
	for _, c := range []struct {
		c   Case
		msg string
	}{
		{Case{Model: "bert-tiny", Batch: 2}, `no parity check for family "bert"`},
		{Case{Model: "resnet20", Batch: 0}, "batch 0"},
		{Case{Model: "resnet7", Batch: 1}, "unknown model"},
	} {
		if _, err := Export(t.TempDir(), c.c); err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%+v: %v, want an error with %q", c.c, err, c.msg)
		}
	}
}
