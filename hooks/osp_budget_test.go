package hooks

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/comm/simnet"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// budget=auto follows the paper's Algorithm 1 over epochs ended by dp.EndEpoch: 0 in epoch 1,
// then S(G^u) = (1 − loss_e/L)·U_max with L the loss at the start of training, the same on
// every rank; with a measured U_max it stays within cap·model and agrees across ranks.
func TestOSPBudgetFollowsAlgorithm1(t *testing.T) {
	const p, perEpoch = 2, 3
	for _, spec := range []string{"osp:umax=0.5", "osp"} {
		budgets := make([][][3]int, p)
		infos := make([][]ddp.EpochInfo, p)
		deferred := make([][]int, p)
		eachRank(t, p, func(ctx context.Context, g comm.Group) error {
			h, err := Parse(spec)
			if err != nil {
				return err
			}
			dp, err := ddp.New(ctx, tinyNet(3), g, ddp.WithCommHook(h), ddp.WithBucketCap(2048, 8192))
			if err != nil {
				return err
			}
			opt, _ := optim.NewSGD(dp.Parameters(), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
			dp.SetCorrector(opt)
			tape := nn.NewTape()
			x, y := syntheticBatch(uint64(5+g.Rank()), 8) // the same batch every step: the loss falls
			for epoch := range 3 {
				for s := range perEpoch {
					tape.Reset()
					opt.ZeroGrad()
					if err := dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(x)), y)); err != nil {
						return err
					}
					deferred[g.Rank()] = append(deferred[g.Rank()], dp.Stats().Deferred)
					if s == perEpoch-1 {
						if err := dp.Flush(ctx); err != nil {
							return err
						}
					}
					opt.Step()
				}
				info, err := dp.EndEpoch(ctx)
				if err != nil {
					return err
				}
				infos[g.Rank()] = append(infos[g.Rank()], info)
				sgu, umax, model := h.(*OSP).BudgetNow()
				budgets[g.Rank()] = append(budgets[g.Rank()], [3]int{sgu, umax, model})
				_ = epoch
			}
			return nil
		})
		for r := range p {
			if !slices.Equal(budgets[r], budgets[0]) {
				t.Fatalf("%s: rank %d's budgets %v differ from rank 0's %v", spec, r, budgets[r], budgets[0])
			}
		}
		L := infos[0][0].FirstLoss
		for e, b := range budgets[0] {
			sgu, umax, model := b[0], b[1], b[2]
			if umax > int(OSPCap*float64(model)) || umax < 0 {
				t.Fatalf("%s: epoch %d: U_max %d outside [0, 0.8·%d]", spec, e+1, umax, model)
			}
			if spec == "osp:umax=0.5" && umax != int(0.5*float64(model)) {
				t.Fatalf("%s: U_max %d, want half of %d", spec, umax, model)
			}
			want := int(min(max(1-infos[0][e].Loss/L, 0), 1) * float64(umax))
			if sgu != want {
				t.Fatalf("%s: after epoch %d (loss %v, L %v): S(G^u) = %d, want %d", spec, e+1, infos[0][e].Loss, L, sgu, want)
			}
			t.Logf("%s: after epoch %d: loss %.4f (L %.4f): U_max %d of %d, S(G^u) %d", spec, e+1, infos[0][e].Loss, L, umax, model, sgu)
		}
		d := deferred[0]
		if slices.ContainsFunc(d[:perEpoch], func(x int) bool { return x != 0 }) {
			t.Fatalf("%s: epoch 1 deferred %v", spec, d[:perEpoch])
		}
		smallest := slices.Min(tinyNetSizes()) // a budget below the smallest layer defers nothing
		if s := budgets[0][0][0]; s > 0 && (d[perEpoch] != 0 || (s >= smallest && d[perEpoch+1] == 0) || d[perEpoch+1] > s) {
			t.Fatalf("%s: epoch 2 (S(G^u) = %d) deferred %v: want nothing in its first iteration (no Ĝ yet), then up to S(G^u)", spec, s, d[perEpoch:2*perEpoch])
		}
		if budgets[0][0][0] == 0 && spec == "osp:umax=0.5" { // auto's U_max is measured: it may be tiny on a loaded machine
			t.Fatalf("%s: the loss did not fall in epoch 1: no budget to test", spec)
		}
	}
}

