package ddp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/comm/commtest"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// stateHook is a dense hook with per-rank state, like the sparse hooks' residuals.
type stateHook struct {
	AllReduceHook
	runs int
}

func (h *stateHook) Run(ctx context.Context, g comm.Group, b Bucket) Future {
	h.runs++
	return h.AllReduceHook.Run(ctx, g, b)
}

// wrapHook wraps another hook, as the 16-bit wrappers do.
type wrapHook struct{ inner CommHook }

func (w *wrapHook) Name() string { return "wrap+" + w.inner.Name() }
func (w *wrapHook) Run(ctx context.Context, g comm.Group, b Bucket) Future {
	return w.inner.Run(ctx, g, b)
}

// valWrap is a wrapper hook passed by value.
type valWrap struct{ inner CommHook }

func (w valWrap) Name() string { return "valwrap+" + w.inner.Name() }
func (w valWrap) Run(ctx context.Context, g comm.Group, b Bucket) Future {
	return w.inner.Run(ctx, g, b)
}

// mapHook is a hook value that is a reference itself.
type mapHook map[int]int

func (mapHook) Name() string { return "map" }
func (mapHook) Run(ctx context.Context, g comm.Group, b Bucket) Future {
	return AllReduceHook{}.Run(ctx, g, b)
}

// newAll runs New on every rank of groups with hook(r) and returns the DDPs and errors.
func newAll(t *testing.T, groups []comm.Group, hook func(r int) CommHook) ([]*DDP, []error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound on a hang, not a timing
	defer cancel()
	dps := make([]*DDP, len(groups))
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for r, g := range groups {
		wg.Go(func() { dps[r], errs[r] = New(ctx, smallNet(1), g, WithCommHook(hook(r))) })
	}
	wg.Wait()
	for r, err := range errs {
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("rank %d: New hung: %v", r, err)
		}
	}
	return dps, errs
}

func localGroups(t *testing.T, p int) []comm.Group {
	t.Helper()
	groups := commtest.Groups(t, p)
	return groups
}

// One hook instance given to two ranks: every rank's New fails (none waits for the
// refusing rank), and the errors say to build one hook per rank.
func TestSharedHookRefusedOnEveryRank(t *testing.T) {
	shared := &stateHook{}
	inner := &stateHook{}
	cases := map[string]func(r int) CommHook{
		"pointer":           func(int) CommHook { return shared },
		"wrapped inner":     func(int) CommHook { return &wrapHook{inner: inner} },
		"map value":         func() func(int) CommHook { m := mapHook{}; return func(int) CommHook { return m } }(),
		"value wrapping it": func(int) CommHook { return valWrap{inner: inner} },
	}
	for name, hook := range cases {
		t.Run(name, func(t *testing.T) {
			dps, errs := newAll(t, localGroups(t, 2), hook)
			for r, err := range errs {
				if err == nil {
					t.Fatalf("rank %d: New accepted a hook instance shared with another rank", r)
				}
				if !strings.Contains(err.Error(), "build one hook per rank (hooks.Config.New / hooks.Parse on each rank)") {
					t.Errorf("rank %d: %v", r, err)
				}
				if dps[r] != nil {
					t.Errorf("rank %d: New returned a DDP with its error", r)
				}
			}
			if !strings.Contains(errs[0].Error()+errs[1].Error(), "already bound to the open DDP of rank") {
				t.Errorf("no error names the rank holding the hook: %v / %v", errs[0], errs[1])
			}
		})
	}
}

func TestHookIdentity(t *testing.T) {
	h := &stateHook{}
	cases := []struct {
		name string
		hook CommHook
		ids  int
	}{
		{"stateless value", AllReduceHook{}, 0},
		{"zero-size pointer", &badPtr{}, 0}, // every zero-size allocation has the same address
		{"pointer", h, 1},
		{"pointer wrapping a pointer", &wrapHook{inner: h}, 2},
		{"value wrapping a value", valWrap{inner: AllReduceHook{}}, 0},
		{"value wrapping a pointer", valWrap{inner: h}, 1},
		{"nil map", mapHook(nil), 0},
	}
	for _, c := range cases {
		if got := hookIDs(c.hook); len(got) != c.ids {
			t.Errorf("%s: %d identities %v, want %d", c.name, len(got), got, c.ids)
		}
	}
}

type badPtr struct{}

func (*badPtr) Name() string { return "zero" }
func (*badPtr) Run(ctx context.Context, g comm.Group, b Bucket) Future {
	return AllReduceHook{}.Run(ctx, g, b)
}

// A value hook without references (AllReduceHook, the default) is copied into each DDP and
// may be shared, as may a zero-size pointer hook.
func TestStatelessHookMayBeShared(t *testing.T) {
	for _, h := range []CommHook{AllReduceHook{Algorithm: comm.Ring}, &badPtr{}} {
		dps, errs := newAll(t, localGroups(t, 2), func(int) CommHook { return h })
		for r, err := range errs {
			if err != nil {
				t.Fatalf("%T: rank %d: %v", h, r, err)
			}
			dps[r].Close()
		}
	}
}

