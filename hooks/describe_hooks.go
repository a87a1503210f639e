package hooks

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
)

// The self-descriptions of the registered hooks (describe.go lists the interfaces). Each
// cost formula is the hook's volume in words received per worker, as its type's doc derives
// it (SparDL's from the paper's Table I); k = max(1, ⌊n·density⌋).

var (
	_ ddp.WorldSizeChecker = (*GTopk)(nil)
	_ ddp.WorldSizeChecker = (*SparDL)(nil)
	_ ddp.WorldSizeChecker = (*Wrapped16)(nil)
	_ ddp.CorrectorNeeder  = (*OSP)(nil)
	_ ddp.CorrectorNeeder  = (*Wrapped16)(nil)

	_ CostDescriber      = (*SparDL)(nil)
	_ CostDescriber      = (*OkTopk)(nil)
	_ CostDescriber      = (*TopkA)(nil)
	_ CostDescriber      = (*TopkDSA)(nil)
	_ CostDescriber      = (*GTopk)(nil)
	_ CostDescriber      = (*COVAP)(nil)
	_ CostDescriber      = (*Wrapped16)(nil)
	_ SelectionDescriber = (*SparDL)(nil)
	_ SelectionDescriber = (*OkTopk)(nil)
	_ SelectionDescriber = (*TopkA)(nil)
	_ SelectionDescriber = (*TopkDSA)(nil)
	_ SelectionDescriber = (*GTopk)(nil)
	_ SelectionDescriber = (*Wrapped16)(nil)
	_ ControlTagger      = (*OkTopk)(nil)
	_ ControlTagger      = (*TopkDSA)(nil)
	_ ControlTagger      = (*Wrapped16)(nil)
	_ Merger             = (*MergedTopK)(nil)
	_ Merger             = (*OMGS)(nil)
)

// topK is k for a bucket of n elements at density d, as the cost formulas count it.
func topK(n int, d float64) int { return max(1, int(float64(n)*d)) }

// log2Ceil is ⌈log2 x⌉ for x ≥ 1.
func log2Ceil(x int) float64 { return float64(bits.Len(uint(x - 1))) }

// CheckWorldSize refuses a world size that is not a power of two (ddp.WorldSizeChecker):
// the tree reduction pairs ranks r and r+2^s.
func (h *GTopk) CheckWorldSize(p int) error {
	if !isPow2(p) {
		return errors.New("gtopk needs a power-of-two number of workers (use topka, topkdsa or spardl)")
	}
	return nil
}

// CostFormula is gTopk's bound, ≤ 4k log2 P words (CostDescriber).
func (h *GTopk) CostFormula(n, p int) (string, float64, bool) {
	return "≤ 4k log2 P", 4 * float64(topK(n, h.Density)) * log2Ceil(p), true
}

// Selection is an exact top-k of the bucket (SelectionDescriber).
func (h *GTopk) Selection(n, p int) Selection {
	return Selection{Kind: SelectTopK, K: topK(n, h.Density)}
}

// CostFormula is TopkA's all-gather of every rank's k pairs, 2k(P-1) words (CostDescriber).
func (h *TopkA) CostFormula(n, p int) (string, float64, bool) {
	return "2k(P-1)", 2 * float64(topK(n, h.Density)) * float64(p-1), true
}

// Selection is an exact top-k of the bucket (SelectionDescriber).
func (h *TopkA) Selection(n, p int) Selection {
	return Selection{Kind: SelectTopK, K: topK(n, h.Density)}
}

// CostFormula is TopkDSA's lower bound, ≥ 4k(P-1)/P words (CostDescriber).
func (h *TopkDSA) CostFormula(n, p int) (string, float64, bool) {
	pf := float64(p)
	return "≥ 4k(P-1)/P", 4 * float64(topK(n, h.Density)) * (pf - 1) / pf, true
}

// Selection is an exact top-k of the bucket (SelectionDescriber).
func (h *TopkDSA) Selection(n, p int) Selection {
	return Selection{Kind: SelectTopK, K: topK(n, h.Density)}
}

// ControlTagOffsets is the all-gather of the reduced regions' counts (ControlTagger).
func (h *TopkDSA) ControlTagOffsets() []uint32 { return []uint32{1} }

