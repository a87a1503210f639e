package spec

import (
	"strings"
	"testing"
)

var testOptions = []Option{
	{Name: "density", Default: "0.01", Kind: Float},
	{Name: "teams", Default: "1", Kind: Int},
	{Name: "mode", Default: "fast"},
	{Name: "exact", Default: "false", Kind: Bool},
	{Name: "limit", Kind: Int}, // unset unless given
	{Name: "betas", Default: "0.9/0.999", Kind: Floats},
	{Name: "at", Kind: Ints},
}

func bind(t *testing.T, s string) Spec {
	t.Helper()
	p, err := Parse(s)
	if err != nil {
		t.Fatalf("Parse(%q): %v", s, err)
	}
	b, err := p.Bind(testOptions)
	if err != nil {
		t.Fatalf("Bind(%q): %v", s, err)
	}
	return b
}

func TestCanonicalString(t *testing.T) {
	const want = "h:density=0.01,teams=1,mode=fast,exact=false,betas=0.9/0.999"
	for _, s := range []string{"h", "h:", " h : density=0.010", "h:teams=1,density=1e-2", "h:exact=0,mode=fast", "h:teams=01"} {
		if got := bind(t, s).String(); got != want {
			t.Errorf("%q: String() = %q, want %q", s, got, want)
		}
	}
	for s, want := range map[string]string{
		"h:density=0.1":               "h:density=0.1,teams=1,mode=fast,exact=false,betas=0.9/0.999",
		"h:limit=7,exact=TRUE":        "h:density=0.01,teams=1,mode=fast,exact=true,limit=7,betas=0.9/0.999",
		"h:mode=slow ":                "h:density=0.01,teams=1,mode=slow,exact=false,betas=0.9/0.999",
		"h:betas=0.90/9.99e-1,at=015": "h:density=0.01,teams=1,mode=fast,exact=false,betas=0.9/0.999,at=15",
		"h:at=150 / 250":              "h:density=0.01,teams=1,mode=fast,exact=false,betas=0.9/0.999,at=150/250",
	} {
		if got := bind(t, s).String(); got != want {
			t.Errorf("%q: String() = %q, want %q", s, got, want)
		}
	}
}

func TestGivenAndWith(t *testing.T) {
	b := bind(t, "h:teams=2")
	if !b.Given("teams") || b.Given("density") || b.Get("density") != "0.01" {
		t.Fatalf("given teams %v density %v, density %q", b.Given("teams"), b.Given("density"), b.Get("density"))
	}
	w, err := b.With("density", "0.50", Float)
	if err != nil || w.Get("density") != "0.5" || !w.Given("density") || b.Get("density") != "0.01" {
		t.Fatalf("With: %v %q; original now %q", err, w.Get("density"), b.Get("density"))
	}
	if _, err := b.With("rank", "4", Int); err == nil || !strings.Contains(err.Error(), `h has no option "rank" (options: density, teams, mode, exact, limit, betas, at)`) {
		t.Errorf("With(rank) = %v", err)
	}
	if _, err := b.With("teams", "two", Int); err == nil || !strings.Contains(err.Error(), `h: option teams: "two" is not an integer`) {
		t.Errorf("With(teams=two) = %v", err)
	}
}

func TestWrapper(t *testing.T) {
	p, err := Parse("fp16+powersgd:rank=4,start_iter=10")
	if err != nil {
		t.Fatal(err)
	}
	in := p.Inner()
	if p.Name() != "fp16" || len(p.Keys()) != 0 || in == nil || in.Name() != "powersgd" || in.Get("rank") != "4" || in.Get("start_iter") != "10" {
		t.Fatalf("parsed %q as %s + %v", "fp16+powersgd:rank=4,start_iter=10", p.Name(), in)
	}
	ib, err := in.Bind([]Option{{Name: "start_iter", Default: "1000", Kind: Int}, {Name: "rank", Default: "1", Kind: Int}})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.WithInner(ib).String(); got != "fp16+powersgd:start_iter=10,rank=4" {
		t.Errorf("String() = %q", got)
	}
	// A colon before the '+': the '+' belongs to a value.
	p, err = Parse("h:mode=a+b")
	if err != nil || p.Inner() != nil || p.Get("mode") != "a+b" {
		t.Errorf("h:mode=a+b: %v %v %q", err, p.Inner(), p.Get("mode"))
	}
}

