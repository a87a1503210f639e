package models

import (
	"fmt"

	"github.com/spargo-dl/spargo/nn"
)

// ChannelsLaster is a model that can keep its activations channels-last
// ([N, H, W, C]; see nn.ToChannelsLast): its input stays [N, C, H, W] and
// its output is unchanged, only the layout between them and the speed
// differ. The parameters, their names and shapes are the same in both
// layouts, so a checkpoint loads into either.
type ChannelsLaster interface {
	nn.Module
	SetChannelsLast(on bool)
	ChannelsLast() bool
}

var (
	_ ChannelsLaster = (*ResNet)(nil)
	_ ChannelsLaster = (*VGG)(nil)
)

// SetChannelsLast switches m (a ResNet or VGG) to channels-last activations
// (on) or back to NCHW. Models without convolutions (LSTM, BERT) give an
// error.
func SetChannelsLast(m nn.Module, on bool) error {
	cl, ok := m.(ChannelsLaster)
	if !ok {
		return fmt.Errorf("models: %T has no channels-last layout (only the convolutional models, ResNet and VGG, do)", m)
	}
	cl.SetChannelsLast(on)
	return nil
}

// withChannelsLast sets the channels-last option of m and of every layer in
// it, and returns m — a new value for the value-type layers (pools,
// SubsamplePad), which the caller must store back.
func withChannelsLast(m nn.Module, on bool) nn.Module {
	switch l := m.(type) {
	case *nn.Conv2d:
		l.ChannelsLast = on
	case *nn.BatchNorm2d:
		l.ChannelsLast = on
	case *nn.MaxPool2d:
		l.ChannelsLast = on
	case nn.MaxPool2d:
		l.ChannelsLast = on
		return l
	case nn.AvgPool2d:
		l.ChannelsLast = on
		return l
	case nn.AdaptiveAvgPool2d:
		l.ChannelsLast = on
		return l
	case nn.SubsamplePad:
		l.ChannelsLast = on
		return l
	case *nn.Sequential:
		for i, c := range l.Children() {
			l.Replace(i, withChannelsLast(c.Module, on))
		}
	case *BasicBlock:
		withChannelsLast(l.Conv1, on)
		withChannelsLast(l.Conv2, on)
		withChannelsLast(l.BN1, on)
		withChannelsLast(l.BN2, on)
		if l.Shortcut != nil {
			l.Shortcut = withChannelsLast(l.Shortcut, on)
		}
	case *Bottleneck:
		for _, c := range l.Children() {
			withChannelsLast(c.Module, on)
		}
	}
	return m
}

// channelsLastIn converts a model's NCHW input x to channels-last when on.
func channelsLastIn(x *nn.Var, on bool) *nn.Var {
	if on {
		return nn.ToChannelsLast(x)
	}
	return x
}

// flattenMap flattens the feature map h for a classifier in PyTorch's
// (C, H, W) order: a channels-last map larger than 1×1 goes back to NCHW
// first.
func flattenMap(h *nn.Var, channelsLast bool) *nn.Var {
	if s := h.Shape(); channelsLast && len(s) == 4 && s[1]*s[2] != 1 {
		h = nn.ToChannelsFirst(h)
	}
	return nn.Flatten{}.Forward(h)
}
