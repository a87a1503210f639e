package hooks

import (
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/spargo-dl/spargo/hooks/profile"
)

// This file is OMGS-SGD's planner (Shi et al., INFOCOM 2020, §II-IV): the cost model of an iteration of
// merged-gradient sparsification, the paper's Algorithm 1 (FindMergedLayers), an exact
// optimum over all merge plans, and the brute force that checks both.
//
// A merge plan cuts the L tensors, in backward order (the order their gradients become
// ready), into consecutive groups; each group is sparsified (top-k of its concatenated
// gradient) and all-gathered as one message. A plan is written as group lengths in tensors,
// in backward order: [2, 1, 3] groups tensors 0-1, 2, 3-5. There are 2^(L-1) plans.
//
// Small tensors (fewer than MergeModel.DenseBelow elements: biases, BatchNorm's γ and β) are
// not sparsified: wherever the plan puts them, their group all-reduces them densely beside the
// all-gather of its sparse part (hooks' dense_below). A group's cost is then the selection of
// its sparse elements, the all-gather of their pairs and the all-reduce of its dense elements
// (each zero when its part is empty). It still depends on the group alone, so the exact
// planners and the brute force below stay exact under it.

// Timeline says where the sparsification of a group runs, which decides when things start.
type Timeline int

const (
	// DDPTimeline is spargo's DDP: backward never waits; a complete group goes to the comm
	// hook, which runs on DDP's communication goroutine one group at a time, selecting then
	// all-gathering, so a group starts when its gradients are ready and the previous group's
	// hook has returned.
	DDPTimeline Timeline = iota
	// PaperTimeline is the paper's (its Eqs. 5-9 and Algorithm 1): a group is sparsified on
	// the computation stream as soon as its last gradient is ready, and the next tensor's
	// backward starts after it; a group's all-gather starts when it is sparsified and the
	// previous all-gather has finished.
	PaperTimeline
)

func (t Timeline) String() string {
	switch t {
	case PaperTimeline:
		return "paper"
	case DDPTimeline:
		return "ddp"
	}
	return fmt.Sprintf("Timeline(%d)", int(t))
}

// MergeModel is the cost model of one model on one machine and group, in seconds, with the
// tensors in backward order.
type MergeModel struct {
	// Forward is the time before the first tensor's backward starts (t_f).
	Forward float64
	// Backward[j] is tensor j's own backward time (t_b), Sizes[j] its elements.
	Backward []float64
	Sizes    []int
	// TopK is the selection's cost (Gamma·n·log2 n), AllGather the communication's
	// (Alpha + Beta·bytes per rank).
	TopK      profile.TopKCost
	AllGather profile.AllGatherCost
	// Density is k/n: a group of n sparse elements sends Density·n COO pairs of 8 bytes per
	// rank (continuous, as in the paper's linear model).
	Density  float64
	Timeline Timeline
	// DenseBelow: tensors with fewer elements are all-reduced densely (4 bytes per element
	// per rank, AllReduce's cost) and cost no selection; 0 sparsifies every tensor.
	DenseBelow int
	AllReduce  profile.AllReduceCost
}

// NewMergeModel builds the model of a measured profile for the tensors in order (indices into
// the profile's parameters, backward order: prof.Order()).
func NewMergeModel(prof *profile.Profile, order []int, density float64, tl Timeline) MergeModel {
	m := MergeModel{Forward: prof.Forward.Seconds(), TopK: prof.TopK, AllGather: prof.AllGather, AllReduce: prof.AllReduce,
		Density: density, Timeline: tl}
	for j, d := range prof.LayerBackward(order) {
		m.Backward = append(m.Backward, d.Seconds())
		m.Sizes = append(m.Sizes, prof.Sizes[order[j]])
	}
	return m
}

// topk is the paper's TKPM: the selection time of a group of n elements (0 for a merged
// layer, n = 0).
func (m *MergeModel) topk(n float64) float64 { return m.TopK.Seconds(n) }

// dense reports whether tensor j is all-reduced densely.
func (m *MergeModel) dense(j int) bool { return m.DenseBelow > 0 && m.Sizes[j] < m.DenseBelow }

// allreduce is the dense all-reduce of n elements (0 for n = 0).
func (m *MergeModel) allreduce(n float64) float64 {
	if n <= 0 {
		return 0
	}
	return m.AllReduce.Seconds(4 * n)
}