func TestErrors(t *testing.T) {
	for _, tc := range []struct{ spec, want string }{
		{"", `no name in ""`},
		{":density=1", `no name in ":density=1"`},
		{"+h", `no name before '+' in "+h"`},
		{"w+", `no name in ""`},
		{"h:density", `h: option "density" is not key=value`},
		{"h:=3", `h: option "=3" is not key=value`},
		{"h:teams=2,density=0.1,teams=4", `h: option teams given twice in "h:teams=2,density=0.1,teams=4"`},
	} {
		if _, err := Parse(tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", tc.spec, err, tc.want)
		}
	}
	for _, tc := range []struct{ spec, want string }{
		{"h:rank=4", `h has no option "rank" (options: density, teams, mode, exact, limit, betas, at)`},
		{"h:density=lots", `h: option density: "lots" is not a number`},
		{"h:density=NaN", `h: option density: "NaN" is not a number`},
		{"h:teams=1.5", `h: option teams: "1.5" is not an integer`},
		{"h:exact=yes", `h: option exact: "yes" is not true or false`},
		{"h:betas=0.9/x", `h: option betas: "0.9/x" is not numbers separated by / ("x" is not a number)`},
		{"h:at=150/2.5", `h: option at: "150/2.5" is not whole numbers separated by / ("2.5" is not an integer)`},
	} {
		p, err := Parse(tc.spec)
		if err != nil {
			t.Fatalf("Parse(%q): %v", tc.spec, err)
		}
		if _, err := p.Bind(testOptions); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Bind(%q) = %v, want an error containing %q", tc.spec, err, tc.want)
		}
	}
	p, _ := Parse("noop:x=1")
	if _, err := p.Bind(nil); err == nil || !strings.Contains(err.Error(), `noop takes no options, got "x"`) {
		t.Errorf("Bind(noop:x=1) = %v", err)
	}
}

// A name that nests takes the whole spec after its colon, its colons and commas included; the
// canonical String writes it back with the colon.
func TestParseNested(t *testing.T) {
	nests := func(name string) bool { return name == "n" }
	for s, want := range map[string]string{
		"n:h":                     "n:h:density=0.01,teams=1,mode=fast,exact=false,betas=0.9/0.999",
		"n:h:teams=2,density=0.1": "n:h:density=0.1,teams=2,mode=fast,exact=false,betas=0.9/0.999",
		" n : h : density=1e-2 ":  "n:h:density=0.01,teams=1,mode=fast,exact=false,betas=0.9/0.999",
		"n:w+h:teams=3":           "n:w+h:density=0.01,teams=3,mode=fast,exact=false,betas=0.9/0.999",
		"w+n:h:teams=3":           "w+n:h:density=0.01,teams=3,mode=fast,exact=false,betas=0.9/0.999",
		"n:n:h":                   "n:n:h:density=0.01,teams=1,mode=fast,exact=false,betas=0.9/0.999",
	} {
		p, err := ParseNested(s, nests)
		if err != nil {
			t.Fatalf("ParseNested(%q): %v", s, err)
		}
		// bind the innermost name, as the owner of the names does
		var chain []Spec
		for q := p; ; q = *q.Inner() {
			chain = append(chain, q)
			if q.Inner() == nil {
				break
			}
		}
		b, err := chain[len(chain)-1].Bind(testOptions)
		if err != nil {
			t.Fatal(err)
		}
		for i := len(chain) - 2; i >= 0; i-- {
			b = chain[i].WithInner(b)
		}
		if got := b.String(); got != want {
			t.Errorf("ParseNested(%q).String() = %q, want %q", s, got, want)
		}
		if !p.Nested() && p.Name() == "n" {
			t.Errorf("ParseNested(%q): not Nested", s)
		}
	}
	if p, err := ParseNested("h:teams=2", nests); err != nil || p.Nested() || p.Get("teams") != "2" {
		t.Errorf("a name that does not nest keeps its options: %+v, %v", p, err)
	}
	if p, err := Parse("n:h"); err == nil {
		t.Errorf("Parse without nests read %q as %+v", "n:h", p)
	}
	for s, want := range map[string]string{
		"n":           "n wraps a spec: write n:SPEC",
		"n:":          "n wraps a spec: write n:SPEC",
		"n:teams=2":   "n takes no options, only the spec it wraps",
		"n:h,teams=2": "write n:h:key=value",
		"n:h:teams":   `h: option "teams" is not key=value`,
		"n::teams=2":  "no name in",
		"w+n":         "n wraps a spec",
	} {
		if _, err := ParseNested(s, nests); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseNested(%q) = %v, want an error containing %q", s, err, want)
		}
	}
}
