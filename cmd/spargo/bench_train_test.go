package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// The machine and roofline fields of bench train's JSON and text output
// (their presence and consistency, not their speed). ResNet-20's work per
// image is known in closed form: forward multiply-adds 40,551,040 (conv1
// 442,368; six 16→16 convolutions on 32×32 maps, 2,359,296 each; the 16→32
// stride-2 convolution 1,179,648 and five 32→32 ones 2,359,296 each; the
// same for 64 channels; the 64→10 classifier 640). Backward adds the weight
// gradient and the input gradient of every layer except the first
// convolution (its input needs none): 3·2·40,551,040 − 2·442,368 FLOPs.
func TestBenchTrainRoofline(t *testing.T) {
	var out, errb bytes.Buffer
	code := dispatch([]string{"bench", "train", "-model", "resnet20", "-batch", "2", "-steps", "2", "-warmup", "0", "-peak", "20ms", "-json"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var res trainResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out.String())
	}
	if res.CPUModel == "" {
		t.Errorf("cpu_model is empty: %s", out.String())
	}
	if want := float64(3*2*40551040 - 2*442368); res.FLOPsPerImage != want {
		t.Errorf("flops_per_image = %v, want %v", res.FLOPsPerImage, want)
	}
	if !(res.SgemmPeakGFLOPS > 0) || !(res.GFLOPS > 0) || !(res.Roofline > 0) {
		t.Errorf("peak %v, GFLOP/s %v, roofline %v: want all positive", res.SgemmPeakGFLOPS, res.GFLOPS, res.Roofline)
	}
	if got, want := res.GFLOPS, res.FLOPsPerImage*res.ImagesPerS/1e9; got != want {
		t.Errorf("gflops = %v, want flops_per_image × images_per_s = %v", got, want)
	}
	if got, want := res.Roofline, res.GFLOPS/res.SgemmPeakGFLOPS; got != want {
		t.Errorf("roofline = %v, want gflops / sgemm_peak_gflops = %v", got, want)
	}

	// -peak 0 skips the SGEMM: no peak, no roofline, the work still counted.
	out.Reset()
	code = dispatch([]string{"bench", "train", "-model", "resnet20", "-batch", "2", "-steps", "1", "-warmup", "0", "-peak", "0"}, &out, &errb)
	if code != 0 {
		t.Fatalf("-peak 0: exit %d: %s", code, errb.String())
	}
	for _, s := range []string{"cpu " + res.CPUModel, "sgemm peak 0.0 GFLOP/s", "0.242 GFLOP per image", "roofline 0.000"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("-peak 0 text output lacks %q:\n%s", s, out.String())
		}
	}

	errb.Reset()
	if code := dispatch([]string{"bench", "train", "-peak", "-1s"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "-peak -1s") {
		t.Errorf("-peak -1s: exit %d, stderr %q", code, errb.String())
	}
}

func TestCPUModelFrom(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t: fpu\n\nprocessor\t: 1\nmodel name\t: other\n", "Intel(R) Xeon(R) Platinum 8480+"},
		{"model name\t: AMD EPYC 9654 96-Core Processor", "AMD EPYC 9654 96-Core Processor"},
		{"processor\t: 0\nmodel name\t:\n", "unknown"},
		{"Processor\t: AArch64 Processor rev 1\n", "unknown"},
		{"", "unknown"},
	} {
		if got := cpuModelFrom(tc.in); got != tc.want {
			t.Errorf("cpuModelFrom(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
