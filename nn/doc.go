// Package nn owns spargo's tensors, the define-by-run autograd tape with per-parameter
// grad-ready hooks, modules with stable dotted parameter names, the CNN layers and the
// losses.
//
// A forward pass records ops on a Tape; Backward replays them in reverse. Every op
// that reads a parameter counts one use of it, and after the last of those ops has run
// its backward the tape calls the OnGradReady hooks with the parameter: its gradient
// is final from then on. DDP feeds its gradient buckets from these hooks, so
// communication starts while the rest of backward is still running.
//
// The tape also owns the memory: activations, gradients and scratch come from a pool
// that Reset refills, so a training loop allocates no tensor memory after its first
// step.
//
//	rng := nn.NewRand(0)
//	model := nn.NewSequential(nn.NewLinear(4, 8, true, rng), nn.ReLU{}, nn.NewLinear(8, 3, true, rng))
//	params := nn.Parameters(model) // "0.weight", "0.bias", "2.weight", "2.bias"
//	tape := nn.NewTape()
//	tape.OnGradReady(func(p *nn.Param) { fmt.Println("ready:", p.Name) })
//	for step := 0; step < steps; step++ {
//		tape.Reset()
//		nn.ZeroGrad(params)
//		loss := nn.CrossEntropy(model.Forward(tape.Const(x)), labels)
//		if err := tape.Backward(loss); err != nil { … } // bad shapes surface here
//		// update params from p.Grad
//	}
//
// Ops computed outside this package record themselves with Tape.Custom (with Alloc, Fail
// and Var.AccumulateGrad): they take part in backward and in the grad-ready hooks like the
// built-in ones. nn/gorgonia runs a gorgonia expression graph as such an op.
//
// Layers follow PyTorch: same shapes (NCHW), same default initialisation, same
// BatchNorm momentum/eps semantics; gradients are tested against finite differences
// and against goldens produced by scripts/gen_goldens.py with PyTorch.
//
// Fused ops: BatchNorm2d.ForwardReLU computes Relu(bn.Forward(x)) and ForwardAddReLU
// Relu(Add(bn.Forward(x), r)) (a residual block's tail) in one pass over the activation, with
// the rectifier's mask applied inside BatchNorm's backward passes; values and gradients are
// bit-identical to the separate layers'. The ResNet and VGG models of package models use them
// (2026-11-29, AMD EPYC Zen 3, 2 threads: a ResNet-20 training step 4–8 % shorter).
//
// Channels last: Conv2d, BatchNorm2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d and
// SubsamplePad have a ChannelsLast option under which they take and return [N, H, W, C]
// tensors (the shape says the layout; PyTorch's channels_last memory format). The
// convolutions then read and write the activations where they lie instead of copying every
// input into an NHWC image and every output back; ToChannelsLast and ToChannelsFirst convert
// at a network's edges. models.SetChannelsLast switches a whole ResNet or VGG.
package nn