// CheckWorldSize refuses a teams=T that does not divide P (ddp.WorldSizeChecker);
// teams=auto runs at any P.
func (h *SparDL) CheckWorldSize(p int) error {
	if h.Teams != TeamsAuto && (h.Teams < 1 || p%h.Teams != 0) {
		return fmt.Errorf("spardl option teams=%d does not divide the world size (divisors of %d: %v; or teams=auto)", h.Teams, p, divisors(p))
	}
	return nil
}

// spardlTeams is the team count d the formulas assume (teams=auto counts as 1).
func (h *SparDL) spardlTeams() int { return max(1, h.Teams) }

// CostFormula is SparDL's Table I volume: 4k(P-1)/P at d = 1 team, R-SAG's for d a power of
// two, and no closed form for B-SAG, whose h adapts (CostDescriber).
func (h *SparDL) CostFormula(n, p int) (string, float64, bool) {
	k, pf, d := float64(topK(n, h.Density)), float64(p), h.spardlTeams()
	switch {
	case d == 1:
		return "4k(P-1)/P", 4 * k * (pf - 1) / pf, true
	case isPow2(d):
		df := float64(d)
		return "2k((2P-2d)/P+(d/P)log2 d)", 2 * k * ((2*pf-2*df)/pf + df/pf*log2Ceil(d)), true
	}
	return "B-SAG: h adapts, no closed form", 0, true
}

// Selection is a top-k of each of the P/d blocks the Spar-Reduce-Scatter cuts the bucket
// into (SelectionDescriber).
func (h *SparDL) Selection(n, p int) Selection {
	nt := p / h.spardlTeams()
	block := (n + nt - 1) / nt
	return Selection{Kind: SelectBlockTopK, Block: block, K: topK(block, h.Density)}
}

// CostFormula is Ok-Topk's bound, ≤ 6k(P-1)/P words (CostDescriber).
func (h *OkTopk) CostFormula(n, p int) (string, float64, bool) {
	pf := float64(p)
	return "≤ 6k(P-1)/P", 6 * float64(topK(n, h.Density)) * (pf - 1) / pf, true
}

// Selection: Ok-Topk reports every piece of its local work to the context's WorkMeter
// (SelectionDescriber).
func (h *OkTopk) Selection(n, p int) Selection { return Selection{Kind: SelectMetered} }

// ControlTagOffsets are the boundaries' all-reduce, the message sizes' all-to-all, the
// threshold histograms and the global counts' all-gather (ControlTagger).
func (h *OkTopk) ControlTagOffsets() []uint32 {
	return []uint32{okTagBounds, okTagSizes, okTagThreshold, okTagCounts}
}

// CostFormula is COVAP's dense all-reduce of one shard in I per call on average, once its
// interval is known and above 1 (CostDescriber).
func (h *COVAP) CostFormula(n, p int) (string, float64, bool) {
	pl := h.Plan()
	if pl == nil || pl.Interval <= 1 {
		return "", 0, false
	}
	pf := float64(p)
	return fmt.Sprintf("2n(P-1)/(P·I), I=%d", pl.Interval), 2 * float64(n) * (pf - 1) / pf / float64(pl.Interval), true
}

// NeedsCorrector reports whether OSP's local-gradient prediction is on (ddp.CorrectorNeeder):
// with lgp=true the optimizer must be a ddp.Corrector (optim.SGD).
func (h *OSP) NeedsCorrector() bool { return h.LGP }

// Merged returns the hook itself (Merger); OMGS inherits it.
func (h *MergedTopK) Merged() *MergedTopK { return h }

// CheckWorldSize is the inner hook's (ddp.WorldSizeChecker).
func (w *Wrapped16) CheckWorldSize(p int) error {
	if c, ok := w.Inner.(ddp.WorldSizeChecker); ok {
		return c.CheckWorldSize(p)
	}
	return nil
}

// NeedsCorrector is the inner hook's (ddp.CorrectorNeeder).
func (w *Wrapped16) NeedsCorrector() bool { return ddp.NeedsCorrector(w.Inner) }

// CostFormula is the inner hook's (CostDescriber): the wrapper rounds the values, not the
// number of words.
func (w *Wrapped16) CostFormula(n, p int) (string, float64, bool) { return CostFormula(w.Inner, n, p) }

// Selection is the inner hook's (SelectionDescriber).
func (w *Wrapped16) Selection(n, p int) Selection { return SelectionOf(w.Inner, n, p) }

// ControlTagOffsets are the inner hook's (ControlTagger).
func (w *Wrapped16) ControlTagOffsets() []uint32 { return ControlTagOffsets(w.Inner) }

