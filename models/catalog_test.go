package models

import (
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/nn"
)

func TestCatalogNew(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params int
	}{{"vgg16", 14728266}, {"vgg16-cifar100", 14774436}, {"bert-tiny", -1},
		{"resnet20", 269722}, {"resnet20-cifar100", 275572}, {"resnet18", 11689512}} {
		m, err := New(tc.name, nn.NewRand(0))
		if err != nil {
			t.Fatalf("New(%q): %v", tc.name, err)
		}
		if n := nn.NumParams(nn.Parameters(m)); tc.params >= 0 && n != tc.params {
			t.Errorf("%s: %d parameters, want %d", tc.name, n, tc.params)
		}
	}
	if _, err := New("vgg17", nn.NewRand(0)); err == nil {
		t.Error("New(vgg17) succeeded")
	}
	seen := map[string]bool{}
	for _, e := range Catalog() {
		if seen[e.Name] || e.Family == "" || e.Summary == "" || e.Build == nil {
			t.Errorf("bad or duplicate entry %+v", e)
		}
		seen[e.Name] = true
	}
}

func TestLookupImage(t *testing.T) {
	for _, tc := range []struct{ name, want string }{{"resnet20", "resnet20"}, {"vgg11", "vgg11-cifar100"}, {"resnet56", "resnet56-cifar100"}} {
		ds := CIFAR10
		if tc.want != tc.name {
			ds = CIFAR100
		}
		e, err := LookupImage(tc.name, ds)
		if err != nil || e.Name != tc.want || e.Input != ds {
			t.Errorf("LookupImage(%s, %s) = %s, %v; want %s", tc.name, ds.Name, e.Name, err, tc.want)
		}
	}
	for _, tc := range []struct{ name, msg string }{{"resnet18", "built for imagenet"}, {"bert-tiny", "not an image classifier"}, {"resnet7", "unknown model"}} {
		if _, err := LookupImage(tc.name, CIFAR10); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("LookupImage(%s): %v, want an error with %q", tc.name, err, tc.msg)
		}
	}
}
