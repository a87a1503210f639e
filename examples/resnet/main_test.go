package main

import (
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
)

// The program builds its models through the catalogue: every CIFAR ResNet (and the VGGs)
// for CIFAR-10, the CIFAR-100 variant for CIFAR-100, and a clear error for ImageNet models.
func TestNewModelFromCatalogue(t *testing.T) {
	for _, name := range append(models.CIFARResNetNames()[:2], "vgg11") {
		m, err := newModel(name, models.CIFAR10, nn.NewRand(0))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want, _ := models.New(name, nn.NewRand(0))
		if got, w := nn.NumParams(nn.Parameters(m)), nn.NumParams(nn.Parameters(want)); got != w {
			t.Errorf("%s: %d parameters, the catalogue's has %d", name, got, w)
		}
	}
	m, err := newModel("resnet20", models.CIFAR100, nn.NewRand(0))
	if err != nil || nn.NumParams(nn.Parameters(m)) != 275572 {
		t.Errorf("resnet20 for CIFAR-100: %v", err)
	}
	if _, err := newModel("resnet18", models.CIFAR10, nn.NewRand(0)); err == nil || !strings.Contains(err.Error(), "imagenet") {
		t.Errorf("resnet18 on CIFAR-10: %v", err)
	}
	if d := defaults(); d.Model != "resnet20" || d.NewModel == nil {
		t.Errorf("defaults: %+v", d)
	}
}