// The compressed family (compress.go): one description for every compressor, from its
// Words composed with its pattern.
var (
	_ CostDescriber      = (*Compressed)(nil)
	_ SelectionDescriber = (*Compressed)(nil)
	_ ControlTagger      = (*Compressed)(nil)
)

// CostFormula is the busiest rank's words received per call (CostDescriber), w(m) the
// compressor's message of m elements: (P-1)·w(n) all-gathered; 2w(n)(P-1)/P all-reduced by
// the ring (exactly max_r 2w − b_r − b_{r+1} over the ring's blocks b_j); W + (P-2)·w(c_0) in
// two stages (W = Σ_j w(c_j) over the P chunks). A message whose length depends on the values
// (threshold) has no closed form: its expression, and 0.
func (h *Compressed) CostFormula(n, p int) (string, float64, bool) {
	c := h.Compressor
	switch h.Pattern {
	case AllReduced:
		w := c.Words(n)
		offs := chunkOffsets(w, p)
		busiest := 0
		for r := range p {
			busiest = max(busiest, 2*w-(offs[r+1]-offs[r])-(offs[(r+1)%p+1]-offs[(r+1)%p]))
		}
		return fmt.Sprintf("2w(P-1)/P, w = %s", c.WordsFormula()), float64(busiest), true
	case TwoStage:
		offs := chunkOffsets(n, p)
		total := 0
		for j := range p {
			total += c.Words(offs[j+1] - offs[j])
		}
		return fmt.Sprintf("W+(P-2)w(c₀), W = Σ_j w(c_j), w(c) = %s", strings.ReplaceAll(c.WordsFormula(), "n", "c")), float64(total + (p-2)*c.Words(offs[1])), true
	}
	w := c.Words(n)
	if w < 0 {
		// as SparDL's B-SAG: a description and no number (not the dense all-reduce's)
		return fmt.Sprintf("2(Σ_s k_s − k_r)+P-1, %s words a rank: depends on the values, no closed form", c.WordsFormula()), 0, true
	}
	return fmt.Sprintf("(P-1)w, w = %s", c.WordsFormula()), float64((p - 1) * w), true
}

// Selection is dgc's exact top-k (SelectionDescriber); the other compressors make dense
// passes only.
func (h *Compressed) Selection(n, p int) Selection {
	if d, ok := h.Compressor.(*dgc); ok {
		return Selection{Kind: SelectTopK, K: topKOfDensity(n, d.density)}
	}
	return Selection{}
}

// ControlTagOffsets is the all-gather of the message lengths of a compressor whose lengths
// depend on the values (ControlTagger).
func (h *Compressed) ControlTagOffsets() []uint32 {
	if h.Pattern == AllGathered && h.Compressor.Words(0) < 0 {
		return []uint32{compressTagLengths}
	}
	return nil
}

// hier (hier.go) describes itself from its inner hook's description at P = H on a shard of
// ⌈n/L⌉, for the topology it learnt on its first call or from a restored state; before it
// knows one, as the flat group of P nodes of one rank (where hier is its inner hook).

// HierCost is hier's volume per call in words received (4 bytes) by the busiest rank, split by
// where the words travel: inside a node (the reduce-scatter and all-gather) and across nodes
// (the inner hook on its shard).
type HierCost struct {
	Nodes, PerNode int
	// Shard is the length of the longest shard, ⌈n/L⌉, on which the inner hook runs.
	Shard      int
	IntraExpr  string
	Intra      float64
	InterExpr  string
	Inter      float64
	InterKnown bool // false when the inner hook has no closed form (Inter is then 0)
}

// CostSplit is hier's volume for a bucket of n elements on nodes × perNode ranks: inside a
// node 2n − min_i(|shard i−1| + |shard i|) (2n(L−1)/L when L divides n), across nodes the inner
// hook's formula at P = nodes on the longest shard (its CostFormula; a dense allreduce's from
// comm.AllReduce's costs).
func (h *Hier) CostSplit(n, nodes, perNode int) HierCost {
	c := HierCost{Nodes: nodes, PerNode: perNode, Shard: n, IntraExpr: "0 (one rank per node)"}
	if perNode > 1 {
		offs := shardOffsets(n, perNode)
		least := n
		for i := range perNode {
			prev := (i + perNode - 1) % perNode
			least = min(least, offs[prev+1]-offs[prev]+offs[i+1]-offs[i])
		}
		c.Shard, c.Intra = offs[1], float64(2*n-least)
		c.IntraExpr = "2n(L-1)/L"
		if n%perNode != 0 {
			c.IntraExpr = "2n-min_i(|shard i-1|+|shard i|)"
		}
	}
	if nodes == 1 {
		c.InterExpr, c.InterKnown = "0 (one node)", true
		return c
	}
	c.InterExpr, c.Inter, c.InterKnown = innerCost(h.Inner, c.Shard, nodes)
	return c
}

