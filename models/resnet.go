package models

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/spargo-dl/spargo/nn"
)

// ImageNet is the input of the ImageNet ResNets: 1000 classes, 224×224 RGB (any size
// from 32×32 up works: the network ends in an adaptive average pool).
var ImageNet = Dataset{Name: "imagenet", Classes: 1000, Channels: 3, Size: 224}

// cifarResNetDepths are the CIFAR ResNets of He et al. 2016 (§4.2): depth 6n+2.
var cifarResNetDepths = []int{20, 32, 44, 56, 110}

// imageNetResNets are torchvision's layer plans: blocks per stage, and whether the
// blocks are bottlenecks (1×1, 3×3, 1×1 with 4× expansion) or basic (two 3×3).
var imageNetResNets = map[string]struct {
	blocks     [4]int
	bottleneck bool
}{
	"resnet18":  {[4]int{2, 2, 2, 2}, false},
	"resnet34":  {[4]int{3, 4, 6, 3}, false},
	"resnet50":  {[4]int{3, 4, 6, 3}, true},
	"resnet101": {[4]int{3, 4, 23, 3}, true},
	"resnet152": {[4]int{3, 8, 36, 3}, true},
}

// CIFARResNetNames lists the CIFAR ResNets NewResNet accepts with a 32×32 data set.
func CIFARResNetNames() []string {
	names := make([]string, len(cifarResNetDepths))
	for i, d := range cifarResNetDepths {
		names[i] = "resnet" + strconv.Itoa(d)
	}
	return names
}

// ImageNetResNetNames lists torchvision's ResNets NewResNet accepts with ImageNet.
func ImageNetResNetNames() []string {
	return []string{"resnet18", "resnet34", "resnet50", "resnet101", "resnet152"}
}

// ResNet is a residual network (He et al. 2016) in one of two layouts, with PyTorch's
// parameter names so that weights load into the usual PyTorch definitions:
//
//   - CIFAR (resnet20/32/44/56/110, He et al.'s CIFAR ResNet-20): a 3×3 convolution to 16
//     channels, three stages of n basic blocks with 16, 32 and 64 channels (the 2nd and 3rd
//     start with stride 2), global average pool, Linear(64, classes). Shortcuts are
//     parameter-free (the paper's option A: a stride-2 subsample and zero channels, see
//     nn.SubsamplePad). Names follow the common PyTorch code (akamaster/pytorch_resnet_cifar10):
//     conv1, bn1, layer1.0.conv1, …, linear; ResNet-20 on CIFAR-10 has 269,722 parameters.
//     Initialisation as there: Kaiming-normal (fan_in, ReLU gain) for convolutions and the
//     Linear weight, PyTorch's default for the Linear bias, BatchNorm weight 1 and bias 0.
//   - ImageNet (resnet18/34/50/101/152): torchvision's definition (v1.5: a bottleneck
//     block's stride is on its 3×3 convolution) and names: conv1 (7×7, stride 2), bn1, a 3×3
//     stride-2 max-pool, layer1…layer4 with downsample.0/downsample.1 projection shortcuts
//     (1×1 convolution + BatchNorm) where the shape changes, adaptive average pool, fc;
//     11,689,512 parameters (ResNet-18) and 25,557,032 (ResNet-50). Initialisation as
//     torchvision's: Kaiming-normal (fan_out, ReLU gain) for convolutions, PyTorch's default
//     for fc, BatchNorm weight 1 and bias 0 (zero_init_residual=False).
type ResNet struct {
	Conv1   *nn.Conv2d
	BN1     *nn.BatchNorm2d
	MaxPool *nn.MaxPool2d // nil in the CIFAR layout
	Layers  []*nn.Sequential
	Pool    nn.AdaptiveAvgPool2d
	Head    *nn.Linear // "linear" (CIFAR) or "fc" (ImageNet)

	headName     string
	channelsLast bool
}

var _ nn.Container = (*ResNet)(nil)