// comm is a group's communication: the all-gather of its sparse part (sparse elements) and
// the all-reduce of its dense part.
func (m *MergeModel) comm(sparse, dense float64) float64 {
	return m.allgather(sparse) + m.allreduce(dense)
}

// split returns tensor j's sparse and dense elements (one of them 0).
func (m *MergeModel) split(j int) (sparse, dense float64) {
	if m.dense(j) {
		return 0, float64(m.Sizes[j])
	}
	return float64(m.Sizes[j]), 0
}

// allgather is the paper's AGPM: 0 for a merged layer (n = 0).
func (m *MergeModel) allgather(n float64) float64 {
	if n <= 0 {
		return 0
	}
	return m.AllGather.Seconds(8 * m.Density * n)
}

// GroupTimes is one group's place on the predicted timeline, in seconds from the start of the
// iteration.
type GroupTimes struct {
	Tensors  int     // tensors in the group
	Elements int     // their elements
	Dense    int     // of which all-reduced densely
	Ready    float64 // its last gradient computed
	Selected float64 // its top-k done
	Start    float64 // its all-gather starts
	Done     float64 // its all-gather done
}

// Schedule is the predicted timeline of a plan (group lengths in tensors, backward order).
func (m *MergeModel) Schedule(plan []int) []GroupTimes {
	out := make([]GroupTimes, 0, len(plan))
	clock := m.Forward // the computation stream
	commEnd := 0.0     // the communication stream (DDP: the hook goroutine)
	j := 0
	for _, n := range plan {
		g := GroupTimes{Tensors: n}
		for ; n > 0; n-- {
			clock += m.Backward[j]
			g.Elements += m.Sizes[j]
			if m.dense(j) {
				g.Dense += m.Sizes[j]
			}
			j++
		}
		g.Ready = clock
		sparse, dense := float64(g.Elements-g.Dense), float64(g.Dense)
		if m.Timeline == PaperTimeline {
			clock += m.topk(sparse)
			g.Selected = clock
			g.Start = max(commEnd, clock)
		} else {
			g.Selected = max(commEnd, clock) + m.topk(sparse)
			g.Start = g.Selected
		}
		g.Done = g.Start + m.comm(sparse, dense)
		commEnd = g.Done
		out = append(out, g)
	}
	return out
}

// Predict is the predicted iteration time of a plan: the end of the last all-gather (the
// paper's t_iter = τ_c^(1) + t_c^(1)).
func (m *MergeModel) Predict(plan []int) float64 {
	s := m.Schedule(plan)
	return s[len(s)-1].Done
}

// NonOverlapped is the predicted communication time after the computation is over (the
// paper's t_c^no, Eq. 9): the end of the last all-gather minus the end of the last
// computation (backward, and on the paper's timeline the last selection).
func (m *MergeModel) NonOverlapped(plan []int) float64 {
	s := m.Schedule(plan)
	last := s[len(s)-1]
	if m.Timeline == PaperTimeline {
		return last.Done - last.Selected
	}
	return last.Done - last.Ready
}

func (m *MergeModel) check() error {
	if len(m.Sizes) == 0 || len(m.Backward) != len(m.Sizes) {
		return fmt.Errorf("merge model: %d tensors, %d backward times", len(m.Sizes), len(m.Backward))
	}
	return nil
}

// PlanLAGS is one group per tensor (no merging); PlanSingle is one group (TopK-SGD).
func PlanLAGS(l int) []int {
	plan := make([]int, l)
	for i := range plan {
		plan[i] = 1
	}
	return plan
}

// PlanSingle is one group of all l tensors (TopK-SGD).
func PlanSingle(l int) []int { return []int{l} }

// PlanThreshold is MGS: consecutive tensors merged until the group has at least threshold
// elements (the reference's rule; the last group may be smaller).
func PlanThreshold(sizes []int, threshold int) []int {
	var plan []int
	n, cnt := 0, 0
	for _, s := range sizes {
		n += s
		cnt++
		if n >= threshold {
			plan = append(plan, cnt)
			n, cnt = 0, 0
		}
	}
	if cnt > 0 {
		plan = append(plan, cnt)
	}
	return plan
}

