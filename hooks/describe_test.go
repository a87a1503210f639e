package hooks

import (
	"context"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/spargo-dl/spargo/comm/commtest"
	"github.com/spargo-dl/spargo/ddp"
)

func mustConfig(t *testing.T, s string) Config {
	t.Helper()
	c, err := ParseConfig(s)
	if err != nil {
		t.Fatalf("ParseConfig(%q): %v", s, err)
	}
	return c
}

// The same hook written differently has one canonical String; different hooks differ.
func TestConfigCanonical(t *testing.T) {
	for _, same := range [][]string{
		{"spardl", "spardl:density=0.01", "spardl:teams=1,density=0.010", " spardl : density=1e-2 ", "spardl:residual=global,teams=01"},
		{"spardl:teams=2,density=0.05", "spardl:density=0.05,teams=2", "spardl:density=5e-2,teams=2"},
		{"topka", "topka:density=0.01,dense_warmup=0", "topka:dense_warmup=0,density=.01"},
		{"fp16+powersgd:rank=4", "fp16 + powersgd:rank=04"},
		{"spardl:teams=auto", "spardl:teams=auto,density=0.01"},
	} {
		want := mustConfig(t, same[0]).String()
		for _, s := range same[1:] {
			if got := mustConfig(t, s).String(); got != want {
				t.Errorf("ParseConfig(%q).String() = %q, want %q (as %q)", s, got, want, same[0])
			}
		}
	}
	seen := map[string]string{}
	for _, s := range []string{"spardl", "spardl:density=0.02", "spardl:teams=2", "spardl:teams=auto", "topka", "gtopk",
		"fp16+topka", "bf16+topka", "fp16", "allreduce", "allreduce:algorithm=ring"} {
		c := mustConfig(t, s).String()
		if prev, dup := seen[c]; dup {
			t.Errorf("%q and %q share the canonical spec %q", prev, s, c)
		}
		seen[c] = s
	}
	if got := mustConfig(t, "spardl").String(); !strings.HasPrefix(got, "spardl:density=0.01,") || !strings.Contains(got, "teams=1") {
		t.Errorf("spardl's canonical spec %q lacks its defaults", got)
	}
	if got := mustConfig(t, "fp16+powersgd:rank=4").String(); !strings.HasPrefix(got, "fp16+powersgd:") || !strings.Contains(got, "rank=4") {
		t.Errorf("fp16+powersgd:rank=4 canonical %q", got)
	}
}