// NewResNet builds the ResNet called name for ds: a CIFAR ResNet ("resnet20", "resnet32",
// "resnet44", "resnet56", "resnet110") for a 32×32 data set, or torchvision's ImageNet
// ResNet ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152") for ds.Classes
// classes on any input of at least 32×32. The initialisation is drawn from rng (see
// ResNet).
//
//	m, err := models.NewResNet("resnet20", models.CIFAR10, nn.NewRand(seed)) // 269,722 parameters
func NewResNet(name string, ds Dataset, rng *rand.Rand) (*ResNet, error) {
	name = strings.ToLower(name)
	if plan, ok := imageNetResNets[name]; ok {
		if ds.Classes <= 0 || ds.Channels <= 0 {
			return nil, fmt.Errorf("models: %s for %s: %d classes, %d channels", name, ds.Name, ds.Classes, ds.Channels)
		}
		return newImageNetResNet(plan.blocks, plan.bottleneck, ds, rng), nil
	}
	if depth, err := strconv.Atoi(strings.TrimPrefix(name, "resnet")); err == nil && strings.HasPrefix(name, "resnet") && slices.Contains(cifarResNetDepths, depth) {
		if ds.Size != 32 || ds.Classes <= 0 || ds.Channels <= 0 {
			return nil, fmt.Errorf("models: %s is a CIFAR ResNet for 32×32 inputs, %s has %d×%d, %d classes", name, ds.Name, ds.Size, ds.Size, ds.Classes)
		}
		return newCIFARResNet((depth-2)/6, ds, rng), nil
	}
	return nil, fmt.Errorf("models: unknown ResNet %q (have %s for CIFAR, %s for ImageNet)", name,
		strings.Join(CIFARResNetNames(), ", "), strings.Join(ImageNetResNetNames(), ", "))
}

// kaimingConv returns a bias-free convolution with a Kaiming-normal weight over fan_in
// (CIFAR layout) or fan_out (torchvision).
func kaimingConv(in, out, k, stride, pad int, fanOut bool, rng *rand.Rand) *nn.Conv2d {
	c := nn.NewConv2d(in, out, k, stride, pad, false, rng)
	fan := in * k * k
	if fanOut {
		fan = out * k * k
	}
	nn.KaimingNormal(c.Weight.Value.Data, fan, rng)
	return c
}

func newCIFARResNet(n int, ds Dataset, rng *rand.Rand) *ResNet {
	m := &ResNet{
		Conv1:    kaimingConv(ds.Channels, 16, 3, 1, 1, false, rng),
		BN1:      nn.NewBatchNorm2d(16),
		Pool:     nn.AdaptiveAvgPool2d{OutH: 1, OutW: 1},
		headName: "linear",
	}
	in := 16
	for stage, planes := range []int{16, 32, 64} {
		layer := nn.NewSequential()
		for b := 0; b < n; b++ {
			stride := 1
			if b == 0 && stage > 0 {
				stride = 2
			}
			blk := &BasicBlock{
				Conv1: kaimingConv(in, planes, 3, stride, 1, false, rng), BN1: nn.NewBatchNorm2d(planes),
				Conv2: kaimingConv(planes, planes, 3, 1, 1, false, rng), BN2: nn.NewBatchNorm2d(planes),
			}
			if stride != 1 || in != planes {
				// Option A: the subsampled input with planes/4 zero channels on each side
				// (16 → 32 → 64 channels: the 2× widening the paper pads with zeros).
				blk.Shortcut, blk.shortcutName = nn.SubsamplePad{Stride: stride, Before: planes / 4, After: planes - in - planes/4}, "shortcut"
			}
			layer.Append(blk)
			in = planes
		}
		m.Layers = append(m.Layers, layer)
	}
	m.Head = nn.NewLinear(64, ds.Classes, true, rng)
	nn.KaimingNormal(m.Head.Weight.Value.Data, 64, rng)
	nn.Parameters(m)
	nn.Buffers(m)
	return m
}