// FindMergedLayers is the paper's Algorithm 1, line by line, on the paper's timeline. Its
// layers are numbered 1..L with L the first in backward (tensor j of the model is layer L-j).
// Scanning l = L..2, layer l merges into layer l-1 when Q3 (without merging, l-1's selection
// would end before l's all-gather) and Q5 (merged, the selection ends before l's all-gather
// could start plus the α saved) both hold; a merge updates the sizes and times (procedure
// Merge) and recomputes the timestamps (CalculateCompStart from l down, CalculateCommStart).
// It returns the plan and the iteration time its own timestamps predict, τ_c[1] + t_c[1].
//
// With dense tensors (DenseBelow) a layer's size splits into a sparse and a dense part: the
// selection costs TKPM of the sparse part, the communication the all-gather of the sparse
// part plus the all-reduce of the dense part, and Q5's α (what merging saves in start-up)
// becomes what merging saves in communication, t_c[l] + t_c[l-1] − t_c(merged), which is α
// when every tensor is sparse: the algorithm is the paper's on the paper's model.
func FindMergedLayers(m MergeModel) (plan []int, predicted float64, err error) {
	if err := m.check(); err != nil {
		return nil, 0, err
	}
	if m.Timeline != PaperTimeline {
		return nil, 0, fmt.Errorf("the paper's Algorithm 1 assumes the paper's timeline, not %v", m.Timeline)
	}
	L := len(m.Sizes)
	tb := make([]float64, L+1) // 1-based, as in the paper
	d := make([]float64, L+1)  // sparse elements
	dd := make([]float64, L+1) // dense elements
	for l := 1; l <= L; l++ {
		tb[l] = m.Backward[L-l]
		d[l], dd[l] = m.split(L - l)
	}
	tkpm := m.topk
	agpm := func(l int) float64 { return m.comm(d[l], dd[l]) }
	// CalculateCompStart (CCPS) over layers 1..l, layer l's backward starting at tau.
	ccps := func(tb, d []float64, l int, tau float64) (taub, taus, ts []float64) {
		taub, taus, ts = make([]float64, l+1), make([]float64, l+1), make([]float64, l+1)
		for i := l; i >= 1; i-- {
			ts[i] = tkpm(d[i])
		}
		taub[l] = tau
		taus[l] = taub[l] + tb[l]
		for i := l - 1; i >= 1; i-- {
			taub[i] = taus[i+1] + ts[i+1]
			taus[i] = taub[i] + tb[i]
		}
		return taub, taus, ts
	}
	// CalculateCommStart (CCMS).
	ccms := func(ts, taus []float64) (tauc, tc []float64) {
		tauc, tc = make([]float64, L+1), make([]float64, L+1)
		for i := L; i >= 1; i-- {
			tc[i] = agpm(i)
		}
		tauc[L] = taus[L] + ts[L]
		for i := L - 1; i >= 1; i-- {
			tauc[i] = max(tauc[i+1]+tc[i+1], taus[i]+ts[i])
		}
		return tauc, tc
	}
	merged := make([]bool, L+1)
	taub, taus, ts := ccps(tb, d, L, m.Forward)
	tauc, tc := ccms(ts, taus)
	for l := L; l >= 2; l-- {
		mu := taub[l] + tb[l] + tb[l-1]
		saved := agpm(l) + agpm(l-1) - m.comm(d[l]+d[l-1], dd[l]+dd[l-1]) // α when all sparse
		q3 := mu+tkpm(d[l])+tkpm(d[l-1]) < tauc[l]+agpm(l)
		q5 := tauc[l]+saved > mu+tkpm(d[l]+d[l-1])
		if q3 && q5 {
			// Merge(tb, ts, tc, d, l).
			tb[l-1] += tb[l]
			tb[l] = 0
			d[l-1] += d[l]
			d[l] = 0
			dd[l-1] += dd[l]
			dd[l] = 0
			tc[l-1], tc[l] = agpm(l-1), 0
			ts[l-1], ts[l] = tkpm(d[l-1]), 0
			taub2, taus2, _ := ccps(tb[:l+1], d[:l+1], l, taub[l]+tb[l])
			copy(taub[1:l+1], taub2[1:])
			copy(taus[1:l+1], taus2[1:])
			tauc, tc = ccms(ts, taus)
			merged[l] = true
		}
	}
	cnt := 0
	for l := L; l >= 1; l-- {
		cnt++
		if l == 1 || !merged[l] {
			plan = append(plan, cnt)
			cnt = 0
		}
	}
	return plan, tauc[1] + tc[1], nil
}

