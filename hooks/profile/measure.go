package profile

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/nn"
)

// Step runs one training step's forward on the model being profiled and calls
// backward with the loss exactly once (it must not call ddp's Backward or an optimizer):
//
//	step := func(backward func(*nn.Var) error) error {
//		x, y := nextBatch()
//		tape.Reset()
//		return backward(nn.CrossEntropy(model.Forward(tape.Const(x)), y))
//	}
type Step func(backward func(loss *nn.Var) error) error

// Defaults of Options: the OMGS reference's 5 warm-up and 50 measured iterations,
// the density the sparse hooks default to, and 5 repeats per timed size.
const (
	DefaultWarmup     = 5
	DefaultIterations = 50
	DefaultDensity    = 0.01
	DefaultRepeats    = 5
)

// Options configure Measure; zero fields take the defaults.
type Options struct {
	// Warmup steps run unmeasured, then Iterations steps are measured.
	Warmup     int
	Iterations int
	// Density is k/n of the top-k timings and of the default all-gather sizes.
	Density float64
	// TopKSizes are the numbers of elements the selection is timed at (default: 256, 1024,
	// … ×4 below the model's size, and the model's size).
	TopKSizes []int
	// AllGatherBytes are the per-rank message sizes the all-gather is timed at (default: 8
	// bytes — one COO pair — ×4 up to the pairs of a top-k of the whole model, 64 bytes at
	// least).
	AllGatherBytes []int
	// AllReduceBytes are the per-rank buffer sizes (multiples of 4) the dense all-reduce is
	// timed at (default: 64 bytes ×4 up to 64 KiB).
	AllReduceBytes []int
	// Repeats is how many timings of each size make its median.
	Repeats int
	// TopK is the selection to time (default kernels.TopKAbs and the gather of the values);
	// tests give a synthetic cost.
	TopK func(idx []int32, x []float32, k int) []int32

	// clock stamps backward (tests); time.Now when nil.
	clock func() time.Time
}

// Tags of the profiler: above the tags ddp.New uses for its start-up checks and broadcasts
// (1 to 4) and below its buckets' (from 1<<16). Measure must not run concurrently with other
// users of these tags; it runs before ddp.New.
const (
	tagStatus  uint32 = 16
	tagBarrier uint32 = 17
	tagGather  uint32 = 18
	tagReduce  uint32 = 20
	tagResult  uint32 = 19
)

func (o Options) withDefaults(elements int) (Options, error) {
	if o.Warmup == 0 {
		o.Warmup = DefaultWarmup
	}
	if o.Iterations == 0 {
		o.Iterations = DefaultIterations
	}
	if o.Density == 0 {
		o.Density = DefaultDensity
	}
	if o.Repeats == 0 {
		o.Repeats = DefaultRepeats
	}
	switch {
	case o.Warmup < 0 || o.Iterations < 1 || o.Repeats < 1:
		return o, fmt.Errorf("profile: warm-up %d, iterations %d, repeats %d: want >= 0, >= 1, >= 1", o.Warmup, o.Iterations, o.Repeats)
	case !(o.Density > 0 && o.Density <= 1):
		return o, fmt.Errorf("profile: density %v, want a number in (0, 1]", o.Density)
	}
	if o.TopKSizes == nil {
		for n := 256; n < elements; n *= 4 {
			o.TopKSizes = append(o.TopKSizes, n)
		}
		o.TopKSizes = append(o.TopKSizes, max(elements, 2))
	}
	if o.AllGatherBytes == nil {
		top := max(64, 8*max(1, int(float64(elements)*o.Density)))
		for b := 8; b < top; b *= 4 {
			o.AllGatherBytes = append(o.AllGatherBytes, b)
		}
		o.AllGatherBytes = append(o.AllGatherBytes, top)
	}
	if o.AllReduceBytes == nil {
		for b := 64; b <= 64<<10; b *= 4 {
			o.AllReduceBytes = append(o.AllReduceBytes, b)
		}
	}
	distinctReduce := map[int]bool{}
	for _, b := range o.AllReduceBytes {
		if b < 0 || b%4 != 0 {
			return o, fmt.Errorf("profile: all-reduce size %d bytes, want a multiple of 4 (float32 elements)", b)
		}
		distinctReduce[b] = true
	}
	if len(distinctReduce) < 2 {
		return o, fmt.Errorf("profile: all-reduce sizes %v: want two different sizes at least, to fit α and β", o.AllReduceBytes)
	}
	for _, n := range o.TopKSizes {
		if n < 2 || n > math.MaxInt32 {
			return o, fmt.Errorf("profile: top-k size %d, want 2..2^31-1", n)
		}
	}
	distinct := map[int]bool{}
	for _, b := range o.AllGatherBytes {
		if b < 0 {
			return o, fmt.Errorf("profile: all-gather size %d bytes", b)
		}
		distinct[b] = true
	}
	if len(distinct) < 2 {
		return o, fmt.Errorf("profile: all-gather sizes %v: want two different sizes at least, to fit α and β", o.AllGatherBytes)
	}
	if o.TopK == nil {
		var val []float32
		o.TopK = func(idx []int32, x []float32, k int) []int32 {
			idx = kernels.TopKAbs(idx, x, k)
			val = slices.Grow(val[:0], len(idx))[:len(idx)]
			kernels.Gather(val, x, idx)
			return idx
		}
	}
	if o.clock == nil {
		o.clock = time.Now
	}
	return o, nil
}

