package nn

import (
	"strings"
	"testing"
)

// A parameter read by several ops must be reported once, after its last use's backward.
func TestGradReadyFiresOncePerParamAfterLastUse(t *testing.T) {
	rng := NewRand(2)
	shared := NewLinear(4, 4, true, rng)
	head := NewLinear(4, 2, true, rng)
	m := NewSequential(shared, ReLU{}, shared, head) // shared used twice
	params := Parameters(m)
	tape := NewTape()
	var fired []string
	tape.OnGradReady(func(p *Param) { fired = append(fired, p.Name) })
	x := randTensor(rng, 3, 4)
	for step := 0; step < 3; step++ {
		tape.Reset()
		fired = fired[:0]
		ZeroGrad(params)
		loss := CrossEntropy(m.Forward(tape.Const(x)), []int{0, 1, 1})
		if err := tape.Backward(loss); err != nil {
			t.Fatal(err)
		}
		want := "3.weight 3.bias 0.weight 0.bias"
		if got := strings.Join(fired, " "); got != want {
			t.Fatalf("step %d: hooks fired %q, want %q", step, got, want)
		}
	}
	// The gradient of the shared layer at hook time must equal the final gradient:
	// compare with a pass where the hook snapshots it.
	tape.Reset()
	ZeroGrad(params)
	snap := map[string][]float32{}
	h := tape.OnGradReady(func(p *Param) { snap[p.Name] = append([]float32(nil), p.Grad.Data...) })
	defer h.Remove()
	loss := CrossEntropy(m.Forward(tape.Const(x)), []int{0, 1, 1})
	if err := tape.Backward(loss); err != nil {
		t.Fatal(err)
	}
	for _, p := range params {
		for i, v := range p.Grad.Data {
			if snap[p.Name][i] != v {
				t.Fatalf("%s[%d]: gradient at hook time %g, final %g", p.Name, i, snap[p.Name][i], v)
			}
		}
	}
}

func TestHookOrderFollowsBackward(t *testing.T) {
	rng := NewRand(4)
	m := NewSequential(NewConv2d(3, 4, 3, 1, 1, true, rng), NewBatchNorm2d(4), ReLU{}, Flatten{}, NewLinear(4*16, 3, true, rng))
	Parameters(m)
	tape := NewTape()
	var names []string
	tape.OnGradReady(func(p *Param) { names = append(names, p.Name) })
	loss := CrossEntropy(m.Forward(tape.Const(randTensor(rng, 2, 3, 4, 4))), []int{0, 2})
	if err := tape.Backward(loss); err != nil {
		t.Fatal(err)
	}
	want := "4.weight 4.bias 1.weight 1.bias 0.weight 0.bias"
	if got := strings.Join(names, " "); got != want {
		t.Fatalf("ready order %q, want %q", got, want)
	}
}

func TestBadInputIsAnErrorNotAPanic(t *testing.T) {
	rng := NewRand(5)
	m := NewSequential(NewConv2d(3, 4, 3, 1, 1, true, rng), ReLU{}, Flatten{}, NewLinear(10, 2, true, rng))
	Parameters(m)
	tape := NewTape()
	loss := CrossEntropy(m.Forward(tape.Const(randTensor(rng, 2, 3, 4, 4))), []int{0, 1})
	err := tape.Backward(loss)
	if err == nil || !strings.Contains(err.Error(), "nn.Linear(10→2): input shape [2 64]") {
		t.Fatalf("want an error naming the Linear layer and the shape, got %v", err)
	}
	tape.Reset()
	loss = CrossEntropy(tape.Const(randTensor(rng, 2, 3)), []int{0, 7})
	if err := tape.Backward(loss); err == nil || !strings.Contains(err.Error(), "label 7 of sample 1") {
		t.Fatalf("want an error naming the label, got %v", err)
	}
	tape.Reset()
	conv := NewConv2d(3, 4, 3, 1, 1, true, rng)
	conv.Forward(tape.Const(randTensor(rng, 2, 5, 4, 4)))
	if err := tape.Err(); err == nil || !strings.Contains(err.Error(), "want [N 3 H W]") {
		t.Fatalf("want a channel error, got %v", err)
	}
	// Backward twice without Reset.
	tape.Reset()
	loss = CrossEntropy(tape.Input(randTensor(rng, 2, 3)), []int{0, 1})
	if err := tape.Backward(loss); err != nil {
		t.Fatal(err)
	}
	if err := tape.Backward(loss); err != ErrNoGraph {
		t.Fatalf("second Backward: %v, want ErrNoGraph", err)
	}
}

func TestParameterNamesAndBuffers(t *testing.T) {
	rng := NewRand(6)
	inner := NewSequential(NewConv2d(3, 4, 3, 1, 1, true, rng), NewBatchNorm2d(4))
	m := NewSequential().Add("features", inner).Add("head", NewLinear(4, 2, false, rng))
	var names []string
	for _, p := range Parameters(m) {
		names = append(names, p.Name)
	}
	if got, want := strings.Join(names, " "), "features.0.weight features.0.bias features.1.weight features.1.bias head.weight"; got != want {
		t.Fatalf("names %q, want %q", got, want)
	}
	var bufs []string
	for _, b := range Buffers(m) {
		bufs = append(bufs, b.Name)
	}
	if got, want := strings.Join(bufs, " "), "features.1.running_mean features.1.running_var features.1.num_batches_tracked"; got != want {
		t.Fatalf("buffers %q, want %q", got, want)
	}
}

// After the first step a training step allocates no tensor buffers, and few objects.
func TestSteadyStateAllocations(t *testing.T) {
	rng := NewRand(8)
	m := NewSequential(NewConv2d(3, 8, 3, 1, 1, true, rng), NewBatchNorm2d(8), ReLU{}, MaxPool2d{Kernel: 2},
		Flatten{}, NewLinear(8*4*4, 10, true, rng))
	params := Parameters(m)
	x := randTensor(rng, 4, 3, 8, 8)
	labels := []int{1, 2, 3, 4}
	tape := NewTape()
	step := func() {
		tape.Reset()
		ZeroGrad(params)
		if err := tape.Backward(CrossEntropy(m.Forward(tape.Const(x)), labels)); err != nil {
			t.Fatal(err)
		}
	}
	step()
	step()
	before := tape.Stats.BufferAllocs
	allocs := testing.AllocsPerRun(10, step)
	if tape.Stats.BufferAllocs != before {
		t.Fatalf("steady state allocated %d tensor buffers", tape.Stats.BufferAllocs-before)
	}
	// Small objects remain: Tensor headers, shape slices and backward closures.
	if allocs > 120 {
		t.Fatalf("%.0f allocations per step, want at most 120", allocs)
	}
	t.Logf("%.0f small allocations per step, 0 tensor buffers", allocs)
}
