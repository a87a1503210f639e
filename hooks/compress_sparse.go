package hooks

import (
	"fmt"
	"math"
	"slices"
	"sync"
)

// The sparsifiers of the compressed family: randomk (summable), threshold and dgc
// (all-gathered COO pairs, two words an entry, the sparse hooks' wire format).

// randomK is random-k with a shared seed (Stich et al., "Sparsified SGD with Memory", 2018;
// GRACE's RandomK): every rank keeps the same k = max(1, ⌊n·density⌋) positions, drawn from
// the hook's seed, the bucket and the call (the ranks agree without sending indices), so the
// messages, k values, sum directly: a ring all-reduce of k words, 2k(P-1)/P received per rank
// on average (rank r: 2k − k_r − k_{r+1} with the ring's blocks k_j). Error feedback keeps
// the other n − k values.
type randomK struct {
	density float64

	mu   sync.Mutex
	last randomKey
	pos  []int32
}

type randomKey struct {
	bucket int
	call   int64
	seed   uint64
	n      int
}

func (r *randomK) k(n int) int { return min(n, max(1, int(float64(n)*r.density))) }

func (r *randomK) Words(n int) int { return r.k(n) }

func (*randomK) WordsFormula() string { return "k" }

func (*randomK) Summable() bool { return true }

// positions are the call's k positions, increasing (Floyd's sampling), the same on every rank.
func (r *randomK) positions(n int, c CompressCall) []int32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := randomKey{c.Bucket, c.Call, c.Seed, n}
	if r.pos != nil && r.last == key {
		return r.pos
	}
	k := r.k(n)
	rng := c.Shared()
	seen := make([]uint64, (n+63)/64)
	pos := make([]int32, 0, k)
	for j := n - k; j < n; j++ {
		t := rng.IntN(j + 1)
		if seen[t/64]&(1<<(t%64)) != 0 {
			t = j
		}
		seen[t/64] |= 1 << (t % 64)
		pos = append(pos, int32(t))
	}
	slices.Sort(pos)
	r.last, r.pos = key, pos
	return pos
}

func (r *randomK) Compress(msg []byte, x []float32, c CompressCall) []byte {
	for _, i := range r.positions(len(x), c) {
		msg = putFloat(msg, x[i])
	}
	return msg
}

func (r *randomK) Decompress(acc []float32, msg []byte, c CompressCall) error {
	pos := r.positions(len(acc), c)
	if err := checkWords(msg, len(acc), len(pos)); err != nil {
		return err
	}
	for e, i := range pos {
		acc[i] += getFloat(msg, e)
	}
	return nil
}

// cooCompressor sends the entries select keeps as COO pairs (index, value): two words each.
type cooCompressor struct {
	// pick returns the entries of x to send, indices increasing.
	pick func(x []float32, c CompressCall) COO
	// count, when set, is the number of entries every rank sends on call c (dgc); nil: it
	// depends on the values (threshold).
	count func(n int, c CompressCall) int
	// steady is count after any warm-up (Words).
	steady func(n int) int
	// formula is Words' expression.
	formula string
}

func (cc cooCompressor) Words(n int) int {
	if cc.steady == nil {
		return -1
	}
	return 2 * cc.steady(n)
}

func (cc cooCompressor) WordsFormula() string { return cc.formula }

func (cooCompressor) Summable() bool { return false }

func (cc cooCompressor) Compress(msg []byte, x []float32, c CompressCall) []byte {
	return cc.pick(x, c).AppendWire(msg)
}

func (cc cooCompressor) Decompress(acc []float32, msg []byte, c CompressCall) error {
	if cc.count != nil {
		if k := cc.count(len(acc), c); len(msg) != k*wireEntryBytes {
			return fmt.Errorf("message of %d bytes, want %d entries of %d bytes", len(msg), k, wireEntryBytes)
		}
	}
	var v COO
	if err := v.SetWire(msg, len(acc)); err != nil {
		return err
	}
	ScatterAdd(acc, v)
	return nil
}

func init() {
	registerCompressed("randomk", "random-k with a shared seed and error feedback: the same k positions on every rank, ring all-reduce of k values; 2k(P-1)/P words",
		[]Option{{Name: "density", Default: "0.01", Help: "k/n, in (0, 1]"}, seedOption}, AllReduced, true,
		func(o Values) (Compressor, error) {
			d, err := o.Float("density")
			if err != nil {
				return nil, err
			}
			if !(d > 0 && d <= 1) {
				return nil, optionError("randomk", "density", d, "a number in (0, 1]")
			}
			return &randomK{density: d}, nil
		})
	registerCompressed("threshold", "hard threshold with error feedback: the entries with |G| ≥ v, all-gather of the pairs; "+
		"2(Σ_s k_s − k_r) + P-1 words, k_s the count of rank s",
		[]Option{{Name: "v", Default: "0.01", Help: "the threshold, > 0"}}, AllGathered, true,
		func(o Values) (Compressor, error) {
			v, err := o.Float("v")
			if err != nil {
				return nil, err
			}
			if !(v > 0) || math.IsInf(v, 1) {
				return nil, optionError("threshold", "v", v, "a finite number > 0")
			}
			th := float32(v)
			return cooCompressor{formula: "2k_r", pick: func(x []float32, _ CompressCall) COO { return Threshold(COO{}, x, th) }}, nil
		})
}