// Every registered hook: its defaults parse, the canonical spec parses back to itself, and
// New builds a fresh hook of that name every call.
func TestConfigRoundTripsEveryHook(t *testing.T) {
	for _, s := range Registered() {
		text, name := s.Name, s.Name
		if s.Nest != nil { // written with the hook it wraps
			text, name = s.Name+":allreduce", s.Name+":allreduce"
		}
		c := mustConfig(t, text)
		again := mustConfig(t, c.String())
		if again.String() != c.String() {
			t.Errorf("%s: canonical %q parses to %q", s.Name, c, again)
		}
		a, err := c.New()
		if err != nil {
			t.Fatalf("%s: New: %v", s.Name, err)
		}
		b, err := c.New()
		if err != nil {
			t.Fatalf("%s: New: %v", s.Name, err)
		}
		if a.Name() != name || b.Name() != name {
			t.Errorf("%s: New gives hooks named %q, %q", s.Name, a.Name(), b.Name())
		}
		if reflect.ValueOf(a).Kind() == reflect.Pointer && a == b { // each rank needs its own
			t.Errorf("%s: New returned the same instance twice", s.Name)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct{ spec, want string }{
		{"spardl:teams=2,teams=4", `hooks: spardl: option teams given twice in "spardl:teams=2,teams=4"`},
		{"spardl:rank=4", `hooks: spardl has no option "rank" (options: density, teams, `},
		{"noop:x=1", `hooks: noop takes no options, got "x"`},
		{"spardl:density", `hooks: spardl: option "density" is not key=value`},
		{"spardl:density=x", `hooks: spardl: option density="x" is not a number`},
		{"", `hooks: no name in ""`},
		{"nope+topka", `unknown hook "nope" in "nope+topka"`},
		{"topka+allreduce", `hooks: topka in "topka+allreduce" cannot wrap another hook (wrappers: bf16, fp16)`},
		{"fp16+nope", `unknown hook "nope" in "fp16+nope" (registered: `},
		{"fp16+spardl:teams=1,teams=1", `option teams given twice`},
		{"fp16+osp", "cannot wrap osp"},
		{"fp16+fp16", "cannot wrap the 16-bit hook fp16"},
	} {
		if _, err := ParseConfig(tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseConfig(%q) = %v, want an error containing %q", tc.spec, err, tc.want)
		}
	}
	if _, err := (Config{}).New(); err == nil || !strings.Contains(err.Error(), "ParseConfig") {
		t.Errorf("zero Config's New = %v", err)
	}
}

func TestConfigOptions(t *testing.T) {
	c := mustConfig(t, "spardl:teams=2")
	if c.Name() != "spardl" || !c.Has("density") || c.Has("rank") || c.Given("density") || !c.Given("teams") || c.Option("density") != "0.01" {
		t.Fatalf("spardl:teams=2: name %q has density %v rank %v; given density %v teams %v; density %q",
			c.Name(), c.Has("density"), c.Has("rank"), c.Given("density"), c.Given("teams"), c.Option("density"))
	}
	if n, err := c.Int("teams"); err != nil || n != 2 {
		t.Errorf("Int(teams) = %d, %v", n, err)
	}
	d, err := c.With("density", "0.050")
	if err != nil {
		t.Fatal(err)
	}
	if f, err := d.Float("density"); err != nil || f != 0.05 || !d.Given("density") || d.String() != mustConfig(t, "spardl:density=0.05,teams=2").String() {
		t.Errorf("With(density=0.050): %v %v given %v, %q", f, err, d.Given("density"), d)
	}
	h, err := d.New()
	if err != nil || h.(*SparDL).Density != 0.05 || h.(*SparDL).Teams != 2 {
		t.Errorf("New after With: %+v %v", h, err)
	}
	if _, err := c.With("density", "2"); err == nil || !strings.Contains(err.Error(), "density=2") {
		t.Errorf("With(density=2) = %v, want the hook's refusal", err)
	}
	// A wrapper's options are its inner hook's.
	w := mustConfig(t, "fp16+topka")
	if in, ok := w.Inner(); !ok || in.Name() != "topka" || w.Name() != "fp16" || !w.Has("density") || w.Given("density") {
		t.Fatalf("fp16+topka: inner %v %v, has density %v", in, ok, w.Has("density"))
	}
	w2, err := w.With("density", "0.1")
	if err != nil || w2.String() != "fp16+"+mustConfig(t, "topka:density=0.1").String() || !w2.Given("density") {
		t.Errorf("fp16+topka With(density=0.1) = %q, %v", w2, err)
	}
	h, err = w2.New()
	if err != nil || h.(*Wrapped16).Inner.(*TopkA).Density != 0.1 {
		t.Errorf("New of %q: %v, %v", w2, h, err)
	}
	if _, ok := c.Inner(); ok {
		t.Error("spardl has an inner hook")
	}
}

// Hooks say what they need (ddp.WorldSizeChecker, ddp.CorrectorNeeder) and what they cost;
// a wrapper says what its inner hook does.
func TestHooksDescribeThemselves(t *testing.T) {
	build := func(s string) ddp.CommHook {
		h, err := Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	for _, tc := range []struct {
		spec string
		p    int
		want string // "" when it runs
	}{
		{"gtopk", 8, ""}, {"gtopk", 6, "hook gtopk cannot run at world size P=6: gtopk needs a power-of-two number of workers"},
		{"fp16+gtopk", 6, "hook fp16+gtopk cannot run at world size P=6"},
		{"spardl:teams=4", 8, ""}, {"spardl:teams=4", 6, "spardl option teams=4 does not divide the world size (divisors of 6: [1 2 3 6]"},
		{"spardl:teams=auto", 7, ""}, {"spardl", 7, ""}, {"topka", 6, ""}, {"allreduce", 3, ""},
	} {
		err := ddp.CheckWorldSize(build(tc.spec), tc.p)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("CheckWorldSize(%s, %d) = %v, want %q", tc.spec, tc.p, err, tc.want)
		}
	}
	for spec, want := range map[string]bool{"osp": true, "osp:lgp=false": false, "allreduce": false, "spardl": false, "fp16+topka": false} {
		if got := ddp.NeedsCorrector(build(spec)); got != want {
			t.Errorf("NeedsCorrector(%s) = %v", spec, got)
		}
	}
	for spec, want := range map[string]int{"oktopk": 4, "fp16+oktopk": 4, "topkdsa": 1, "spardl": 0, "allreduce": 0} {
		if got := ControlTagOffsets(build(spec)); len(got) != want {
			t.Errorf("ControlTagOffsets(%s) = %v, want %d offsets", spec, got, want)
		}
	}
	for _, tc := range []struct {
		spec, expr string
		words      float64
	}{
		{"spardl", "4k(P-1)/P", 4 * 10 * 7.0 / 8}, {"spardl:teams=2", "2k((2P-2d)/P+(d/P)log2 d)", 2 * 10 * (12.0/8 + 2.0/8)},
		{"topka", "2k(P-1)", 2 * 10 * 7}, {"gtopk", "≤ 4k log2 P", 4 * 10 * 3}, {"fp16+gtopk", "≤ 4k log2 P", 4 * 10 * 3},
		{"oktopk", "≤ 6k(P-1)/P", 6 * 10 * 7.0 / 8}, {"topkdsa", "≥ 4k(P-1)/P", 4 * 10 * 7.0 / 8},
	} {
		expr, words, ok := CostFormula(build(tc.spec), 1000, 8)
		if !ok || expr != tc.expr || words != tc.words {
			t.Errorf("CostFormula(%s, n=1000, P=8) = %q %v %v, want %q %v", tc.spec, expr, words, ok, tc.expr, tc.words)
		}
	}
	if _, _, ok := CostFormula(build("allreduce"), 1000, 8); ok {
		t.Error("allreduce has a formula of its own")
	}
	for spec, want := range map[string]Selection{
		"spardl:teams=2": {Kind: SelectBlockTopK, Block: 250, K: 2}, "topka": {Kind: SelectTopK, K: 10},
		"oktopk": {Kind: SelectMetered}, "fp16+topka": {Kind: SelectTopK, K: 10}, "allreduce": {},
	} {
		if got := SelectionOf(build(spec), 1000, 8); got != want {
			t.Errorf("SelectionOf(%s, 1000, 8) = %+v, want %+v", spec, got, want)
		}
	}
	if Merged(build("omgs")) == nil || Merged(build("lags")) == nil || Merged(build("topka")) != nil {
		t.Error("Merged: omgs and lags are merging hooks, topka is not")
	}
}

// ddp.New refuses a hook that cannot run at the group's world size on every rank, before any
// message, naming the hook and P; the same hooks build a DDP where they can run.
func TestDDPNewRefusesWorldSize(t *testing.T) {
	for _, tc := range []struct {
		spec string
		p    int
		want string
	}{
		{"gtopk", 6, "ddp: hook gtopk cannot run at world size P=6"},
		{"spardl:teams=4", 6, "ddp: hook spardl cannot run at world size P=6: spardl option teams=4 does not divide"},
		{"gtopk", 4, ""},
		{"spardl:teams=3", 6, ""},
	} {
		c := mustConfig(t, tc.spec)
		groups := commtest.Groups(t, tc.p)
		errs := make([]error, tc.p)
		var wg sync.WaitGroup
		for r, g := range groups {
			wg.Go(func() {
				h, err := c.New()
				if err == nil {
					_, err = ddp.New(context.Background(), tinyNet(1), g, ddp.WithCommHook(h))
				}
				errs[r] = err
			})
		}
		wg.Wait()
		for r, err := range errs {
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("%s at P=%d, rank %d: ddp.New = %v, want %q", tc.spec, tc.p, r, err, tc.want)
			}
		}
		for _, g := range groups {
			if st := g.Counters().Snapshot(); tc.want != "" && st.MsgsSent != 0 {
				t.Errorf("%s at P=%d: rank %d sent %d messages before refusing", tc.spec, tc.p, g.Rank(), st.MsgsSent)
			}
			g.Close()
		}
	}
}