func TestOSPOptions(t *testing.T) {
	h, err := Parse("osp")
	if o := h.(*OSP); err != nil || o.Budget >= 0 || o.UMax >= 0 || o.Cap != OSPCap || !o.LGP || o.DenseWarmup != 0 {
		t.Fatalf("defaults: %+v %v", h, err)
	}
	h, err = Parse("osp:budget=0.3,cap=0.5,umax=0.2,dense_warmup=7,lgp=false,algorithm=ring")
	if o := h.(*OSP); err != nil || o.Budget != 0.3 || o.Cap != 0.5 || o.UMax != 0.2 || o.DenseWarmup != 7 || o.LGP || o.Algorithm != comm.Ring {
		t.Fatalf("options: %+v %v", h, err)
	}
	for spec, want := range map[string]string{
		"osp:budget=2":        "budget=2, want auto or a fraction in [0, 1]",
		"osp:budget=-0.1":     `budget="-0.1", want auto or a fraction`,
		"osp:cap=0":           "cap=0, want a fraction in (0, 1]",
		"osp:umax=x":          `umax="x", want auto or a fraction`,
		"osp:dense_warmup=-1": "dense_warmup=-1, want >= 0",
		"osp:lgp=maybe":       `lgp="maybe" is not true or false`,
		"fp16+osp":            "cannot wrap osp",
	} {
		if _, err := Parse(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", spec, err, want)
		}
	}
}

// tinyNetSizes are the element counts of tinyNet's parameters.
func tinyNetSizes() []int {
	var sizes []int
	for _, p := range nn.Parameters(tinyNet(1)) {
		sizes = append(sizes, p.Len())
	}
	return sizes
}

// On a simulated network OSP's budget=auto inputs are exact: it times its routine all-reduces
// and the compute window on the group's clock (comm.Now). At P = 2 a ring all-reduce of m
// elements is 2 rounds of α + 4·⌈m/2⌉·β (bytes at β seconds each), so the least-squares fit over
// the buckets must give α' = 2α and β' = 4β per element (the odd halves add 4β to a few
// buckets: a relative error of 1e-3 at most here), and T_c — from the end of an iteration's
// last routine all-reduce to the next iteration's last bucket — is the compute charged before
// each Backward plus the all-reduces of the buckets before the last, which run in the window
// on this clock. U_max is then (T_c − α')/β' whole elements, capped at 0.8 of the model.
func TestOSPFitsTheSimulatedNetwork(t *testing.T) {
	const p, steps = 2, 5
	const alpha, beta, compute = 200e-6, 4e-9, 0.004 // 200 µs, 250 MB/s, 4 ms per iteration
	net, err := simnet.New(p, simnet.Config{Alpha: alpha, Beta: beta})
	if err != nil {
		t.Fatal(err)
	}
	hs := make([]*OSP, p)
	var buckets []ddp.BucketStats
	eachRankOn(t, net.Groups(), func(ctx context.Context, g comm.Group) error {
		r := g.Rank()
		h, err := Parse("osp:algorithm=ring")
		if err != nil {
			return err
		}
		hs[r] = h.(*OSP)
		dp, err := ddp.New(ctx, tinyNet(3), g, ddp.WithCommHook(h), ddp.WithBucketCap(1024, 1024))
		if err != nil {
			return err
		}
		opt, _ := optim.NewSGD(dp.Parameters(), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
		dp.SetCorrector(opt)
		tape := nn.NewTape()
		x, y := syntheticBatch(uint64(5+r), 8)
		for s := range steps {
			net.Advance(r, compute) // the forward and backward, on this rank's clock
			tape.Reset()
			opt.ZeroGrad()
			if err := dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(x)), y)); err != nil {
				return err
			}
			if s == steps-1 {
				if err := dp.Flush(ctx); err != nil {
					return err
				}
			}
			opt.Step()
		}
		if r == 0 {
			buckets = dp.Stats().Buckets
		}
		_, err = dp.EndEpoch(ctx)
		return err
	})
	if len(buckets) < 3 {
		t.Fatalf("%d buckets: the fit needs several sizes", len(buckets))
	}
	window := compute
	for _, b := range buckets[:len(buckets)-1] {
		window += 2 * (alpha + 4*float64((b.Elements+1)/2)*beta)
	}
	h := hs[0]
	got := h.lastFit
	t.Logf("buckets %v elements; fit α %.4g s, β %.4g s/element, T_c %.6g s (want %.4g, %.4g, %.6g); U_max %d", func() []int {
		var e []int
		for _, b := range buckets {
			e = append(e, b.Elements)
		}
		return e
	}(), got[0], got[1], got[2], 2*alpha, 4*beta, window, h.uMax)
	// T_c to within one element per round of each bucket (an odd bucket's two halves differ by
	// one element, and which rank's half sets a round's end depends on the round).
	if math.Abs(got[0]-2*alpha) > 1e-3*2*alpha || math.Abs(got[1]-4*beta) > 1e-3*4*beta || math.Abs(got[2]-window) > 8*beta*float64(len(buckets))+2e-9 {
		t.Fatalf("fit α %g, β %g, T_c %g: want %g, %g, %g", got[0], got[1], got[2], 2*alpha, 4*beta, window)
	}
	if want := int(min((got[2]-got[0])/got[1], OSPCap*float64(h.modelElems))); h.uMax != want || want <= 0 {
		t.Errorf("U_max %d, want %d", h.uMax, want)
	}
	for r := range p {
		if hs[r].uMax != h.uMax {
			t.Errorf("rank %d: U_max %d, rank 0 %d", r, hs[r].uMax, h.uMax)
		}
	}
}