// OptimalMerge returns a plan of least predicted iteration time over all 2^(L-1) plans.
//
// On the DDP timeline a group's start depends on the plan before it only through the end of
// the previous group's hook, and later times only grow with it, so a dynamic programme over
// the tensor where a group ends (keeping the earliest end) is exact: O(L²).
//
// On the paper's timeline the state after a group is two times, the computation stream's
// (which merging delays: selecting a merged group costs more than selecting its parts) and
// the communication stream's (which merging advances: one α per group). Every later time is a
// non-decreasing function of both, so the programme keeps, per tensor where a group ends, the
// Pareto front of (computation, communication) pairs, which is exact. Fronts can grow large
// on long communication-bound models, so it also prunes, still exactly, every state whose
// lower bound exceeds the time of a plan already known (branch and bound): the rest of
// backward, the selections of the remaining tensors one by one (merged selections cost no
// less, n·log n being superadditive) and the last all-gather still follow the computation
// time; one α and β times the remaining bytes follow the communication time.
func OptimalMerge(m MergeModel) ([]int, error) {
	if err := m.check(); err != nil {
		return nil, err
	}
	if m.Timeline == PaperTimeline {
		return paretoMerge(m), nil
	}
	L := len(m.Sizes)
	tbSum, nSum, dSum := m.prefixSums()
	best := make([]float64, L+1) // earliest end of the last hook with a group ending at j
	from := make([]int, L+1)
	best[0] = m.Forward
	for j := 1; j <= L; j++ {
		ready := m.Forward + tbSum[j]
		best[j] = math.Inf(1)
		for i := 0; i < j; i++ {
			n, nd := nSum[j]-nSum[i], dSum[j]-dSum[i]
			if e := max(best[i], ready) + m.topk(n) + m.comm(n, nd); e < best[j] {
				best[j], from[j] = e, i
			}
		}
	}
	return planFrom(L, func(j int) int { return from[j] }), nil
}

// prefixSums returns the prefix sums of the backward times, the sparse elements and the
// dense elements.
func (m *MergeModel) prefixSums() (tbSum, nSum, dSum []float64) {
	L := len(m.Sizes)
	tbSum, nSum, dSum = make([]float64, L+1), make([]float64, L+1), make([]float64, L+1)
	for j := range L {
		sparse, dense := m.split(j)
		tbSum[j+1] = tbSum[j] + m.Backward[j]
		nSum[j+1] = nSum[j] + sparse
		dSum[j+1] = dSum[j] + dense
	}
	return tbSum, nSum, dSum
}

// planFrom turns back-pointers (the start of the group that ends at j) into group lengths.
func planFrom(L int, from func(j int) int) []int {
	var plan []int
	for j := L; j > 0; j = from(j) {
		plan = append(plan, j-from(j))
	}
	slices.Reverse(plan)
	return plan
}

