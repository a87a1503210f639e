package hooks

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/spec"
)

// Option documents one option of a hook (spec.Option). A hook may leave Kind at spec.Text:
// ParseConfig then learns it from how the hook's New reads the option (see Config).
type Option = spec.Option

// Spec describes a registered hook.
type Spec struct {
	Name    string
	Summary string
	Options []Option
	// New builds the hook from options; every option is present, defaults filled in.
	New func(o Values) (ddp.CommHook, error)
	// Wrap, when set, makes the hook a wrapper too: the spec "NAME+INNER" (INNER any spec,
	// options included, e.g. "fp16+powersgd:rank=4") gives Wrap(Parse(INNER)).
	Wrap func(inner ddp.CommHook) (ddp.CommHook, error)
	// Nest, when set, makes the hook a wrapper written with a colon instead: the spec
	// "NAME:INNER", where INNER is any spec with its own colon and options
	// ("hier:spardl:density=0.01,teams=2"), gives Nest(Parse(INNER)). Such a hook takes no
	// options of its own, and "NAME" alone is refused.
	Nest func(inner ddp.CommHook) (ddp.CommHook, error)
}

// Values are a hook's options after parsing, defaults filled in. The accessors return
// errors that name the hook, the option and the value.
type Values struct {
	hook string
	m    map[string]string
	// read records the options a numeric accessor parsed, and as what: ParseConfig writes
	// those back canonically.
	read map[string]spec.Kind
}

// String returns an option's raw value.
func (v Values) String(name string) string { return v.m[name] }

// Float parses an option as a number.
func (v Values) Float(name string) (float64, error) {
	f, err := strconv.ParseFloat(v.m[name], 64)
	if err != nil {
		return 0, fmt.Errorf("hooks: %s: option %s=%q is not a number", v.hook, name, v.m[name])
	}
	v.learn(name, spec.Float)
	return f, nil
}

// Int parses an option as an integer.
func (v Values) Int(name string) (int, error) {
	i, err := strconv.Atoi(v.m[name])
	if err != nil {
		return 0, fmt.Errorf("hooks: %s: option %s=%q is not an integer", v.hook, name, v.m[name])
	}
	v.learn(name, spec.Int)
	return i, nil
}

// learn notes that name's value parsed as kind (an integer parse wins over a float one).
func (v Values) learn(name string, kind spec.Kind) {
	if v.read != nil && v.read[name] != spec.Int {
		v.read[name] = kind
	}
}

// Enum checks that an option is one of choices.
func (v Values) Enum(name string, choices ...string) (string, error) {
	s := v.m[name]
	for _, c := range choices {
		if s == c {
			return s, nil
		}
	}
	return "", fmt.Errorf("hooks: %s: option %s=%q, want one of %s", v.hook, name, s, strings.Join(choices, "|"))
}

// The registry is written by init functions and read by any goroutine that parses a spec;
// like database/sql's drivers it is guarded, so that a late Register is safe too.
var (
	registryMu sync.RWMutex
	registry   = map[string]Spec{}
)

// Register adds a hook. It panics on a duplicate name or a spec without New: both are
// programming errors found at start-up. It is safe to call from several goroutines.
func Register(s Spec) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[s.Name]; dup || s.New == nil || s.Name == "" || strings.ContainsAny(s.Name, "+:,=") {
		panic(fmt.Sprintf("hooks: bad or duplicate registration %q", s.Name))
	}
	registry[s.Name] = s
}

// nests reports whether name is a hook written "name:spec" (Spec.Nest): the spec grammar
// reads such a name's colon as the start of the spec it wraps (spec.ParseNested).
func nests(name string) bool {
	s, ok := lookup(name)
	return ok && s.Nest != nil
}

// lookup returns the registered hook called name.
func lookup(name string) (Spec, bool) {
	registryMu.RLock()
	defer registryMu.RUnlock()
	s, ok := registry[name]
	return s, ok
}

// Registered returns every registered hook, sorted by name.
func Registered() []Spec {
	registryMu.RLock()
	specs := make([]Spec, 0, len(registry))
	for _, s := range registry {
		specs = append(specs, s)
	}
	registryMu.RUnlock()
	sort.Slice(specs, func(i, j int) bool { return specs[i].Name < specs[j].Name })
	return specs
}

func names(wrappersOnly bool) string {
	var ns []string
	for _, s := range Registered() {
		if !wrappersOnly || s.Wrap != nil {
			ns = append(ns, s.Name)
		}
	}
	return strings.Join(ns, ", ")
}

// Parse builds a hook from "name" or "name:key=value,key=value", or a wrapper around one
// from "wrapper+spec" (e.g. "fp16+powersgd:rank=4,start_iter=10": the options after the colon
// belong to the wrapped hook; a '+' counts only before the first colon) or, for the wrappers
// written with a colon (Spec.Nest), "wrapper:spec" ("hier:spardl:density=0.01"). It is
// ParseConfig followed by Config.New.
//
// A hook keeps per-rank state (residuals, thresholds, plans): every rank of a group needs its
// own instance. A program that builds several parses the spec once with ParseConfig and calls
// Config.New once per rank.
func Parse(s string) (ddp.CommHook, error) {
	c, err := ParseConfig(s)
	if err != nil {
		return nil, err
	}
	return c.New()
}

// MustParse is Parse for specs fixed in the program; it panics on error.
func MustParse(s string) ddp.CommHook {
	h, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return h
}

// Help lists every registered hook with its options and defaults.
func Help() string {
	var b strings.Builder
	for _, s := range Registered() {
		fmt.Fprintf(&b, "%s\n    %s\n", s.Name, s.Summary)
		if s.Wrap != nil {
			fmt.Fprintf(&b, "    wrapper: %s+SPEC wraps the hook SPEC (SPEC's options after its colon)\n", s.Name)
		}
		if s.Nest != nil {
			fmt.Fprintf(&b, "    wrapper: %s:SPEC wraps the hook SPEC, written with its own colon and options (%s:spardl:density=0.01)\n", s.Name, s.Name)
		}
		for _, o := range s.Options {
			fmt.Fprintf(&b, "    %-14s default %-8s %s\n", o.Name, o.Default, o.Help)
		}
	}
	return b.String()
}
