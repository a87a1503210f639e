package main

import (
	"fmt"
	"math"
	"strings"
)

// scalePlan is how large one hook's simulated vectors are: nSim elements per worker standing
// for scale·nSim.
type scalePlan struct{ nSim, scale int }

// scaleExact are the hooks whose every message size is proportional to k or n: a run on n/M
// elements with every message counted M times gives the full run's time, volume and rounds
// exactly (TestSimulateScaledMatchesFull checks it).
var scaleExact = map[string]bool{"spardl": true, "topka": true, "gtopk": true, "allreduce": true}

// scaleDataDependent are the hooks whose volumes follow the data (thresholds, the entries they
// select): scaled, they send the scaled data's volumes times M, which overestimates the full
// run's, more as M grows. The values say by how much, as measured against full-size runs
// (spargo simulate -n 8M -workers 8 -hook oktopk:density=0.01 -hook topkdsa:density=0.01
// -compute none -scale 1, 200 and 1000; TestSimulateScaledMatchesFull allows 5 % at M = 16).
var scaleDataDependent = map[string]string{
	"oktopk":  "time over the full run's by +7 % at M=200, +17 % at M=1000 (P=8, measured)",
	"topkdsa": "time over the full run's by +4 % at M=200, +9 % at M=1000 (P=8, measured)",
}

// gathersSelections are the hooks that all-gather every worker's selection: each worker holds
// P·k entries (wire form and decoded, 16 bytes an entry) besides its vectors. Their k needs to
// be a whole number, not a multiple of P.
var gathersSelections = map[string]bool{"topka": true, "gaussiank": true}

// scaling says, for a row's output, what scaling plan approximates: nothing at M = 1.
func scaling(spec string, plan scalePlan) string {
	if plan.scale == 1 {
		return "full size"
	}
	name, _, _ := strings.Cut(spec, ":")
	what := fmt.Sprintf("scaled: %d = %d × %d elements per worker, every message counted %d times: ", plan.scale*plan.nSim, plan.scale, plan.nSim, plan.scale)
	switch {
	case scaleExact[name]:
		return what + "exact (message sizes follow k or n)"
	case scaleDataDependent[name] != "":
		return what + "approximate (volumes follow the scaled data): " + scaleDataDependent[name]
	}
	return what + "not checked against the full run (volumes may not follow n)"
}

// scaleUnit is the multiple of which one hook's scaled vector must be for its budgets to scale
// exactly: its 1/density when that is whole (k a whole number), times P for the hooks that
// split the vector into P blocks or regions (all but those that gather whole selections).
func scaleUnit(p int, spec string, density float64) int {
	q := 1
	inv := 1 / density
	if r := math.Round(inv); math.Abs(inv-r) < 1e-9*r && r <= 1e6 {
		q = int(r)
	}
	if name, _, _ := strings.Cut(spec, ":"); gathersSelections[name] {
		return q
	}
	return p * q
}

// planScale picks one hook's down-scaling (row i of o): none when P·n fits the memory budget
// (or -scale 1), otherwise the vectors shrink to a multiple of the hook's scaleUnit and
// M·nSim approximates n. Each hook gets its own plan, so that one hook's needs (TopkA's
// gathered selections, P²·k entries in all) do not shrink the others' vectors.
func planScale(o simOptions, i int) (scalePlan, error) {
	spec, density := o.specs[i], o.densities[i]
	name, _, _ := strings.Cut(spec, ":")
	gather := 0.0
	if gathersSelections[name] {
		gather = 16 * float64(o.workers) * density
	}
	need := func(n int) int64 {
		return int64(o.workers) * int64(float64(n)*(simBytesPerElement+gather))
	}
	if o.scale == 1 || o.scale == 0 && need(o.nModel) <= o.mem {
		if need(o.nModel) > o.mem {
			return scalePlan{}, fmt.Errorf("-scale 1: %d workers × %d elements need about %d MiB, more than -mem %d MiB", o.workers, o.nModel, need(o.nModel)>>20, o.mem>>20)
		}
		return scalePlan{nSim: o.nModel, scale: 1}, nil
	}
	u := scaleUnit(o.workers, spec, density)
	units := max(1, int(math.Round(float64(o.nModel)/float64(u)))) // units in the real model
	if o.scale > 0 {
		j := max(1, int(math.Round(float64(units)/float64(o.scale))))
		if need(u*j) > o.mem {
			return scalePlan{}, fmt.Errorf("-scale %d: %d workers × %d elements need about %d MiB, more than -mem %d MiB", o.scale, o.workers, u*j, need(u*j)>>20, o.mem>>20)
		}
		return scalePlan{nSim: u * j, scale: o.scale}, nil
	}
	jMax := int(o.mem / need(u))
	if jMax < 1 {
		return scalePlan{}, fmt.Errorf("-mem %d MiB is too small for %s: %d workers need at least %d MiB (vectors of %d elements)", o.mem>>20, spec, o.workers, need(u)>>20, u)
	}
	// From the smallest scale M that fits, the one (up to twice that) whose M·round(units/M)
	// is closest to the real count; a larger M only when it is strictly closer. (Taking the
	// largest vector that fits and rounding M could leave M·nSim several per cent off n.)
	m0 := (units + jMax - 1) / jMax
	bestM, bestJ, bestErr := 0, 0, math.MaxInt
	for m := m0; m <= 2*m0; m++ {
		j := int(math.Round(float64(units) / float64(m)))
		if j < 1 || j > jMax {
			continue
		}
		if e := abs(m*j - units); e < bestErr {
			bestM, bestJ, bestErr = m, j, e
		}
	}
	return scalePlan{nSim: u * bestJ, scale: bestM}, nil
}
