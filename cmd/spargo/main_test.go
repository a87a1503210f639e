package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/models"
)

func TestHooksCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := dispatch([]string{"hooks"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"allreduce", "algorithm", "default auto"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("spargo hooks lacks %q:\n%s", want, out.String())
		}
	}
}

func TestModelsCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := dispatch([]string{"models", "vgg16", "resnet20"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"vgg16                vgg         14728266      54", "resnet20             resnet        269722      59"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("models output lacks %q:\n%s", want, out.String())
		}
	}
	if code := dispatch([]string{"models", "resnet7"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), `"resnet7" is neither a model nor a family`) {
		t.Errorf("unknown model: exit %d, stderr %q", code, errb.String())
	}
}

// -json prints an array of objects with name and params. Arguments select by name or family;
// none selects the whole catalogue (checked through selectModels: building every model
// takes tens of seconds).
func TestModelsJSON(t *testing.T) {
	var out, errb bytes.Buffer
	if code := dispatch([]string{"models", "-json", "resnet20", "resnet20-cifar100", "resnet18", "vgg11"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var got []map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("not a JSON array: %v\n%s", err, out.String())
	}
	params := map[string]float64{}
	for _, m := range got {
		name, _ := m["name"].(string)
		p, ok := m["params"].(float64)
		if name == "" || !ok {
			t.Fatalf("object without name or params: %v", m)
		}
		params[name] = p
	}
	want := map[string]float64{"vgg11": 9231114, "resnet20": 269722, "resnet20-cifar100": 275572, "resnet18": 11689512}
	for name, p := range want {
		if params[name] != p {
			t.Errorf("%s: params %v, want %v", name, params[name], p)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d models listed: %v", len(got), params)
	}
	all, err := selectModels(nil)
	if err != nil || len(all) != len(models.Names()) {
		t.Errorf("no arguments select %d of %d models (%v)", len(all), len(models.Names()), err)
	}
	fam, err := selectModels([]string{"resnet", "vgg11"})
	if n := 2*len(models.CIFARResNetNames()) + len(models.ImageNetResNetNames()) + 1; err != nil || len(fam) != n {
		t.Errorf("resnet vgg11 select %d models, want %d (%v)", len(fam), n, err)
	}
}

func TestUnknownCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := dispatch([]string{"frobnicate"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `unknown command "frobnicate"`) {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
}

func TestBenchTrainJSON(t *testing.T) {
	var out, errb bytes.Buffer
	code := dispatch([]string{"bench", "train", "-model", "vgg11", "-batch", "2", "-steps", "2", "-warmup", "1", "-peak", "0", "-json"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var res map[string]any
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out.String())
	}
	// The image models' object keeps its fields (scripts parse them); the token fields
	// stay out, as roofline does with -peak 0.
	want := []string{"model", "batch", "images_per_s", "step_ms", "steps_ms", "warmup", "threads", "kernels",
		"parameters", "dataset", "cpu_model", "sgemm_peak_gflops", "flops_per_image", "gflops"}
	for _, k := range want {
		if _, ok := res[k]; !ok {
			t.Errorf("JSON lacks key %q: %s", k, out.String())
		}
	}
	if len(res) != len(want) {
		t.Errorf("JSON has %d keys, want %d (%v): %s", len(res), len(want), want, out.String())
	}
	if res["model"] != "vgg11" || res["batch"] != float64(2) || !(res["images_per_s"].(float64) > 0) {
		t.Errorf("unexpected result %s", out.String())
	}
}

// Catalogue models other than VGG: a CIFAR-100 ResNet-20, and ResNet-18 at a small -size.
func TestBenchTrainResNet(t *testing.T) {
	for _, args := range [][]string{{"-model", "resnet20", "-dataset", "cifar100"}, {"-model", "resnet18", "-size", "32"}} {
		var out, errb bytes.Buffer
		code := dispatch(append([]string{"bench", "train", "-batch", "2", "-steps", "1", "-warmup", "0", "-peak", "0", "-json"}, args...), &out, &errb)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		var res map[string]any
		if err := json.Unmarshal(out.Bytes(), &res); err != nil || !(res["images_per_s"].(float64) > 0) {
			t.Errorf("%v: %v %s", args, err, out.String())
		}
		if want := args[1]; res["model"] != want && res["model"] != want+"-cifar100" {
			t.Errorf("%v: model %v", args, res["model"])
		}
	}
}

func TestBenchTrainErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "train", "-model", "vgg7"}, "vgg7"},
		{[]string{"bench", "train", "-batch", "0"}, "-batch 0"},
		{[]string{"bench", "train", "-dataset", "mnist"}, `-dataset "mnist"`},
		{[]string{"bench", "train", "-model", "bert-tiny", "-dataset", "cifar10"}, "-dataset cifar10: -model bert-tiny reads tokens"},
		{[]string{"bench", "train", "-model", "lstm-ptb-small", "-size", "32"}, "-size 32: -model lstm-ptb-small reads tokens"},
		{[]string{"bench", "train", "-model", "resnet20", "-seq", "35"}, "-seq 35: -model resnet20 is an image classifier"},
		{[]string{"bench", "train", "-model", "vgg11", "-vocab", "100"}, "-vocab 100: -model vgg11 is an image classifier"},
		{[]string{"bench", "train", "-model", "bert-tiny", "-seq", "0"}, "-seq 0: want at least 1"},
		{[]string{"bench", "train", "-model", "lstm-ptb", "-vocab", "-3"}, "-vocab -3: want at least 1"},
		{[]string{"bench", "train", "-model", "lstm-ptb-small", "-batch", "0"}, "-batch 0: want at least 1"},
		{[]string{"bench", "train", "-model", "bert-base", "-seq", "513", "-peak", "0"}, "-seq 513: models: bert-base: seq 513: above the model's 512 positions"},
		{[]string{"bench", "train", "-model", "bert-tiny", "-seq", "3", "-peak", "0"}, "-seq 3: models: bert-tiny: seq 3: want at least 4"},
		{[]string{"bench", "train", "-model", "bert-tiny", "-vocab", "5", "-peak", "0"}, "-vocab 5: models: bert-tiny: vocab 5: want more than 5"},
		{[]string{"bench", "train", "-model", "lstm-imdb", "-vocab", "1", "-peak", "0"}, "-vocab 1: models: lstm-imdb: vocab 1: want at least 2"},
		{[]string{"bench", "train", "-model", "resnet18", "-dataset", "cifar10"}, "built for imagenet"},
		{[]string{"bench", "train", "-model", "vgg11", "-size", "64", "-steps", "1", "-warmup", "0", "-batch", "1"}, "nn.Linear"},
		{[]string{"bench", "nosuch"}, `unknown measurement "nosuch"`},
	} {
		var out, errb bytes.Buffer
		if code := dispatch(tc.args, &out, &errb); code != 1 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", tc.args, code, errb.String(), tc.want)
		}
	}
}
