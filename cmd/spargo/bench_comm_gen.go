package main

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/spargo-dl/spargo/nn"
)

// The synthetic gradients of `spargo bench comm -gen NAME`: heavy-tailed (the default, the
// same values as before -gen existed) and three kinds of data the sparse hooks' volume bounds
// must survive (issue 24): a hot region that moves every call, ranks whose selections are
// disjoint slices of one moving region, and many equal magnitudes. Worker r's gradient of
// call c depends only on the seed, c, r, n and P, so a rank of a launched job that generates
// its own has the values the in-process run gives that worker.

// commGenerators are -gen's names, the default first.
var commGenerators = []string{"heavy-tailed", "moving-hotspot", "disjoint-hotspot", "ties"}

// commGenHelp is -gen's help text.
var commGenHelp = "synthetic gradients of the single bucket: heavy-tailed (the same every call; a shared component plus per-worker noise), " +
	"moving-hotspot (every worker's large values in one region of n/32 positions that moves each call), " +
	"disjoint-hotspot (one moving region of n/4 positions cut into P slices, worker r's large values in slice (r + call) mod P only), " +
	"ties (three magnitudes only, so thousands of entries tie at the k-th); one of " + strings.Join(commGenerators, ", ")

// genFill writes worker r's gradient of call c (of p workers) into dst.
type genFill func(dst []float32, seed uint64, c, r, p int)

var genFills = map[string]genFill{
	"moving-hotspot":   fillMovingHotspot,
	"disjoint-hotspot": fillDisjointHotspot,
	"ties":             fillTies,
}

// genSource returns the single-bucket source of -gen name for the held workers of p, and
// what it holds (for the header line).
func genSource(name string, seed uint64, n, p int, held []int) (*gradSource, string, error) {
	if name == commGenerators[0] {
		return singleBucketSource(n, syntheticGradients(seed, n, held)), fmt.Sprintf("heavy-tailed gradients (seed %d)", seed), nil
	}
	fill, ok := genFills[name]
	if !ok {
		return nil, "", fmt.Errorf("-gen %q: want one of %s", name, strings.Join(commGenerators, ", "))
	}
	if name == "disjoint-hotspot" && n < 4*p {
		return nil, "", fmt.Errorf("-gen disjoint-hotspot: -n %d leaves %d workers' slices empty; want n >= 4P = %d", n, p, 4*p)
	}
	bufs := make([][]float32, len(held)) // one per held worker, refilled every call
	for w := range bufs {
		bufs[w] = make([]float32, n)
	}
	param := nn.NewParam("grad", n)
	src := &gradSource{params: []*nn.Param{param}, iteration: func(c int) int64 { return int64(c) },
		load: func(c, w int) ([][]float32, error) {
			fill(bufs[w], seed, c, held[w], p)
			return [][]float32{bufs[w]}, nil
		}}
	return src, fmt.Sprintf("%s gradients (seed %d, new every call)", name, seed), nil
}

// genRand is the generator of worker r (r < 0: the one all workers share) in call c.
func genRand(seed uint64, c, r int) *rand.Rand {
	return rand.New(rand.NewPCG(seed^0x9e3779b97f4a7c15, uint64(c)<<20|uint64(r+1)))
}

// quiet fills dst with noise below 1e-3 in magnitude, never zero: the positions no hot region
// covers.
func quiet(dst []float32, rng *rand.Rand) {
	for i := range dst {
		x := (rng.Float64()*2 - 1) * 1e-3
		if x == 0 {
			x = 1e-4
		}
		dst[i] = float32(x)
	}
}

// withSign is x with a random sign.
func withSign(rng *rand.Rand, x float64) float32 {
	if rng.Uint64()&1 == 0 {
		x = -x
	}
	return float32(x)
}

// fillMovingHotspot: the large values of every worker lie in call c's hot region, n/32
// positions at a place drawn anew each call (the same for all workers): a component all
// workers share, magnitude in [0.5, 1.5), plus the worker's own in [-0.5, 0.5).
func fillMovingHotspot(dst []float32, seed uint64, c, r, p int) {
	n := len(dst)
	w := max(1, n/32)
	shared := genRand(seed, c, -1)
	start := shared.IntN(n - w + 1)
	own := genRand(seed, c, r)
	quiet(dst, own)
	for i := start; i < start+w; i++ {
		dst[i] = withSign(shared, 0.5+shared.Float64()) + float32(own.Float64()-0.5)
	}
}

// fillDisjointHotspot: call c's hot region of n/4 positions (drawn anew each call) is cut into
// P slices; worker r's large values, magnitudes in [0.5, 1.5), fill slice (r + c) mod P only.
// No two workers select the same positions, and a worker's own region of a split by position
// seldom holds its own selection.
func fillDisjointHotspot(dst []float32, seed uint64, c, r, p int) {
	n := len(dst)
	w := max(p, n/4)
	start := genRand(seed, c, -1).IntN(n - w + 1)
	own := genRand(seed, c, r)
	quiet(dst, own)
	s := (r + c) % p
	for i := start + s*w/p; i < start+(s+1)*w/p; i++ {
		dst[i] = withSign(own, 0.5+own.Float64())
	}
}

// fillTies: every magnitude is 1 (2 % of the positions), 1/2 (8 %) or 1/4, with random
// signs: the k-th largest magnitude is shared by thousands of entries.
func fillTies(dst []float32, seed uint64, c, r, _ int) {
	own := genRand(seed, c, r)
	for i := range dst {
		level := 0.25
		switch u := own.IntN(100); {
		case u < 2:
			level = 1
		case u < 10:
			level = 0.5
		}
		dst[i] = withSign(own, level)
	}
}