func newImageNetResNet(blocks [4]int, bottleneck bool, ds Dataset, rng *rand.Rand) *ResNet {
	m := &ResNet{
		Conv1:    kaimingConv(ds.Channels, 64, 7, 2, 3, true, rng),
		BN1:      nn.NewBatchNorm2d(64),
		MaxPool:  &nn.MaxPool2d{Kernel: 3, Stride: 2, Padding: 1},
		Pool:     nn.AdaptiveAvgPool2d{OutH: 1, OutW: 1},
		headName: "fc",
	}
	expansion := 1
	if bottleneck {
		expansion = 4
	}
	in := 64
	for stage, nb := range blocks {
		planes := 64 << stage
		layer := nn.NewSequential()
		for b := 0; b < nb; b++ {
			stride := 1
			if b == 0 && stage > 0 {
				stride = 2
			}
			var down *nn.Sequential
			if stride != 1 || in != planes*expansion {
				down = nn.NewSequential(kaimingConv(in, planes*expansion, 1, stride, 0, true, rng), nn.NewBatchNorm2d(planes*expansion))
			}
			if bottleneck {
				blk := &Bottleneck{
					Conv1: kaimingConv(in, planes, 1, 1, 0, true, rng), BN1: nn.NewBatchNorm2d(planes),
					Conv2: kaimingConv(planes, planes, 3, stride, 1, true, rng), BN2: nn.NewBatchNorm2d(planes),
					Conv3: kaimingConv(planes, planes*4, 1, 1, 0, true, rng), BN3: nn.NewBatchNorm2d(planes * 4),
				}
				if down != nil {
					blk.Downsample = down
				}
				layer.Append(blk)
			} else {
				blk := &BasicBlock{
					Conv1: kaimingConv(in, planes, 3, stride, 1, true, rng), BN1: nn.NewBatchNorm2d(planes),
					Conv2: kaimingConv(planes, planes, 3, 1, 1, true, rng), BN2: nn.NewBatchNorm2d(planes),
				}
				if down != nil {
					blk.Shortcut, blk.shortcutName = down, "downsample"
				}
				layer.Append(blk)
			}
			in = planes * expansion
		}
		m.Layers = append(m.Layers, layer)
	}
	m.Head = nn.NewLinear(in, ds.Classes, true, rng)
	nn.Parameters(m)
	nn.Buffers(m)
	return m
}

// Children returns conv1, bn1, maxpool (ImageNet layout), layer1…, avgpool and the head.
func (m *ResNet) Children() []nn.Child {
	cs := []nn.Child{{Name: "conv1", Module: m.Conv1}, {Name: "bn1", Module: m.BN1}}
	if m.MaxPool != nil {
		cs = append(cs, nn.Child{Name: "maxpool", Module: *m.MaxPool})
	}
	for i, l := range m.Layers {
		cs = append(cs, nn.Child{Name: "layer" + strconv.Itoa(i+1), Module: l})
	}
	return append(cs, nn.Child{Name: "avgpool", Module: m.Pool}, nn.Child{Name: m.headName, Module: m.Head})
}

// Forward maps [N, C, H, W] images to [N, classes] logits. Every BatchNorm followed by
// ReLU runs as one op (nn.BatchNorm2d.ForwardReLU, and ForwardAddReLU for a block's
// sum with its shortcut), bit-identical to the separate layers.
func (m *ResNet) Forward(x *nn.Var) *nn.Var {
	x = channelsLastIn(x, m.channelsLast)
	h := m.BN1.ForwardReLU(m.Conv1.Forward(x))
	if m.MaxPool != nil {
		h = m.MaxPool.Forward(h)
	}
	for _, l := range m.Layers {
		h = l.Forward(h)
	}
	return m.Head.Forward(flattenMap(m.Pool.Forward(h), m.channelsLast))
}

// SetChannelsLast switches the activations between the stem and the pool to
// channels-last ([N, H, W, C]) or back; see ChannelsLaster.
func (m *ResNet) SetChannelsLast(on bool) {
	m.channelsLast = on
	withChannelsLast(m.Conv1, on)
	withChannelsLast(m.BN1, on)
	if m.MaxPool != nil {
		withChannelsLast(m.MaxPool, on)
	}
	for _, l := range m.Layers {
		withChannelsLast(l, on)
	}
	m.Pool = withChannelsLast(m.Pool, on).(nn.AdaptiveAvgPool2d)
}