// innerCost is the volume of hook h on m elements among p ranks: its CostFormula, or a dense
// all-reduce's (ddp.AllReduceHook, which has no formula of its own).
func innerCost(h ddp.CommHook, m, p int) (string, float64, bool) {
	if expr, words, ok := CostFormula(h, m, p); ok {
		return expr, words, true
	}
	var alg comm.Algorithm
	switch a := h.(type) {
	case *ddp.AllReduceHook:
		alg = a.Algorithm
	case ddp.AllReduceHook:
		alg = a.Algorithm
	default:
		return "no closed form", 0, false
	}
	ring := func(q int) float64 { // the busiest rank of the ring's or Rabenseifner's blocks
		offs := shardOffsets(m, q)
		least := m
		for i := range q {
			next := (i + 1) % q
			least = min(least, offs[i+1]-offs[i]+offs[next+1]-offs[next])
		}
		return float64(2*m - least)
	}
	pp := 1 << (bits.Len(uint(p)) - 1)
	switch comm.AllReduceAlgorithm(m, p, alg) {
	case comm.RecursiveDoubling:
		if pp == p {
			return "n·log2 P", float64(m) * log2Ceil(p), true
		}
		return "n(log2 P'+1)", float64(m) * (log2Ceil(pp) + 1), true
	case comm.Rabenseifner:
		if pp != p {
			return "n+2n(P'-1)/P'", float64(m) + ring(pp), true
		}
	}
	return "2n(P-1)/P", ring(p), true
}

// hierLayoutFor is the layout hier's descriptions assume on p ranks: the one it learnt when it
// has p ranks, else p nodes of one rank.
func (h *Hier) hierLayoutFor(p int) hierLayout {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.learnt && h.lay.nodes*h.lay.perNode == p {
		return h.lay
	}
	return hierLayout{nodes: p, perNode: 1}
}

// CostFormula is the words inside a node plus the words across nodes (CostSplit), for the
// topology hier learnt (CostDescriber); with one rank per node, the inner hook's own.
func (h *Hier) CostFormula(n, p int) (string, float64, bool) {
	lay := h.hierLayoutFor(p)
	if lay.perNode == 1 {
		return innerCost(h.Inner, n, p)
	}
	c := h.CostSplit(n, lay.nodes, lay.perNode)
	if !c.InterKnown {
		return "", 0, false
	}
	return fmt.Sprintf("%s inside a node + [%s at P=H=%d on ⌈n/L⌉=%d] across, L=%d", c.IntraExpr, c.InterExpr, lay.nodes, c.Shard, lay.perNode),
		c.Intra + c.Inter, true
}

// CheckWorldSize is the inner hook's at the number of nodes, once hier knows the topology
// (ddp.WorldSizeChecker); before, it accepts any P (the first call checks).
func (h *Hier) CheckWorldSize(p int) error {
	h.mu.Lock()
	lay, learnt := h.lay, h.learnt && h.lay.nodes*h.lay.perNode == p
	h.mu.Unlock()
	if !learnt || lay.nodes == 1 {
		return nil
	}
	if c, ok := h.Inner.(ddp.WorldSizeChecker); ok {
		if err := c.CheckWorldSize(lay.nodes); err != nil {
			return fmt.Errorf("across %d nodes: %w", lay.nodes, err)
		}
	}
	return nil
}

// Selection is the inner hook's on the longest shard among the nodes (SelectionDescriber).
func (h *Hier) Selection(n, p int) Selection {
	lay := h.hierLayoutFor(p)
	if lay.perNode == 1 {
		return SelectionOf(h.Inner, n, p)
	}
	return SelectionOf(h.Inner, shardOffsets(n, lay.perNode)[1], lay.nodes)
}

// ControlTagOffsets are the inner hook's: hier's own messages are data (ControlTagger).
func (h *Hier) ControlTagOffsets() []uint32 { return ControlTagOffsets(h.Inner) }
