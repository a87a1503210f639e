package nn

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/internal/kernels"
)

// bnReluCase is one use of the fused ops and the composition it replaces: f builds
// the output from a BatchNorm, the input x and a second input r (shaped like x).
type bnReluCase struct {
	name   string
	f      func(bn *BatchNorm2d, x, r *Var, fused bool) *Var
	xConst bool // x records no gradient (a data batch)
	rConst bool
}

var bnReluCases = []bnReluCase{
	{name: "relu", f: func(bn *BatchNorm2d, x, _ *Var, fused bool) *Var {
		if fused {
			return bn.ForwardReLU(x)
		}
		return Relu(bn.Forward(x))
	}},
	{name: "relu-x-const", xConst: true, f: func(bn *BatchNorm2d, x, _ *Var, fused bool) *Var {
		if fused {
			return bn.ForwardReLU(x)
		}
		return Relu(bn.Forward(x))
	}},
	// x used again after the op: its gradient exists when the op's backward runs, which
	// accumulates into it.
	{name: "relu-x-reused", f: func(bn *BatchNorm2d, x, _ *Var, fused bool) *Var {
		if fused {
			return Add(bn.ForwardReLU(x), Relu(x))
		}
		return Add(Relu(bn.Forward(x)), Relu(x))
	}},
	{name: "add-relu", f: func(bn *BatchNorm2d, x, r *Var, fused bool) *Var {
		if fused {
			return bn.ForwardAddReLU(x, r)
		}
		return Relu(Add(bn.Forward(x), r))
	}},
	{name: "add-relu-r-const", rConst: true, f: func(bn *BatchNorm2d, x, r *Var, fused bool) *Var {
		if fused {
			return bn.ForwardAddReLU(x, r)
		}
		return Relu(Add(bn.Forward(x), r))
	}},
	{name: "add-relu-x-const", xConst: true, f: func(bn *BatchNorm2d, x, r *Var, fused bool) *Var {
		if fused {
			return bn.ForwardAddReLU(x, r)
		}
		return Relu(Add(bn.Forward(x), r))
	}},
	// r used again after the op: r's gradient is accumulated, not written.
	{name: "add-relu-r-reused", f: func(bn *BatchNorm2d, x, r *Var, fused bool) *Var {
		if fused {
			return Add(bn.ForwardAddReLU(x, r), Relu(r))
		}
		return Add(Relu(Add(bn.Forward(x), r)), Relu(r))
	}},
	{name: "add-relu-both-reused", f: func(bn *BatchNorm2d, x, r *Var, fused bool) *Var {
		if fused {
			return Add(Add(bn.ForwardAddReLU(x, r), Relu(r)), Relu(x))
		}
		return Add(Add(Relu(Add(bn.Forward(x), r)), Relu(r)), Relu(x))
	}},
	// The shortcut is the BatchNorm's own input.
	{name: "add-relu-r-is-x", f: func(bn *BatchNorm2d, x, _ *Var, fused bool) *Var {
		if fused {
			return bn.ForwardAddReLU(x, x)
		}
		return Relu(Add(bn.Forward(x), x))
	}},
	// A residual block's tail: the shortcut x and a branch computed from it.
	{name: "block", f: func(bn *BatchNorm2d, x, r *Var, fused bool) *Var {
		h := Add(x, r)
		if fused {
			return bn.ForwardAddReLU(h, x)
		}
		return Relu(Add(bn.Forward(h), x))
	}},
}

// bnReluShapes cover small planes (2×2, and 2-D [N, C] input), planes that are not
// multiples of 8 (5×4, 7×7), multiples of 8 (4×6, 8×8) and 32×32 maps, n = 1…32.
var bnReluShapes = [][]int{
	{2, 3, 2, 2}, {7, 2, 2, 2}, {6, 5}, {32, 3}, {3, 4, 5, 4}, {2, 3, 7, 7}, {2, 3, 4, 6},
	{1, 3, 8, 8}, {32, 2, 8, 8}, {1, 2, 32, 32}, {4, 2, 32, 32}, {32, 2, 32, 32}, {3, 3, 3, 3},
}

// newTestBN returns a BatchNorm over c channels with parameters and running statistics
// drawn from seed, in training mode or not.
func newTestBN(c int, seed uint64, training bool) *BatchNorm2d {
	rng := NewRand(seed)
	bn := NewBatchNorm2d(c)
	Uniform(bn.Weight.Value.Data, 1.5, rng)
	Uniform(bn.Bias.Value.Data, 0.5, rng)
	Uniform(bn.RunningMean.Value.Data, 0.5, rng)
	for i := range bn.RunningVar.Value.Data {
		bn.RunningVar.Value.Data[i] = 0.25 + rng.Float32()
	}
	bn.SetTraining(training)
	return bn
}