// Measure measures model's profile on group g (see the package doc); every rank calls it
// with its own replica and step, before ddp.New. It leaves the parameters, their
// gradients and the buffers (BatchNorm statistics) as it found them. Every rank returns the
// same profile: rank 0's.
func Measure(ctx context.Context, model nn.Module, g comm.Group, step Step, opts Options) (*Profile, error) {
	params := nn.Parameters(model)
	if len(params) == 0 {
		return nil, errors.New("profile: the model has no parameters")
	}
	elements := 0
	for _, p := range params {
		elements += p.Len()
	}
	o, err := opts.withDefaults(elements)
	if err != nil {
		return nil, err
	}
	defer restoreState(params, nn.Buffers(model))()

	prof := &Profile{P: g.Size(), Warmup: o.Warmup, Iterations: o.Iterations}
	for _, p := range params {
		prof.Params = append(prof.Params, p.Name)
		prof.Sizes = append(prof.Sizes, p.Len())
	}
	localErr := measureBackward(prof, params, step, o)
	if localErr == nil {
		localErr = measureTopK(ctx, prof, o)
	}
	if err := agreeStatus(ctx, g, localErr); err != nil {
		return nil, err
	}
	// The top-k timings leave a model-sized buffer behind on every rank: collect it now
	// rather than during the all-gather timings.
	runtime.GC()
	if err := measureAllGather(ctx, g, prof, o); err != nil {
		return nil, fmt.Errorf("profile: timing the all-gather: %w", err)
	}
	if err := measureAllReduce(ctx, g, prof, o); err != nil {
		return nil, fmt.Errorf("profile: timing the all-reduce: %w", err)
	}
	return broadcastProfile(ctx, g, prof)
}

// restoreState snapshots the gradients and buffers and returns the function that puts them
// back.
func restoreState(params []*nn.Param, buffers []*nn.Buffer) func() {
	grads := make([][]float32, len(params))
	for i, p := range params {
		grads[i] = slices.Clone(p.Grad.Data)
	}
	bufs := make([][]float32, len(buffers))
	for i, b := range buffers {
		bufs[i] = slices.Clone(b.Value.Data)
	}
	return func() {
		for i, p := range params {
			copy(p.Grad.Data, grads[i])
		}
		for i, b := range buffers {
			copy(b.Value.Data, bufs[i])
		}
	}
}