// ChannelsLast reports whether the activations are channels-last.
func (m *ResNet) ChannelsLast() bool { return m.channelsLast }

// BasicBlock is the residual block of two 3×3 convolutions, each followed by BatchNorm,
// with ReLU after the first and after the sum with the shortcut:
// relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)). The shortcut is the identity,
// a parameter-free nn.SubsamplePad ("shortcut", CIFAR option A) or a projection
// ("downsample": 1×1 convolution and BatchNorm, torchvision).
type BasicBlock struct {
	Conv1, Conv2 *nn.Conv2d
	BN1, BN2     *nn.BatchNorm2d
	Shortcut     nn.Module // nil: identity

	shortcutName string
}

var _ nn.Container = (*BasicBlock)(nil)

// Children returns conv1, bn1, conv2, bn2 and the shortcut when it is not the identity.
func (b *BasicBlock) Children() []nn.Child {
	cs := []nn.Child{{Name: "conv1", Module: b.Conv1}, {Name: "bn1", Module: b.BN1},
		{Name: "conv2", Module: b.Conv2}, {Name: "bn2", Module: b.BN2}}
	if b.Shortcut != nil {
		cs = append(cs, nn.Child{Name: b.shortcutName, Module: b.Shortcut})
	}
	return cs
}

// Forward runs the block: bn1 with its ReLU, and bn2 with the shortcut sum and the
// final ReLU, as single ops (nn.BatchNorm2d.ForwardReLU, ForwardAddReLU).
func (b *BasicBlock) Forward(x *nn.Var) *nn.Var {
	h := b.BN1.ForwardReLU(b.Conv1.Forward(x))
	h = b.Conv2.Forward(h)
	return b.BN2.ForwardAddReLU(h, shortcut(b.Shortcut, x))
}

// Bottleneck is torchvision's bottleneck block (ResNet v1.5): 1×1 convolution to planes
// channels, 3×3 convolution with the block's stride, 1×1 convolution to 4·planes channels,
// each followed by BatchNorm, ReLU after the first two and after the sum with the shortcut
// (identity, or the "downsample" projection).
type Bottleneck struct {
	Conv1, Conv2, Conv3 *nn.Conv2d
	BN1, BN2, BN3       *nn.BatchNorm2d
	Downsample          *nn.Sequential // nil: identity
}

var _ nn.Container = (*Bottleneck)(nil)

// Children returns conv1, bn1, conv2, bn2, conv3, bn3 and downsample when present.
func (b *Bottleneck) Children() []nn.Child {
	cs := []nn.Child{{Name: "conv1", Module: b.Conv1}, {Name: "bn1", Module: b.BN1},
		{Name: "conv2", Module: b.Conv2}, {Name: "bn2", Module: b.BN2},
		{Name: "conv3", Module: b.Conv3}, {Name: "bn3", Module: b.BN3}}
	if b.Downsample != nil {
		cs = append(cs, nn.Child{Name: "downsample", Module: b.Downsample})
	}
	return cs
}

// Forward runs the block: each BatchNorm with its ReLU (bn3 with the shortcut sum too)
// as a single op (nn.BatchNorm2d.ForwardReLU, ForwardAddReLU).
func (b *Bottleneck) Forward(x *nn.Var) *nn.Var {
	h := b.BN1.ForwardReLU(b.Conv1.Forward(x))
	h = b.BN2.ForwardReLU(b.Conv2.Forward(h))
	h = b.Conv3.Forward(h)
	var sc nn.Module
	if b.Downsample != nil {
		sc = b.Downsample
	}
	return b.BN3.ForwardAddReLU(h, shortcut(sc, x))
}

// shortcut applies a block's shortcut, nil being the identity.
func shortcut(s nn.Module, x *nn.Var) *nn.Var {
	if s == nil {
		return x
	}
	return s.Forward(x)
}
