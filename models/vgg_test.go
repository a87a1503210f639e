package models

import (
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/nn"
)

func TestVGGParameterCounts(t *testing.T) {
	cases := []struct {
		name string
		ds   Dataset
		want int
	}{
		{"vgg11", CIFAR10, 9231114},
		{"vgg13", CIFAR10, 9416010},
		{"vgg16", CIFAR10, 14728266},
		{"vgg19", CIFAR10, 20040522},
		{"vgg19", CIFAR100, 20086692},
	}
	for _, c := range cases {
		m, err := NewVGG(c.name, c.ds, nn.NewRand(0))
		if err != nil {
			t.Fatal(err)
		}
		if got := nn.NumParams(nn.Parameters(m)); got != c.want {
			t.Errorf("%s %s: %d parameters, want %d", c.name, c.ds.Name, got, c.want)
		}
	}
}

func TestVGGNamesAndForward(t *testing.T) {
	m, err := NewVGG("vgg11", CIFAR10, nn.NewRand(1))
	if err != nil {
		t.Fatal(err)
	}
	ps := nn.Parameters(m)
	if ps[0].Name != "features.0.weight" || ps[2].Name != "features.1.weight" || ps[len(ps)-1].Name != "classifier.bias" {
		t.Fatalf("names: %s, %s, %s", ps[0].Name, ps[2].Name, ps[len(ps)-1].Name)
	}
	tape := nn.NewTape()
	x := nn.NewTensor(2, 3, 32, 32)
	y := m.Forward(tape.Const(x))
	if err := tape.Err(); err != nil {
		t.Fatal(err)
	}
	if y.Value.Shape[0] != 2 || y.Value.Shape[1] != 10 {
		t.Fatalf("logits shape %v", y.Value.Shape)
	}
	if _, err := NewVGG("vgg12", CIFAR10, nn.NewRand(0)); err == nil || !strings.Contains(err.Error(), "vgg11, vgg13, vgg16, vgg19") {
		t.Fatalf("unknown model error: %v", err)
	}
}

// Same seed, same model: replicas built independently start identical.
func TestVGGDeterministicInit(t *testing.T) {
	a, _ := NewVGG("vgg11", CIFAR10, nn.NewRand(42))
	b, _ := NewVGG("vgg11", CIFAR10, nn.NewRand(42))
	pa, pb := nn.Parameters(a), nn.Parameters(b)
	for i := range pa {
		for j := range pa[i].Value.Data {
			if pa[i].Value.Data[j] != pb[i].Value.Data[j] {
				t.Fatalf("%s differs at %d", pa[i].Name, j)
			}
		}
	}
}