// measureBackward runs the steps and fills ParamBackward, Forward, Backward and Unused.
func measureBackward(prof *Profile, params []*nn.Param, step Step, o Options) error {
	index := make(map[*nn.Param]int, len(params))
	for i, p := range params {
		index[p] = i
	}
	sum := make([]time.Duration, len(params))
	ready := make([]time.Duration, len(params))
	seen := make([]bool, len(params))
	unused := make([]bool, len(params))
	var forward, backward time.Duration
	for it := range o.Warmup + o.Iterations {
		measured := it >= o.Warmup
		called := false
		var stepStart time.Time
		bw := func(loss *nn.Var) error {
			if called {
				return errors.New("the step called backward twice")
			}
			called = true
			if loss == nil || loss.Tape() == nil {
				return errors.New("backward got a loss without a tape")
			}
			tape := loss.Tape()
			clear(seen)
			t0 := o.clock()
			h := tape.OnGradReady(func(p *nn.Param) {
				if i, ok := index[p]; ok && !seen[i] {
					seen[i] = true
					ready[i] = o.clock().Sub(t0)
				}
			})
			err := tape.Backward(loss)
			h.Remove()
			end := o.clock().Sub(t0)
			if err != nil {
				return err
			}
			if measured {
				forward += t0.Sub(stepStart)
				backward += end
				for i := range ready {
					if !seen[i] {
						ready[i] = end
						unused[i] = true
					}
					sum[i] += ready[i]
				}
			}
			return nil
		}
		stepStart = o.clock()
		if err := step(bw); err != nil {
			return fmt.Errorf("profile: step %d: %w", it+1, err)
		}
		if !called {
			return fmt.Errorf("profile: step %d returned without calling backward", it+1)
		}
	}
	n := time.Duration(o.Iterations)
	prof.ParamBackward = make([]time.Duration, len(params))
	for i := range sum {
		prof.ParamBackward[i] = sum[i] / n
		if unused[i] {
			prof.Unused = append(prof.Unused, params[i].Name)
		}
	}
	prof.Forward, prof.Backward = forward/n, backward/n
	return nil
}

// measureTopK times o.TopK at every size and fits γ. The repeats go round the sizes, so that
// a burst of load on a shared machine slows all sizes alike rather than one.
func measureTopK(ctx context.Context, prof *Profile, o Options) error {
	x := heavyTailed(slices.Max(o.TopKSizes))
	var idx []int32
	times := make([][]float64, len(o.TopKSizes))
	for r := -1; r < o.Repeats; r++ { // r = -1: untimed, warms caches and pools
		for s, n := range o.TopKSizes {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("profile: %w", err)
			}
			k := min(n, max(1, int(float64(n)*o.Density)))
			t0 := time.Now()
			idx = o.TopK(idx[:0], x[:n], k)
			if r >= 0 {
				times[s] = append(times[s], time.Since(t0).Seconds())
			}
		}
	}
	prof.TopK.Density = o.Density
	for s, n := range o.TopKSizes {
		prof.TopK.Samples = append(prof.TopK.Samples, CostSample{Size: n, Seconds: median(times[s])})
	}
	prof.TopK.Gamma, prof.TopK.MaxRelErr = fitGamma(prof.TopK.Samples)
	return nil
}

// heavyTailed returns n deterministic gradient-like values: a normal over the square root of
// a uniform, so that a few entries dominate.
func heavyTailed(n int) []float32 {
	rng := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() / math.Sqrt(rng.Float64()+1e-3))
	}
	return x
}

// agreeStatus tells every rank whether every rank's local measurement succeeded.
func agreeStatus(ctx context.Context, g comm.Group, local error) error {
	var msg []byte
	if local != nil {
		msg = []byte(local.Error())
	}
	all, err := comm.AllGatherBytes(ctx, g, tagStatus, msg)
	if err != nil {
		if local != nil {
			return local
		}
		return fmt.Errorf("profile: exchanging the ranks' status: %w", err)
	}
	if local != nil {
		return local
	}
	for r, m := range all {
		if len(m) > 0 {
			return fmt.Errorf("profile: rank %d failed: %s", r, m)
		}
	}
	return nil
}

// measureAllGather times the all-gather at every size (the repeats going round the sizes, as
// in measureTopK), each run starting after a barrier, and fits α and β.
func measureAllGather(ctx context.Context, g comm.Group, prof *Profile, o Options) error {
	p := g.Size()
	var err error
	prof.AllGather, err = timeCollective(ctx, g, o.AllGatherBytes, o.Repeats, func(b int) error {
		sizes := make([]int, p)
		for i := range sizes {
			sizes[i] = b
		}
		_, err := comm.AllGatherBytesSized(ctx, g, tagGather, make([]byte, b), sizes)
		return err
	})
	return err
}

// measureAllReduce times the dense all-reduce the same way.
func measureAllReduce(ctx context.Context, g comm.Group, prof *Profile, o Options) error {
	var err error
	prof.AllReduce, err = timeCollective(ctx, g, o.AllReduceBytes, o.Repeats, func(b int) error {
		return comm.AllReduce(ctx, g, tagReduce, make([]float32, b/4), comm.Auto)
	})
	return err
}

