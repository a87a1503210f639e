// Package gorgonia is spargo's bridge to gorgonia.org/gorgonia (v0.9.18) and
// gorgonia.org/tensor (v0.9.24): tensors convert without copying, and a block whose math is a
// gorgonia expression graph drops into a spargo model, where its parameters are ordinary
// nn.Params that DDP buckets and every comm hook handle like any other. It is the only package
// of the module that imports gorgonia (a test runs go list to keep it so: gorgonia.org/tensor
// alone links Apache Arrow, two protobuf stacks and flatbuffers). Import it under another name,
// since a program that uses it also imports gorgonia itself:
//
//	import (
//		G "gorgonia.org/gorgonia"
//		sgorgonia "github.com/spargo-dl/spargo/nn/gorgonia"
//	)
//
// # Tensors
//
// ToDense views an *nn.Tensor as a *tensor.Dense and FromDense views a float32, contiguous,
// row-major *tensor.Dense as an *nn.Tensor. Both share the backing array: a write through one
// is a write through the other. A view lives as long as the memory it views: a parameter's
// Value for the life of the model (optimizers and DDP write into it in place); a Var's Value
// or Grad until its Tape's next Reset, when the pool reuses the memory; a value a gorgonia VM
// computed until that VM runs again.
//
// # Blocks
//
// NewBlock calls a BuildFunc that builds a graph from input nodes and learnables declared
// with Builder.Param, and returns a Block (an nn.Module; Apply for several inputs). The
// parameters are created, named ("head.fc1.weight" once nn.Parameters has walked the model)
// and initialised from a seeded generator by spargo; the graph's learnable nodes are bound to
// their memory, so an optimizer step is seen by the next forward without a copy.
//
// Forward runs a program compiled from the forward part of the graph on gorgonia's
// TapeMachine, copies the output into tape memory and records one op on the spargo tape. When
// backward reaches that op, a second program — the forward again, then the symbolic
// vector-Jacobian product that gorgonia.Backpropagate built from an upstream-gradient node —
// takes the upstream gradient, and the input and parameter gradients it computes are added to
// the Vars' and Params' Grad. Then the tape fires the grad-ready hooks of the block's
// parameters, so DDP's Reducer buckets them and the comm hook runs while the rest of backward
// goes on, as for spargo's own layers. The recomputed forward is the price of gorgonia's VM,
// which runs a compiled program from start to end with no way to stop between the forward and
// backward halves and no per-instruction callback (which is also why spargo's core does not
// run on gorgonia: it could not overlap communication with backward inside a graph).
//
// A graph is built per set of input shapes — a short last batch or an evaluation batch gets
// its own — and cached (Block.MaxGraphs, least recently used dropped). Errors from the build
// function, from gorgonia's graph construction, differentiation, compilation or execution, and
// gorgonia's panics (which it raises for shape mismatches, among others) become errors:
// NewBlock's, or the tape's (Err, Backward), as for spargo's layers; none escapes as a panic.
//
// # Gorgonia ops a Block refuses, and what to use instead
//
// We measured these bugs in gorgonia v0.9.18; a Block refuses the ops with an error that says
// what to do instead, and TestGorgoniaKnownBugs fails if a new gorgonia version fixes them:
//
//   - Dropout: its gradient divides by p instead of 1-p; it is also random, and the backward
//     program recomputes the forward. Apply nn.Dropout to the block's input or output.
//   - InverseSqrt: its gradient is -g/(2y³) instead of -g·y³/2 (it breaks a LayerNorm
//     composed from it). Write Inverse(Sqrt(x)) or Pow(x, -0.5).
//   - BatchNorm: its running variance starts at 0, and its running statistics would be
//     updated twice per step by the recomputation. Use nn.BatchNorm2d around the block.
//   - random nodes (GaussianRandomNode, …): the recomputation would draw other numbers.
//
// Gorgonia also has no LSTM, LayerNorm or GELU ops, and its initialisers (GlorotU, …) draw
// from a global, unseeded generator: declare parameters with an Init of this package
// (KaimingUniform, Uniform, Zeros, Values), which draws from the block's seeded generator.
//
// # Versions
//
// go.mod pins gorgonia.org/gorgonia v0.9.18 and gorgonia.org/tensor v0.9.24 (their last
// releases; the module proxy refuses @latest for them) and go4.org/unsafe/assume-no-moving-gc
// v0.0.0-20231121144256-b99613f794b6: with an older version a binary that imports gorgonia
// panics at start-up on Go ≥ 1.21 (gorgonia issue #523).
//
// A Block, like the Tape it records on, is used by one goroutine at a time; blocks of
// different replicas (DDP's in-process workers) run concurrently, and building graphs is
// serialised inside the package. examples/gorgonia trains a CIFAR-10 model whose conv stack
// is spargo's and whose MLP head is a Block, with 2 workers and SparDL.
package gorgonia