// paretoMerge is OptimalMerge on the paper's timeline (see there).
func paretoMerge(m MergeModel) []int {
	L := len(m.Sizes)
	tbSum, nSum, dSum := m.prefixSums()
	// Lower bounds of what the tensors j.. still add: their selections one by one, the last
	// tensor's communication (its group's is no less), and the communication of all of them
	// in one all-gather and one all-reduce (α + β·b is subadditive).
	remSelect := make([]float64, L+1)
	for j := L - 1; j >= 0; j-- {
		sparse, _ := m.split(j)
		remSelect[j] = remSelect[j+1] + m.topk(sparse)
	}
	lastComm := m.comm(m.split(L - 1))
	bound := func(j int, comp, comm float64) float64 {
		if j == L {
			return comm
		}
		return max(comp+tbSum[L]-tbSum[j]+remSelect[j]+lastComm, comm+m.comm(nSum[L]-nSum[j], dSum[L]-dSum[j]))
	}
	// An upper bound: the best of a few plans.
	upper := math.Inf(1)
	for _, p := range [][]int{PlanLAGS(L), PlanSingle(L), greedyParetoPlan(m, tbSum, nSum, dSum)} {
		upper = min(upper, m.Predict(p))
	}
	if p, _, err := FindMergedLayers(m); err == nil {
		upper = min(upper, m.Predict(p))
	}
	upper *= 1 + 1e-9 // rounding must not prune the optimum

	type state struct {
		comp, comm float64
		from, at   int // previous group end and index in its front
	}
	fronts := make([][]state, L+1)
	fronts[0] = []state{{comp: m.Forward, comm: m.Forward, from: -1}}
	var cand []state
	for j := 1; j <= L; j++ {
		cand = cand[:0]
		for i := 0; i < j; i++ {
			n := nSum[j] - nSum[i]
			sel, ag := m.topk(n), m.comm(n, dSum[j]-dSum[i])
			for s, st := range fronts[i] {
				comp := st.comp + tbSum[j] - tbSum[i] + sel
				comm := max(st.comm, comp) + ag
				if bound(j, comp, comm) <= upper {
					cand = append(cand, state{comp: comp, comm: comm, from: i, at: s})
				}
			}
		}
		fronts[j] = paretoFront(slices.Clone(cand), func(s state) (float64, float64) { return s.comp, s.comm })
	}
	best := 0
	for s, st := range fronts[L] {
		if st.comm < fronts[L][best].comm {
			best = s
		}
	}
	var plan []int
	for j, s := L, best; j > 0; {
		st := fronts[j][s]
		plan = append(plan, j-st.from)
		j, s = st.from, st.at
	}
	slices.Reverse(plan)
	return plan
}

// greedyParetoPlan keeps one state per group end on the paper's timeline, the one whose
// all-gathers end first: a good plan, not always the best (an upper bound for paretoMerge).
func greedyParetoPlan(m MergeModel, tbSum, nSum, dSum []float64) []int {
	L := len(m.Sizes)
	comp, comm := make([]float64, L+1), make([]float64, L+1)
	from := make([]int, L+1)
	comp[0], comm[0] = m.Forward, m.Forward
	for j := 1; j <= L; j++ {
		comm[j] = math.Inf(1)
		for i := 0; i < j; i++ {
			n := nSum[j] - nSum[i]
			c := comp[i] + tbSum[j] - tbSum[i] + m.topk(n)
			e := max(comm[i], c) + m.comm(n, dSum[j]-dSum[i])
			if e < comm[j] || (e == comm[j] && c < comp[j]) {
				comp[j], comm[j], from[j] = c, e, i
			}
		}
	}
	return planFrom(L, func(j int) int { return from[j] })
}

// paretoFront keeps the states that no other state beats in both coordinates (ties: the
// first); sorted by the first coordinate.
func paretoFront[S any](states []S, key func(S) (float64, float64)) []S {
	sort.SliceStable(states, func(a, b int) bool {
		a0, a1 := key(states[a])
		b0, b1 := key(states[b])
		if a0 != b0 {
			return a0 < b0
		}
		return a1 < b1
	})
	var front []S
	best := math.Inf(1)
	for _, s := range states {
		if _, c := key(s); c < best {
			front = append(front, s)
			best = c
		}
	}
	return front
}

// maxBruteForce bounds BruteForceMerge's 2^(L-1) plans.
const maxBruteForce = 24

// BruteForceMerge tries all 2^(L-1) plans (L <= 24) and returns the first of least predicted
// time: the oracle of the planner tests.
func BruteForceMerge(m MergeModel) ([]int, error) {
	if err := m.check(); err != nil {
		return nil, err
	}
	L := len(m.Sizes)
	if L > maxBruteForce {
		return nil, fmt.Errorf("brute force over %d tensors: 2^%d plans is too many (at most %d tensors)", L, L-1, maxBruteForce)
	}
	var best []int
	bestT := math.Inf(1)
	plan := make([]int, 0, L)
	for mask := 0; mask < 1<<(L-1); mask++ { // bit j set: a group ends after tensor j
		plan = plan[:0]
		cnt := 0
		for j := range L {
			cnt++
			if j == L-1 || mask&(1<<j) != 0 {
				plan = append(plan, cnt)
				cnt = 0
			}
		}
		if t := m.Predict(plan); t < bestT {
			bestT, best = t, append([]int(nil), plan...)
		}
	}
	return best, nil
}
