package models

import (
	"fmt"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/nn"
)

// Parameter counts of the reference definitions: He et al.'s CIFAR ResNets as in
// akamaster/pytorch_resnet_cifar10 (ResNet-20: 0.27M) and torchvision's resnet18/34/50
// (sum(p.numel() for p in torchvision.models.resnetXX().parameters())); scripts/torch_models.py
// builds the same definitions and prints the same counts (resnet34: 21,797,672).
func TestResNetParameterCounts(t *testing.T) {
	cases := []struct {
		name    string
		ds      Dataset
		want    int
		tensors int
	}{
		{"resnet20", CIFAR10, 269722, 59},
		{"resnet20", CIFAR100, 275572, 59},
		{"resnet32", CIFAR10, 464154, 0},
		{"resnet44", CIFAR10, 658586, 0},
		{"resnet56", CIFAR10, 853018, 0},
		{"resnet110", CIFAR10, 1727962, 0},
		{"resnet18", ImageNet, 11689512, 62},
		{"resnet50", ImageNet, 25557032, 161},
	}
	for _, c := range cases {
		m, err := NewResNet(c.name, c.ds, nn.NewRand(0))
		if err != nil {
			t.Fatal(err)
		}
		ps := nn.Parameters(m)
		if got := nn.NumParams(ps); got != c.want {
			t.Errorf("%s %s: %d parameters, want %d", c.name, c.ds.Name, got, c.want)
		}
		if c.tensors > 0 && len(ps) != c.tensors {
			t.Errorf("%s %s: %d tensors, want %d", c.name, c.ds.Name, len(ps), c.tensors)
		}
	}
}

// The names are PyTorch's: akamaster's for the CIFAR layout, torchvision's for ImageNet.
func TestResNetNames(t *testing.T) {
	has := func(m nn.Module, want ...string) {
		t.Helper()
		names := map[string]bool{}
		for _, p := range nn.Parameters(m) {
			names[p.Name] = true
		}
		for _, b := range nn.Buffers(m) {
			names[b.Name] = true
		}
		for _, w := range want {
			if !names[w] {
				t.Errorf("no tensor %q", w)
			}
		}
	}
	r20, _ := NewResNet("resnet20", CIFAR10, nn.NewRand(0))
	has(r20, "conv1.weight", "bn1.running_var", "layer1.0.conv1.weight", "layer2.0.bn2.bias", "layer3.2.conv2.weight", "linear.weight", "linear.bias")
	r18, _ := NewResNet("resnet18", ImageNet, nn.NewRand(0))
	has(r18, "conv1.weight", "bn1.num_batches_tracked", "layer1.1.conv2.weight", "layer2.0.downsample.0.weight", "layer2.0.downsample.1.running_mean", "layer4.1.bn2.weight", "fc.weight", "fc.bias")
	r50, _ := NewResNet("resnet50", ImageNet, nn.NewRand(0))
	has(r50, "layer1.0.downsample.0.weight", "layer1.0.conv3.weight", "layer1.0.bn3.weight", "layer3.5.conv2.weight", "layer4.2.bn3.running_var", "fc.weight")
	ps := nn.Parameters(r20)
	if ps[0].Name != "conv1.weight" || ps[len(ps)-1].Name != "linear.bias" {
		t.Errorf("order: first %s, last %s", ps[0].Name, ps[len(ps)-1].Name)
	}
}

func TestResNetForwardShapes(t *testing.T) {
	for _, c := range []struct {
		name string
		ds   Dataset
		in   []int
	}{
		{"resnet20", CIFAR100, []int{2, 3, 32, 32}},
		{"resnet18", Dataset{Name: "small", Classes: 7, Channels: 3, Size: 64}, []int{2, 3, 64, 64}},
		{"resnet50", Dataset{Name: "tiny", Classes: 5, Channels: 3, Size: 32}, []int{2, 3, 32, 32}},
	} {
		m, err := NewResNet(c.name, c.ds, nn.NewRand(1))
		if err != nil {
			t.Fatal(err)
		}
		tape := nn.NewTape()
		x := nn.NewTensor(c.in...)
		for i := range x.Data {
			x.Data[i] = float32(i%13) / 13
		}
		y := m.Forward(tape.Const(x))
		if err := tape.Err(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if y.Value.Shape[0] != c.in[0] || y.Value.Shape[1] != c.ds.Classes {
			t.Errorf("%s: logits shape %v", c.name, y.Value.Shape)
		}
	}
}

func TestResNetErrors(t *testing.T) {
	if _, err := NewResNet("resnet21", CIFAR10, nn.NewRand(0)); err == nil || !strings.Contains(err.Error(), "resnet20, resnet32") {
		t.Errorf("unknown depth: %v", err)
	}
	if _, err := NewResNet("resnet20", ImageNet, nn.NewRand(0)); err == nil || !strings.Contains(err.Error(), "32×32") {
		t.Errorf("CIFAR ResNet on ImageNet: %v", err)
	}
	m, _ := NewResNet("resnet20", CIFAR10, nn.NewRand(0))
	tape := nn.NewTape()
	m.Forward(tape.Const(nn.NewTensor(1, 1, 32, 32)))
	if err := tape.Err(); err == nil || !strings.Contains(err.Error(), "Conv2d") {
		t.Errorf("1-channel input: %v", err)
	}
}

func ExampleNewResNet() {
	m, err := NewResNet("resnet20", CIFAR10, nn.NewRand(0))
	if err != nil {
		panic(err)
	}
	ps := nn.Parameters(m)
	fmt.Println(nn.NumParams(ps), ps[0].Name, ps[len(ps)-1].Name)
	// Output:
	// 269722 conv1.weight linear.bias
}
