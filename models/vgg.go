// Package models builds the networks of the papers' experiments (docs/ALGORITHMS.md) with spargo's layers.
//
//	model, err := models.NewVGG("vgg16", models.CIFAR10, nn.NewRand(seed))
//	fmt.Print(nn.Summary(model)) // features.0.weight … classifier.bias, 14,728,266 parameters
//	r20, err := models.NewResNet("resnet20", models.CIFAR10, nn.NewRand(seed)) // 269,722
//	r50, err := models.New("resnet50", nn.NewRand(seed)) // torchvision's, 25,557,032
//
// The catalogue (Catalog, Lookup, LookupImage, New) lists every model by name; spargo models
// prints it.
package models

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"

	"github.com/spargo-dl/spargo/nn"
)

// Dataset describes the input a model is built for.
type Dataset struct {
	Name     string
	Classes  int
	Channels int
	Size     int // height = width
}

// The image data sets spargo ships loaders for.
var (
	CIFAR10  = Dataset{Name: "cifar10", Classes: 10, Channels: 3, Size: 32}
	CIFAR100 = Dataset{Name: "cifar100", Classes: 100, Channels: 3, Size: 32}
)

// vggConfigs are the layer plans of VGG (Simonyan & Zisserman), 0 marking a 2×2 max-pool.
var vggConfigs = map[string][]int{
	"vgg11": {64, 0, 128, 0, 256, 256, 0, 512, 512, 0, 512, 512, 0},
	"vgg13": {64, 64, 0, 128, 128, 0, 256, 256, 0, 512, 512, 0, 512, 512, 0},
	"vgg16": {64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0},
	"vgg19": {64, 64, 0, 128, 128, 0, 256, 256, 256, 256, 0, 512, 512, 512, 512, 0, 512, 512, 512, 512, 0},
}

// VGGNames lists the VGG variants NewVGG accepts.
func VGGNames() []string {
	names := make([]string, 0, len(vggConfigs))
	for n := range vggConfigs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// VGG is the CIFAR variant of VGG with batch normalisation: 3×3 convolutions (padding 1,
// with bias), BatchNorm and ReLU, 2×2 max-pools, then one Linear(512, classes) on the
// 1×1×512 map — the model of the SparDL and Ok-Topk papers' CIFAR experiments (14,728,266 parameters for
// VGG-16 on CIFAR-10). Parameters are named features.<i>.weight/bias and
// classifier.weight/bias.
type VGG struct {
	Features   *nn.Sequential
	Classifier *nn.Linear

	channelsLast bool
}

var _ nn.Container = (*VGG)(nil)

// NewVGG builds "vgg11", "vgg13", "vgg16" or "vgg19" for a 32×32 data set, initialised
// from rng like PyTorch's defaults.
func NewVGG(name string, ds Dataset, rng *rand.Rand) (*VGG, error) {
	cfg, ok := vggConfigs[strings.ToLower(name)]
	if !ok {
		return nil, fmt.Errorf("models: unknown VGG %q (have %s)", name, strings.Join(VGGNames(), ", "))
	}
	if ds.Size != 32 {
		return nil, fmt.Errorf("models: VGG here is the CIFAR variant for 32×32 inputs, %s has %d×%d", ds.Name, ds.Size, ds.Size)
	}
	f := nn.NewSequential()
	c := ds.Channels
	for _, v := range cfg {
		if v == 0 {
			f.Append(nn.MaxPool2d{Kernel: 2, Stride: 2})
			continue
		}
		f.Append(nn.NewConv2d(c, v, 3, 1, 1, true, rng))
		f.Append(nn.NewBatchNorm2d(v))
		f.Append(nn.ReLU{})
		c = v
	}
	m := &VGG{Features: f, Classifier: nn.NewLinear(c, ds.Classes, true, rng)}
	nn.Parameters(m)
	nn.Buffers(m)
	return m, nil
}

// Children returns features and classifier.
func (m *VGG) Children() []nn.Child {
	return []nn.Child{{Name: "features", Module: m.Features}, {Name: "classifier", Module: m.Classifier}}
}

// Forward maps [N, 3, 32, 32] images to [N, classes] logits. Each BatchNorm and the
// ReLU after it run as one op (see forwardFused).
func (m *VGG) Forward(x *nn.Var) *nn.Var {
	h := forwardFused(m.Features, channelsLastIn(x, m.channelsLast))
	return m.Classifier.Forward(flattenMap(h, m.channelsLast))
}

// SetChannelsLast switches the feature layers' activations to channels-last
// ([N, H, W, C]) or back; see ChannelsLaster.
func (m *VGG) SetChannelsLast(on bool) {
	m.channelsLast = on
	withChannelsLast(m.Features, on)
}

// ChannelsLast reports whether the activations are channels-last.
func (m *VGG) ChannelsLast() bool { return m.channelsLast }

// forwardFused runs s's children in order like s.Forward, except that a BatchNorm2d
// directly followed by a ReLU runs as one op (nn.BatchNorm2d.ForwardReLU, bit-identical
// to the two layers). The children, and so the parameter names, stay as they are.
func forwardFused(s *nn.Sequential, x *nn.Var) *nn.Var {
	cs := s.Children()
	for i := 0; i < len(cs); i++ {
		if bn, ok := cs[i].Module.(*nn.BatchNorm2d); ok && i+1 < len(cs) && isReLU(cs[i+1].Module) {
			x = bn.ForwardReLU(x)
			i++
			continue
		}
		x = cs[i].Module.Forward(x)
	}
	return x
}

// isReLU reports whether m is an nn.ReLU layer.
func isReLU(m nn.Module) bool {
	switch m.(type) {
	case nn.ReLU, *nn.ReLU:
		return true
	}
	return false
}