// A hook is free again once its DDP is closed: a new world may reuse the instances, even on
// other ranks. While the DDPs are open the same instances are refused in another world.
func TestHookFreeAfterClose(t *testing.T) {
	hs := []*stateHook{{}, {}}
	first, errs := newAll(t, localGroups(t, 2), func(r int) CommHook { return hs[r] })
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	_, errs = newAll(t, localGroups(t, 2), func(r int) CommHook { return hs[r] })
	if errs[0] == nil || errs[1] == nil {
		t.Fatalf("another world took hooks bound to open DDPs: %v / %v", errs[0], errs[1])
	}
	for _, dp := range first {
		if err := dp.Close(); err != nil {
			t.Fatal(err)
		}
	}
	second, errs := newAll(t, localGroups(t, 2), func(r int) CommHook { return hs[1-r] })
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d, after Close: %v", r, err)
		}
		defer second[r].Close()
	}
	x, y := syntheticBatch(1, 2)
	err := first[0].Backward(context.Background(), nn.CrossEntropy(first[0].Forward(nn.NewTape().Const(x)), y))
	if err == nil || !strings.Contains(err.Error(), "DDP is closed") {
		t.Errorf("Backward after Close: %v", err)
	}
}

// A rank that builds its DDP again with the same hook on the same group takes the hook over;
// the old DDP then refuses to run it.
func TestRebuildOnSameRankTakesHookOver(t *testing.T) {
	groups := localGroups(t, 2)
	hs := []*stateHook{{}, {}}
	old, errs := newAll(t, groups, func(r int) CommHook { return hs[r] })
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	cur, errs := newAll(t, groups, func(r int) CommHook { return hs[r] })
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("rebuilding on the same ranks: %v", errs)
	}
	x, y := syntheticBatch(1, 2)
	err := old[0].Backward(context.Background(), nn.CrossEntropy(old[0].Forward(nn.NewTape().Const(x)), y))
	if err == nil || !strings.Contains(err.Error(), "taken over by a newer DDP") {
		t.Errorf("old DDP's Backward: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for r := range cur {
		wg.Go(func() {
			x, y := syntheticBatch(uint64(r), 2)
			errs[r] = cur[r].Backward(ctx, nn.CrossEntropy(cur[r].Forward(nn.NewTape().Const(x)), y))
		})
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("new DDP's Backward: %v", errs)
	}
	if hs[0].runs == 0 || hs[1].runs == 0 {
		t.Error("the new DDPs did not run their hooks")
	}
}

// A rank that returns before Backward closes its group (defer g.Close()): the other ranks'
// Backward fails with an error naming it instead of waiting forever, and a rank that fails
// that way closes its group too, so the failure reaches every rank (P=3: rank 2 may be
// waiting for rank 0 rather than for rank 1).
func TestEarlyReturnFailsOtherRanks(t *testing.T) {
	for _, p := range []int{2, 3} {
		t.Run(fmt.Sprint("P=", p), func(t *testing.T) {
			groups := localGroups(t, p)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound on a hang
			defer cancel()
			errs := make([]error, p)
			var wg sync.WaitGroup
			for r, g := range groups {
				wg.Go(func() {
					defer g.Close()
					errs[r] = func() error {
						dp, err := New(ctx, smallNet(1), g, WithCommHook(&stateHook{}))
						if err != nil {
							return err
						}
						defer dp.Close()
						if r == 1 {
							return errors.New("rank 1 stops before Backward")
						}
						x, y := syntheticBatch(uint64(r), 2)
						return dp.Backward(ctx, nn.CrossEntropy(dp.Forward(nn.NewTape().Const(x)), y))
					}()
				})
			}
			wg.Wait()
			for r, err := range errs {
				switch {
				case r == 1:
				case err == nil:
					t.Errorf("rank %d: Backward succeeded without rank 1", r)
				case errors.Is(err, context.DeadlineExceeded):
					t.Errorf("rank %d hung: %v", r, err)
				case !errors.Is(err, comm.ErrClosed) || !strings.Contains(err.Error(), "closed its group (it returned or failed)"):
					t.Errorf("rank %d: %v, want an error saying a rank closed its group", r, err)
				}
			}
			if p == 2 && (errs[0] == nil || !strings.Contains(errs[0].Error(), "rank 1 closed its group")) {
				t.Errorf("rank 0's error does not name rank 1: %v", errs[0])
			}
		})
	}
}

// needyHook asks for a Corrector (as OSP with lgp=true does) unless told not to.
type needyHook struct {
	AllReduceHook
	lgp bool
}

func (h *needyHook) Name() string         { return "needy" }
func (h *needyHook) NeedsCorrector() bool { return h.lgp }

// A hook that needs the optimizer's cooperation refuses Backward before SetCorrector, on
// every rank, naming the hook and the call; with SetCorrector, or with the need turned off,
// it runs.
func TestHookNeedingCorrectorRefusesWithoutIt(t *testing.T) {
	for _, c := range []struct {
		lgp, set bool
		want     string
	}{
		{lgp: true, set: false, want: "hook needy needs the optimizer's cooperation (local-gradient prediction): call dp.SetCorrector(opt)"},
		{lgp: true, set: true},
		{lgp: false, set: false},
	} {
		runRanks(t, 2, func(g comm.Group) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			dp, err := New(ctx, smallNet(1), g, WithCommHook(&needyHook{lgp: c.lgp}))
			if err != nil {
				return err
			}
			defer dp.Close()
			if c.set {
				opt, err := optim.NewSGD(dp.Parameters(), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
				if err != nil {
					return err
				}
				dp.SetCorrector(opt)
			}
			x, y := syntheticBatch(uint64(g.Rank()), 2)
			err = dp.Backward(ctx, nn.CrossEntropy(dp.Forward(nn.NewTape().Const(x)), y))
			switch {
			case c.want == "" && err != nil:
				return fmt.Errorf("lgp=%v, SetCorrector=%v: %w", c.lgp, c.set, err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				return fmt.Errorf("lgp=%v without SetCorrector: err = %v, want %q", c.lgp, err, c.want)
			}
			return nil
		})
	}
}
