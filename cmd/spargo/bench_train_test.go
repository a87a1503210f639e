package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
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
	for _, s := range []string{"cpu " + res.CPUModel, "sgemm peak not measured (-peak 0)", "0.242 GFLOP per image", "no roofline without the peak"} {
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
		{"processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 23\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n\nprocessor\t: 1\ncpu family\t: 25\nmodel\t\t: 17\n", "AMD EPYC (family 23 model 1)"},
		{"processor\t: 0\nmodel name\t:\n", "unknown"},
		{"Processor\t: AArch64 Processor rev 1\n", "unknown"},
		{"", "unknown"},
	} {
		if got := cpuModelFrom(tc.in); got != tc.want {
			t.Errorf("cpuModelFrom(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The models that read tokens: sequences/s and tokens/s instead of images/s, the work per
// sequence, no image fields. The LSTM's work per sequence is known in closed form: per
// word, each of the two layers' gate products 2·4H·(In+H) FLOPs forward (H = In = 200)
// and the decoder's 2·H·V (V = 10,000), three times that with the backward pass (both
// gradients of every product: the embedding lookup is no product), less the gradient of
// the window's initial state, which no gradient crosses into: 2·4H·H per layer and column.
func TestBenchTrainTokens(t *testing.T) {
	run := func(args ...string) (map[string]any, trainResult) {
		t.Helper()
		var out, errb bytes.Buffer
		code := dispatch(append([]string{"bench", "train", "-steps", "1", "-warmup", "0", "-json"}, args...), &out, &errb)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		var raw map[string]any
		var res trainResult
		if err := json.Unmarshal(out.Bytes(), &raw); err != nil {
			t.Fatalf("%v: output is not one JSON object: %v\n%s", args, err, out.String())
		}
		_ = json.Unmarshal(out.Bytes(), &res)
		for _, k := range []string{"images_per_s", "flops_per_image", "dataset"} {
			if _, ok := raw[k]; ok {
				t.Errorf("%v: JSON has the image field %q: %s", args, k, out.String())
			}
		}
		for _, k := range []string{"sequences_per_s", "tokens_per_s", "seq_len", "vocab", "flops_per_sequence", "step_ms", "gflops", "sgemm_peak_gflops"} {
			if _, ok := raw[k]; !ok {
				t.Errorf("%v: JSON lacks %q: %s", args, k, out.String())
			}
		}
		if !(res.SequencesPerS > 0) || res.TokensPerS != res.SequencesPerS*float64(res.SeqLen) {
			t.Errorf("%v: sequences/s %v, tokens/s %v, seq_len %d", args, res.SequencesPerS, res.TokensPerS, res.SeqLen)
		}
		if got, want := res.GFLOPS, res.FLOPsPerSequence*res.SequencesPerS/1e9; got != want {
			t.Errorf("%v: gflops = %v, want flops_per_sequence × sequences_per_s = %v", args, got, want)
		}
		return raw, res
	}

	const h, v, words = 200, 10000, 5
	_, lstm := run("-model", "lstm-ptb-small", "-batch", "2", "-seq", "5", "-peak", "0")
	perWord := 2*2*4*h*(h+h) + 2*h*v
	if want := float64(3*perWord*words - 2*2*4*h*h); lstm.FLOPsPerSequence != want {
		t.Errorf("lstm-ptb-small: flops_per_sequence = %v, want %v", lstm.FLOPsPerSequence, want)
	}
	if lstm.Model != "lstm-ptb-small" || lstm.Batch != 2 || lstm.SeqLen != 5 || lstm.Vocab != v || lstm.Parameters != 4653200 {
		t.Errorf("lstm-ptb-small: %+v", lstm)
	}

	// BERT: the work is that of models.NewTokenStep's step (the same weights and batch).
	_, bert := run("-model", "bert-tiny", "-batch", "2", "-seq", "16", "-vocab", "500", "-peak", "20ms")
	s, err := models.NewTokenStep("bert-tiny", models.TokenStepConfig{Batch: 2, Seq: 16, Vocab: 500}, nn.NewRand(0), nn.NewRand(1))
	if err != nil {
		t.Fatal(err)
	}
	tape := nn.NewTape()
	flops := kernels.CountFLOPs(func() {
		if err := tape.Backward(s.Loss(tape)); err != nil {
			t.Fatal(err)
		}
	})
	if want := float64(flops) / 2; bert.FLOPsPerSequence != want {
		t.Errorf("bert-tiny: flops_per_sequence = %v, want %v", bert.FLOPsPerSequence, want)
	}
	if bert.SeqLen != 16 || bert.Vocab != 500 || !(bert.Roofline > 0) || bert.Roofline != bert.GFLOPS/bert.SgemmPeakGFLOPS {
		t.Errorf("bert-tiny: %+v", bert)
	}

	// lstm-imdb: sequence classification.
	if _, imdb := run("-model", "lstm-imdb", "-batch", "2", "-seq", "4", "-vocab", "100", "-peak", "0"); imdb.Batch != 2 || imdb.SeqLen != 4 {
		t.Errorf("lstm-imdb: %+v", imdb)
	}

	// Text output.
	var out, errb bytes.Buffer
	if code := dispatch([]string{"bench", "train", "-model", "lstm-ptb-small", "-batch", "2", "-seq", "5", "-steps", "1", "-warmup", "0", "-peak", "0"}, &out, &errb); code != 0 {
		t.Fatalf("text: exit %d: %s", code, errb.String())
	}
	for _, s := range []string{"model lstm-ptb-small  batch 2 × 5 tokens  vocab 10000", "sequences/s", "tokens/s", "0.079 GFLOP per sequence", "no roofline without the peak"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("text output lacks %q:\n%s", s, out.String())
		}
	}
}

// -channels-last trains an image classifier channels-last and says so (the
// same work per image); a model that reads tokens refuses it.
func TestBenchTrainChannelsLast(t *testing.T) {
	var out, errb bytes.Buffer
	code := dispatch([]string{"bench", "train", "-model", "resnet20", "-batch", "2", "-steps", "1", "-warmup", "0", "-peak", "0", "-channels-last", "-json"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var res trainResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out.String())
	}
	if !res.ChannelsLast || res.FLOPsPerImage != float64(3*2*40551040-2*442368) || !(res.ImagesPerS > 0) {
		t.Errorf("channels_last %v, flops_per_image %v, images_per_s %v", res.ChannelsLast, res.FLOPsPerImage, res.ImagesPerS)
	}
	out.Reset()
	if code := dispatch([]string{"bench", "train", "-model", "vgg11", "-batch", "2", "-steps", "1", "-warmup", "0", "-peak", "0", "-channels-last"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "channels last") {
		t.Errorf("vgg11 -channels-last: exit %d, output %q", code, out.String())
	}
	errb.Reset()
	if code := dispatch([]string{"bench", "train", "-model", "lstm-ptb-small", "-channels-last"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "-channels-last") || !strings.Contains(errb.String(), "reads tokens") {
		t.Errorf("lstm -channels-last: exit %d, stderr %q", code, errb.String())
	}
}