// timeCollective times run(b) for every size b (the repeats going round the sizes, as in
// measureTopK, after one untimed round), each run starting after a barrier, and fits α and β
// to the medians.
func timeCollective(ctx context.Context, g comm.Group, sizes []int, repeats int, run func(b int) error) (AllGatherCost, error) {
	times := make([][]float64, len(sizes))
	for r := -1; r < repeats; r++ { // r = -1: untimed
		for s, b := range sizes {
			if err := comm.Barrier(ctx, g, tagBarrier); err != nil {
				return AllGatherCost{}, err
			}
			t0 := time.Now()
			if err := run(b); err != nil {
				return AllGatherCost{}, err
			}
			if r >= 0 {
				times[s] = append(times[s], time.Since(t0).Seconds())
			}
		}
	}
	var c AllGatherCost
	for s, b := range sizes {
		c.Samples = append(c.Samples, CostSample{Size: b, Seconds: median(times[s])})
	}
	c.Alpha, c.Beta, c.MaxRelErr = fitAlphaBeta(c.Samples)
	return c, nil
}

// broadcastProfile sends rank 0's profile to every rank (its JSON length, then the JSON).
func broadcastProfile(ctx context.Context, g comm.Group, prof *Profile) (*Profile, error) {
	var buf bytes.Buffer
	if g.Rank() == 0 {
		if err := prof.WriteJSON(&buf); err != nil {
			return nil, fmt.Errorf("profile: encoding: %w", err)
		}
	}
	n := binary.LittleEndian.AppendUint64(nil, uint64(buf.Len()))
	if err := comm.BroadcastBytes(ctx, g, tagResult, 0, n); err != nil {
		return nil, fmt.Errorf("profile: broadcasting rank 0's profile: %w", err)
	}
	msg := buf.Bytes()
	if g.Rank() != 0 {
		msg = make([]byte, binary.LittleEndian.Uint64(n))
	}
	if err := comm.BroadcastBytes(ctx, g, tagResult, 0, msg); err != nil {
		return nil, fmt.Errorf("profile: broadcasting rank 0's profile: %w", err)
	}
	out, err := Read(bytes.NewReader(msg))
	if err != nil {
		return nil, fmt.Errorf("profile: rank 0's profile: %w", err)
	}
	return out, nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// minTime stands in for a timing of zero in the relative-error weights.
const minTime = 1e-9

// fitGamma fits t = γ·n·log2 n by least squares on the time (the reference's curve_fit):
// γ = Σ t·f / Σ f², f = n·log2 n. The fit follows the large sizes, where selection costs
// enough to matter; a real kernel's fixed costs make small sizes relatively slower and the
// cache makes very large ones so, which no single γ captures (MaxRelErr shows how far).
func fitGamma(ss []CostSample) (gamma, maxRel float64) {
	var tf, ff float64
	for _, s := range ss {
		f := float64(s.Size) * math.Log2(float64(s.Size))
		tf += s.Seconds * f
		ff += f * f
	}
	if ff > 0 {
		gamma = max(tf/ff, 0)
	}
	c := TopKCost{Gamma: gamma}
	for _, s := range ss {
		maxRel = max(maxRel, math.Abs(c.Seconds(float64(s.Size))-s.Seconds)/max(s.Seconds, minTime))
	}
	return gamma, maxRel
}

// fitAlphaBeta fits t = α + β·b by least squares on the relative error (weights 1/t²),
// keeping α and β non-negative.
func fitAlphaBeta(ss []CostSample) (alpha, beta, maxRel float64) {
	var s0, s1, s2, t0, t1 float64
	for _, s := range ss {
		t := max(s.Seconds, minTime)
		w := 1 / (t * t)
		b := float64(s.Size)
		s0 += w
		s1 += w * b
		s2 += w * b * b
		t0 += w * s.Seconds
		t1 += w * b * s.Seconds
	}
	if det := s0*s2 - s1*s1; det > 1e-12*s0*s2 {
		alpha = (t0*s2 - s1*t1) / det
		beta = (s0*t1 - s1*t0) / det
	} else {
		alpha = t0 / s0
	}
	if alpha < 0 {
		alpha, beta = 0, t1/s2
	}
	if beta < 0 {
		alpha, beta = t0/s0, 0
	}
	c := AllGatherCost{Alpha: alpha, Beta: beta}
	for _, s := range ss {
		maxRel = max(maxRel, math.Abs(c.Seconds(float64(s.Size))-s.Seconds)/max(s.Seconds, minTime))
	}
	return alpha, beta, maxRel
}
