package main

import (
	"bytes"
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
