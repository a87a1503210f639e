package hooks

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/spargo-dl/spargo/ddp"
)

// Option documents one option of a hook.
type Option struct {
	Name    string
	Default string
	Help    string
}

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
}

// Values are a hook's options after parsing, defaults filled in. The accessors return
// errors that name the hook, the option and the value.
type Values struct {
	hook string
	m    map[string]string
}

// String returns an option's raw value.
func (v Values) String(name string) string { return v.m[name] }

// Float parses an option as a number.
func (v Values) Float(name string) (float64, error) {
	f, err := strconv.ParseFloat(v.m[name], 64)
	if err != nil {
		return 0, fmt.Errorf("hooks: %s: option %s=%q is not a number", v.hook, name, v.m[name])
	}
	return f, nil
}

// Int parses an option as an integer.
func (v Values) Int(name string) (int, error) {
	i, err := strconv.Atoi(v.m[name])
	if err != nil {
		return 0, fmt.Errorf("hooks: %s: option %s=%q is not an integer", v.hook, name, v.m[name])
	}
	return i, nil
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

var registry = map[string]Spec{}

// Register adds a hook. It panics on a duplicate name or a spec without New: both are
// programming errors found at start-up.
func Register(s Spec) {
	if _, dup := registry[s.Name]; dup || s.New == nil || s.Name == "" {
		panic(fmt.Sprintf("hooks: bad or duplicate registration %q", s.Name))
	}
	registry[s.Name] = s
}

// Registered returns every registered hook, sorted by name.
func Registered() []Spec {
	specs := make([]Spec, 0, len(registry))
	for _, s := range registry {
		specs = append(specs, s)
	}
	sort.Slice(specs, func(i, j int) bool { return specs[i].Name < specs[j].Name })
	return specs
}

func names() string {
	var ns []string
	for _, s := range Registered() {
		ns = append(ns, s.Name)
	}
	return strings.Join(ns, ", ")
}

// Parse builds a hook from "name" or "name:key=value,key=value", or a wrapper around one
// from "wrapper+spec" (e.g. "fp16+powersgd:rank=4,start_iter=10": the options after the colon
// belong to the wrapped hook; a '+' counts only before the first colon).
func Parse(spec string) (ddp.CommHook, error) {
	if head, _, _ := strings.Cut(spec, ":"); strings.Contains(head, "+") {
		return parseWrapped(spec)
	}
	name, rest, hasOpts := strings.Cut(strings.TrimSpace(spec), ":")
	s, ok := registry[name]
	if !ok {
		return nil, fmt.Errorf("hooks: unknown hook %q in %q (registered: %s)", name, spec, names())
	}
	vals := Values{hook: name, m: map[string]string{}}
	known := map[string]bool{}
	var optNames []string
	for _, o := range s.Options {
		vals.m[o.Name] = o.Default
		known[o.Name] = true
		optNames = append(optNames, o.Name)
	}
	if hasOpts && rest != "" {
		for _, kv := range strings.Split(rest, ",") {
			k, v, ok := strings.Cut(kv, "=")
			k = strings.TrimSpace(k)
			if !ok || k == "" {
				return nil, fmt.Errorf("hooks: %s: option %q is not key=value", name, kv)
			}
			if !known[k] {
				if len(optNames) == 0 {
					return nil, fmt.Errorf("hooks: %s takes no options, got %q", name, k)
				}
				return nil, fmt.Errorf("hooks: %s has no option %q (options: %s)", name, k, strings.Join(optNames, ", "))
			}
			vals.m[k] = strings.TrimSpace(v)
		}
	}
	return s.New(vals)
}

// parseWrapped parses "wrapper+inner-spec".
func parseWrapped(spec string) (ddp.CommHook, error) {
	outer, innerSpec, _ := strings.Cut(spec, "+")
	outer = strings.TrimSpace(outer)
	s, ok := registry[outer]
	if !ok {
		return nil, fmt.Errorf("hooks: unknown hook %q in %q (registered: %s)", outer, spec, names())
	}
	if s.Wrap == nil {
		return nil, fmt.Errorf("hooks: %s in %q cannot wrap another hook (wrappers: %s)", outer, spec, wrapperNames())
	}
	inner, err := Parse(innerSpec)
	if err != nil {
		return nil, fmt.Errorf("%w (in the hook wrapped by %s in %q)", err, outer, spec)
	}
	return s.Wrap(inner)
}

func wrapperNames() string {
	var ns []string
	for _, s := range Registered() {
		if s.Wrap != nil {
			ns = append(ns, s.Name)
		}
	}
	return strings.Join(ns, ", ")
}

// MustParse is Parse for specs fixed in the program; it panics on error.
func MustParse(spec string) ddp.CommHook {
	h, err := Parse(spec)
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
		for _, o := range s.Options {
			fmt.Fprintf(&b, "    %-14s default %-8s %s\n", o.Name, o.Default, o.Help)
		}
	}
	return b.String()
}