// requireBitsEqual fails at the first element where got and want differ bit for bit.
func requireBitsEqual(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d elements, composition %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s[%d] = %v (%#x), composition %v (%#x)", what, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

// The fused ops give the composition's bits: the output, every gradient (x, r, weight,
// bias) and the running statistics, in training and evaluation mode. The kernels
// in use are SPARGO_KERNELS's (run with generic and avx2; internal/kernels compares
// every implementation directly).
func TestBatchNormReLUMatchesComposition(t *testing.T) {
	for _, shape := range bnReluShapes {
		for _, training := range []bool{true, false} {
			for ci, c := range bnReluCases {
				name := fmt.Sprintf("%s/%v/training=%v", c.name, shape, training)
				t.Run(name, func(t *testing.T) {
					rng := NewRand(uint64(100 + ci))
					x, r := randTensor(rng, shape...), randTensor(rng, shape...)
					dy := randTensor(rng, shape...).Data
					type result struct{ out, gx, gr, gw, gb, rm, rv, nb []float32 }
					run := func(fused bool) result {
						bn := newTestBN(shape[1], 9, training)
						tape := NewTape()
						xv, rv := tape.Input(x), tape.Input(r)
						if c.xConst {
							xv = tape.Const(x)
						}
						if c.rConst {
							rv = tape.Const(r)
						}
						out := c.f(bn, xv, rv, fused)
						if err := tape.BackwardFrom(out, dy); err != nil {
							t.Fatal(err)
						}
						grad := func(v *Var) []float32 {
							if v.Grad == nil {
								return nil
							}
							return v.Grad.Data
						}
						return result{out.Value.Data, grad(xv), grad(rv), bn.Weight.Grad.Data, bn.Bias.Grad.Data,
							bn.RunningMean.Value.Data, bn.RunningVar.Value.Data, bn.NumBatchesTracked.Value.Data}
					}
					want, got := run(false), run(true)
					requireBitsEqual(t, "y", got.out, want.out)
					requireBitsEqual(t, "x.grad", got.gx, want.gx)
					requireBitsEqual(t, "r.grad", got.gr, want.gr)
					requireBitsEqual(t, "weight.grad", got.gw, want.gw)
					requireBitsEqual(t, "bias.grad", got.gb, want.gb)
					requireBitsEqual(t, "running_mean", got.rm, want.rm)
					requireBitsEqual(t, "running_var", got.rv, want.rv)
					requireBitsEqual(t, "num_batches_tracked", got.nb, want.nb)
				})
			}
		}
	}
}

// Without recording (evaluation under SetGradEnabled(false)) the fused ops compute the
// same values and record nothing.
func TestBatchNormReLUNoGrad(t *testing.T) {
	rng := NewRand(11)
	x, r := randTensor(rng, 4, 3, 5, 5), randTensor(rng, 4, 3, 5, 5)
	for _, training := range []bool{true, false} {
		values := func(fused bool) [2][]float32 {
			bn1, bn2 := newTestBN(3, 12, training), newTestBN(3, 12, training)
			tape := NewTape()
			tape.SetGradEnabled(false)
			xv, rv := tape.Const(x), tape.Const(r)
			var out [2]*Var
			if fused {
				out = [2]*Var{bn1.ForwardReLU(xv), bn2.ForwardAddReLU(xv, rv)}
			} else {
				out = [2]*Var{Relu(bn1.Forward(xv)), Relu(Add(bn2.Forward(xv), rv))}
			}
			if len(tape.nodes) != 0 {
				t.Fatalf("%d ops recorded with gradients disabled", len(tape.nodes))
			}
			return [2][]float32{out[0].Value.Data, out[1].Value.Data}
		}
		want, got := values(false), values(true)
		requireBitsEqual(t, fmt.Sprintf("training=%v relu(bn(x))", training), got[0], want[0])
		requireBitsEqual(t, fmt.Sprintf("training=%v relu(bn(x)+r)", training), got[1], want[1])
	}
}

// Bad inputs fail like the other ops: a recorded error and a placeholder.
func TestBatchNormReLUErrors(t *testing.T) {
	bn := NewBatchNorm2d(3)
	for _, c := range []struct {
		name string
		f    func(tape *Tape) *Var
		msg  string
	}{
		{"channels", func(tape *Tape) *Var { return bn.ForwardReLU(tape.Const(NewTensor(2, 4, 3, 3))) }, "nn.BatchNorm2d(3).ForwardReLU: input shape [2 4 3 3]"},
		{"residual-shape", func(tape *Tape) *Var {
			return bn.ForwardAddReLU(tape.Const(NewTensor(2, 3, 3, 3)), tape.Const(NewTensor(2, 3, 3, 2)))
		}, "residual shape [2 3 3 2] differ"},
		{"one-value", func(tape *Tape) *Var {
			return bn.ForwardAddReLU(tape.Const(NewTensor(1, 3)), tape.Const(NewTensor(1, 3)))
		}, "training needs more than one value"},
	} {
		tape := NewTape()
		y := c.f(tape)
		if err := tape.Err(); err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: error %v, want one with %q", c.name, err, c.msg)
		}
		if y == nil {
			t.Errorf("%s: nil result", c.name)
		}
	}
	// A broken residual passes through silently.
	tape := NewTape()
	broken := Add(tape.Const(NewTensor(2, 3)), tape.Const(NewTensor(3, 2)))
	first := tape.Err()
	bn.ForwardAddReLU(tape.Const(NewTensor(2, 3)), broken)
	if tape.Err() != first {
		t.Errorf("error %v, want the first one %v", tape.Err(), first)
	}
}

// bnReluModule is BatchNorm+ReLU as one op, for gradCheck.
type bnReluModule struct{ bn *BatchNorm2d }

func (m bnReluModule) Forward(x *Var) *Var { return m.bn.ForwardReLU(x) }
func (m bnReluModule) Children() []Child   { return []Child{{Name: "bn", Module: m.bn}} }

// residualModule is relu(bn(conv(x)) + x), a residual block's tail, for gradCheck.
type residualModule struct {
	conv *Conv2d
	bn   *BatchNorm2d
}

func (m residualModule) Forward(x *Var) *Var { return m.bn.ForwardAddReLU(m.conv.Forward(x), x) }
func (m residualModule) Children() []Child {
	return []Child{{Name: "conv", Module: m.conv}, {Name: "bn", Module: m.bn}}
}

func TestBatchNormReLUFiniteDifferences(t *testing.T) {
	rng := NewRand(13)
	for _, c := range []struct {
		name  string
		m     Module
		shape []int
	}{
		{"bn-relu-train", bnReluModule{newTestBN(3, 14, true)}, []int{4, 3, 2, 3}},
		{"bn-relu-eval", bnReluModule{newTestBN(3, 15, false)}, []int{2, 3, 2, 2}},
		{"bn-relu-train-2d", bnReluModule{newTestBN(4, 16, true)}, []int{6, 4}},
		{"bn-add-relu-train", residualModule{NewConv2d(3, 3, 3, 1, 1, false, rng), newTestBN(3, 17, true)}, []int{3, 3, 4, 4}},
		{"bn-add-relu-eval", residualModule{NewConv2d(2, 2, 3, 1, 1, false, rng), newTestBN(2, 18, false)}, []int{2, 2, 3, 5}},
	} {
		t.Run(c.name, func(t *testing.T) {
			gradCheck(t, c.name, c.m, randTensor(rng, c.shape...), 2e-3, 2e-2)
		})
	}
}

// The kernels the tests above ran with, for the log.
func TestBatchNormReLUImpl(t *testing.T) { t.Logf("kernels: %s", kernels.Impl()) }

// BenchmarkBatchNormReLU times forward + backward of relu(bn(x)) and relu(bn(x) + r)
// on ResNet-20's first-stage activation (32×16×32×32), as the separate ops and as
// the fused ones, on a reused tape (x and r both need gradients, as in a block):
//
//	go test -run '^$' -bench BatchNormReLU -benchtime 20x ./nn/
func BenchmarkBatchNormReLU(b *testing.B) {
	rng := NewRand(1)
	shape := []int{32, 16, 32, 32}
	x, r := randTensor(rng, shape...), randTensor(rng, shape...)
	dy := randTensor(rng, shape...).Data
	bn := NewBatchNorm2d(16)
	for _, c := range []struct {
		name string
		f    func(x, r *Var) *Var
	}{
		{"bn-relu/unfused", func(x, _ *Var) *Var { return Relu(bn.Forward(x)) }},
		{"bn-relu/fused", func(x, _ *Var) *Var { return bn.ForwardReLU(x) }},
		{"bn-add-relu/unfused", func(x, r *Var) *Var { return Relu(Add(bn.Forward(x), r)) }},
		{"bn-add-relu/fused", func(x, r *Var) *Var { return bn.ForwardAddReLU(x, r) }},
	} {
		tape := NewTape()
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				tape.Reset()
				y := c.f(tape.Input(x), tape.Input(r))
				if err := tape.BackwardFrom(y, dy); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
