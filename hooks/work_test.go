package hooks

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// Ok-Topk reports every piece of its local work with the size it has in this call: the work
// counted by the meter is a sum of the pieces listed in OkTopk's doc, with counts that follow
// from what the call did (its oktopkInfo), on every rank, over calls that re-evaluate the
// thresholds, fire the guard, repartition and (balance=always) move entries.
func TestOkTopkWorkMeter(t *testing.T) {
	const p, n, density = 4, 20000, 0.01
	for _, spec := range []string{okSpec(density, "balance=never,tau=2,tau_prime=3"), okSpec(density, "balance=always,tau=2,tau_prime=3")} {
		w := newWorld(t, p, spec)
		var guarded, exactGlobal int
		for call := range 5 {
			gs := grads(uint64(call), p, n)
			units := make([][NumWork]int, p)
			if _, err := onEveryRank(w.groups, time.Minute, func(ctx context.Context, r int) error {
				ctx = WithWorkMeter(ctx, func(wk Work, u int) {
					if u < 0 || wk < 0 || wk >= NumWork {
						t.Errorf("rank %d: work %v of %d units", r, wk, u)
						return
					}
					units[r][wk] += u
				})
				_, err := w.hooks[r].Run(ctx, w.groups[r], &testBucket{last: true, flat: slices.Clone(gs[r])}).Wait()
				return err
			}); err != nil {
				t.Fatal(err)
			}
			for r := range p {
				in, u := okInfo(w, r), units[r]
				region := in.bounds[r+1] - in.bounds[r]
				exactLocal := 0
				if call%3 == 0 {
					exactLocal++
				}
				if in.localGuard {
					exactLocal++
					guarded++
				}
				want := map[Work]int{
					WorkAdd: n, WorkScale: n, WorkKth: exactLocal * n,
					WorkClear:      n + region,
					WorkScatterSet: in.global,
					WorkWalk:       in.global + in.local,
				}
				for wk, v := range want {
					if u[wk] != v {
						t.Errorf("%s call %d rank %d: %s = %d units, want %d (%+v)", spec, call, r, wk, u[wk], v, in)
					}
				}
				// Every local entry is added into the own region or packed for a peer, every
				// received one decoded and added; the all-gather packs this rank's part and
				// decodes all T entries (balancing packs and decodes what moves, besides).
				if strings.Contains(spec, "never") {
					if got, want := u[WorkScatterAdd]+u[WorkPack], in.local+in.received+in.counts[r]; got != want {
						t.Errorf("%s call %d rank %d: scatter-add %d + pack %d = %d, want local %d + received %d + own global %d", spec, call, r, u[WorkScatterAdd], u[WorkPack], got, in.local, in.received, in.counts[r])
					}
					if got, want := u[WorkUnpack], in.received+in.global; got != want {
						t.Errorf("%s call %d rank %d: unpack %d, want received %d + global %d", spec, call, r, got, in.received, in.global)
					}
				} else if u[WorkUnpack] < in.received+in.global {
					t.Errorf("%s call %d rank %d: unpack %d, want at least received %d + global %d", spec, call, r, u[WorkUnpack], in.received, in.global)
				}
				// Without the local guard: one selection of n (the reduced region's non-zeros
				// are the rest of the gather), a scan of the region, one of the reduced values
				// per global selection, and a radix select of 1 or 4 passes over them when the
				// global threshold is exact.
				exact := call%3 == 0 || in.globalGuard
				if !in.localGuard {
					reduced := u[WorkGather] - in.local
					selections := 1 + boolInt(in.globalGuard)
					if want := n + region + selections*reduced; u[WorkScan] != want {
						t.Errorf("%s call %d rank %d: scan %d, want n + region %d + %d × reduced %d = %d", spec, call, r, u[WorkScan], region, selections, reduced, want)
					}
					if h := u[WorkHistogram]; exact && h != 4*reduced && h != reduced || !exact && h != 0 {
						t.Errorf("%s call %d rank %d: histogram %d units, reduced %d, exact global threshold %v", spec, call, r, h, reduced, exact)
					}
				}
				if exact {
					exactGlobal++
				}
				if u[WorkCopy] < n {
					t.Errorf("%s call %d rank %d: copy %d, want at least n = %d", spec, call, r, u[WorkCopy], n)
				}
			}
		}
		if exactGlobal == 0 {
			t.Errorf("%s: no call computed the exact global threshold", spec)
		}
		t.Logf("%s: %d guarded local selections", spec, guarded)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Without a meter in the context the hooks report to nobody; WorkProbes covers every kind
// once, each probe runs and counts units.
func TestWorkProbes(t *testing.T) {
	workMeter(context.Background())(WorkAdd, 1) // no meter: a no-op, no panic
	x := grads(1, 1, 1<<14)[0]
	seen := map[Work]bool{}
	for _, pr := range WorkProbes(x, 0.01) {
		if seen[pr.Work] || pr.Units <= 0 || pr.Work.String() == "work(?)" {
			t.Errorf("probe %v: %d units, seen before %v", pr.Work, pr.Units, seen[pr.Work])
		}
		seen[pr.Work] = true
		a, b := pr.New(), pr.New()
		a()
		b()
	}
	if len(seen) != int(NumWork) {
		t.Errorf("%d probes, want one per kind (%d)", len(seen), NumWork)
	}
	if Work(-1).String() != "work(?)" || WorkHistogram.String() != "histogram" {
		t.Error("Work.String")
	}
}
