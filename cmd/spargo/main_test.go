package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
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
	if code := dispatch([]string{"models"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "vgg16  cifar10       14728266") {
		t.Errorf("models output:\n%s", out.String())
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
	code := dispatch([]string{"bench", "train", "-model", "vgg11", "-batch", "2", "-steps", "2", "-warmup", "1", "-json"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var res map[string]any
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out.String())
	}
	for _, k := range []string{"model", "batch", "images_per_s"} {
		if _, ok := res[k]; !ok {
			t.Errorf("JSON lacks key %q: %s", k, out.String())
		}
	}
	if res["model"] != "vgg11" || res["batch"] != float64(2) || !(res["images_per_s"].(float64) > 0) {
		t.Errorf("unexpected result %s", out.String())
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
		{[]string{"bench", "nosuch"}, `unknown measurement "nosuch"`},
	} {
		var out, errb bytes.Buffer
		if code := dispatch(tc.args, &out, &errb); code != 1 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", tc.args, code, errb.String(), tc.want)
		}
	}
}
