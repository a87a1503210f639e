package models

import (
	"testing"

	"github.com/spargo-dl/spargo/nn"
)

func TestCatalogNew(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params int
	}{{"vgg16", 14728266}, {"vgg16-cifar100", 14774436}, {"bert-tiny", -1}} {
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
