// Package spec is the one grammar of spargo's configuration strings: a name, optionally
// followed by options, "name" or "name:key=value,key=value", and a wrapper around another
// spec, "wrapper+spec" ("fp16+powersgd:rank=4": a '+' counts only before the first colon, and
// the options after the colon belong to the innermost name). Some wrappers take the spec they
// wrap after a colon instead, "wrapper:spec" ("hier:spardl:density=0.01,teams=2": everything
// after the wrapper's colon, colons and commas included, is the wrapped spec); the owner of
// the names says which (ParseNested). Comm hooks (hooks.ParseConfig),
// optimizers (optim.ParseOptimizerConfig) and learning-rate schedules
// (optim.ParseScheduleConfig) are all written in it.
//
// Parsing happens in two steps. Parse reads the syntax: a repeated key, an option that is not
// key=value and an empty name are refused. Bind checks the options against the list a name
// takes (an unknown key is refused, naming the options), fills in the defaults and writes
// every value in its canonical form: numbers in Go's shortest form (density=0.010 and
// density=1e-2 both become density=0.01), booleans as true or false. The bound Spec's String
// is then canonical: two specs that mean the same give the same String, whatever their key
// order or number spelling, so a checkpoint can store and compare it.
//
// Package spec imports nothing of spargo; the packages that own the names (hooks, optim)
// hold the option lists and build the values.
package spec

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Kind says how an option's value is read and canonicalised.
type Kind int

const (
	// Text values are kept as written (spaces around them trimmed).
	Text Kind = iota
	// Int values are whole numbers, written back in decimal.
	Int
	// Float values are finite numbers, written back in Go's shortest form ('g', -1).
	Float
	// Bool values are anything strconv.ParseBool takes, written back as true or false.
	Bool
	// Ints are whole numbers separated by '/' ("150/250"), each written back as Int.
	Ints
	// Floats are numbers separated by '/' ("0.9/0.999"), each written back as Float.
	Floats
)

// Option is one key a name takes. An empty Default means the option is unset unless given:
// a canonical String leaves unset options out.
type Option struct {
	Name    string
	Default string
	Help    string
	Kind    Kind
}

// Spec is a parsed spec: before Bind its options as written, after Bind every option of
// the name in the option list's order, defaults filled in and values canonical.
type Spec struct {
	name  string
	inner *Spec
	// nested: inner follows the name's colon ("wrapper:spec"), not a '+'
	nested bool
	keys   []string
	vals   map[string]string
	given  map[string]bool
	bound  bool
}

// Parse reads "name", "name:key=value,…" or "wrapper+spec". Errors start with the name (or
// quote the spec when the name is missing), for the caller to prefix with what it parses.
func Parse(s string) (Spec, error) { return ParseNested(s, nil) }

// ParseNested is Parse for a grammar in which the names for which nests reports true wrap the
// spec that follows their colon: "wrapper:spec", where spec is any spec with its own colon and
// options ("hier:spardl:density=0.01,teams=2" wraps "spardl:density=0.01,teams=2"), nested
// wrappers included ("hier:fp16+powersgd:rank=4"). Such a name takes no options of its own:
// "wrapper", "wrapper:" and "wrapper:key=value" are refused, naming the form to write. A nil
// nests is Parse.
func ParseNested(s string, nests func(name string) bool) (Spec, error) {
	head, rest, hasOpts := strings.Cut(strings.TrimSpace(s), ":")
	if outer, innerText, wraps := strings.Cut(head, "+"); wraps {
		outer = strings.TrimSpace(outer)
		if outer == "" {
			return Spec{}, fmt.Errorf("no name before '+' in %q", s)
		}
		if hasOpts {
			innerText += ":" + rest
		}
		inner, err := ParseNested(innerText, nests)
		if err != nil {
			return Spec{}, err
		}
		return Spec{name: outer, inner: &inner, vals: map[string]string{}, given: map[string]bool{}}, nil
	}
	sp := Spec{name: strings.TrimSpace(head), vals: map[string]string{}, given: map[string]bool{}}
	if sp.name == "" {
		return Spec{}, fmt.Errorf("no name in %q", s)
	}
	if nests != nil && nests(sp.name) {
		return parseNestedInner(sp, s, rest, hasOpts, nests)
	}
	if !hasOpts || strings.TrimSpace(rest) == "" {
		return sp, nil
	}
	for _, kv := range strings.Split(rest, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return Spec{}, fmt.Errorf("%s: option %q is not key=value", sp.name, kv)
		}
		if sp.given[k] {
			return Spec{}, fmt.Errorf("%s: option %s given twice in %q", sp.name, k, s)
		}
		sp.keys = append(sp.keys, k)
		sp.vals[k], sp.given[k] = strings.TrimSpace(v), true
	}
	return sp, nil
}

// parseNestedInner reads the spec that follows the colon of wrapper sp ("wrapper:spec", in
// s); rest is the text after that colon.
func parseNestedInner(sp Spec, s, rest string, hasColon bool, nests func(string) bool) (Spec, error) {
	rest = strings.TrimSpace(rest)
	if !hasColon || rest == "" {
		return Spec{}, fmt.Errorf("%s wraps a spec: write %s:SPEC (%q has none after the colon)", sp.name, sp.name, s)
	}
	if i := strings.IndexAny(rest, ":,="); i >= 0 {
		switch rest[i] {
		case '=':
			return Spec{}, fmt.Errorf("%s takes no options, only the spec it wraps: write %s:SPEC (got %q in %q)", sp.name, sp.name, rest, s)
		case ',':
			return Spec{}, fmt.Errorf("%s: the wrapped spec's options follow its own colon: write %s:%s:key=value,… (got %q in %q)",
				sp.name, sp.name, strings.TrimSpace(rest[:i]), rest, s)
		}
	}
	inner, err := ParseNested(rest, nests)
	if err != nil {
		return Spec{}, err
	}
	sp.inner, sp.nested = &inner, true
	return sp, nil
}

// Name is the spec's name; for "wrapper+spec" the wrapper's.
func (s Spec) Name() string { return s.name }

// Nested reports whether the spec is "wrapper:spec" (ParseNested), whose Inner follows the
// wrapper's colon; false for "wrapper+spec" and specs that wrap nothing.
func (s Spec) Nested() bool { return s.inner != nil && s.nested }

// Inner is the wrapped spec of "wrapper+spec", or nil.
func (s Spec) Inner() *Spec { return s.inner }

// Get returns an option's value ("" when unset).
func (s Spec) Get(key string) string { return s.vals[key] }

// Given reports whether the spec as written set key (With counts as writing it).
func (s Spec) Given(key string) bool { return s.given[key] }

// Keys returns the options in order: as written before Bind, the option list's order after.
func (s Spec) Keys() []string { return append([]string(nil), s.keys...) }

// Bind checks the options against the list the name takes and returns the canonical spec:
// every option of the list present in its order, defaults filled in, values canonical for
// their Kind. It binds the spec itself, not its Inner (bind that against the inner name's
// list and set it back with WithInner). Errors start with the name.
func (s Spec) Bind(options []Option) (Spec, error) {
	var names []string
	known := map[string]Option{}
	for _, o := range options {
		names = append(names, o.Name)
		known[o.Name] = o
	}
	for _, k := range s.keys {
		if _, ok := known[k]; ok {
			continue
		}
		if len(names) == 0 {
			return Spec{}, fmt.Errorf("%s takes no options, got %q", s.name, k)
		}
		return Spec{}, fmt.Errorf("%s has no option %q (options: %s)", s.name, k, strings.Join(names, ", "))
	}
	b := Spec{name: s.name, inner: s.inner, nested: s.nested, keys: names, vals: map[string]string{}, given: map[string]bool{}, bound: true}
	for _, o := range options {
		v, given := s.vals[o.Name], s.given[o.Name]
		if !given {
			v = o.Default
		}
		if v != "" {
			c, err := Canonical(o.Kind, v)
			if err != nil {
				return Spec{}, fmt.Errorf("%s: option %s: %w", s.name, o.Name, err)
			}
			v = c
		}
		b.vals[o.Name], b.given[o.Name] = v, given
	}
	return b, nil
}

// With returns the bound spec with key set to value (canonical for kind), counted as given.
// The key must be one of the bound options.
func (s Spec) With(key, value string, kind Kind) (Spec, error) {
	if !s.bound {
		return Spec{}, fmt.Errorf("%s: With on a spec that is not bound", s.name)
	}
	if _, ok := s.vals[key]; !ok {
		if len(s.keys) == 0 {
			return Spec{}, fmt.Errorf("%s takes no options, got %q", s.name, key)
		}
		return Spec{}, fmt.Errorf("%s has no option %q (options: %s)", s.name, key, strings.Join(s.keys, ", "))
	}
	c, err := Canonical(kind, strings.TrimSpace(value))
	if err != nil {
		return Spec{}, fmt.Errorf("%s: option %s: %w", s.name, key, err)
	}
	out := s.clone()
	out.vals[key], out.given[key] = c, true
	return out, nil
}

// Recast rewrites key's value in the canonical form of kind, leaving Given as it is: for
// owners that learn an option's kind after Bind (hooks learns it from how a hook reads it).
func (s Spec) Recast(key string, kind Kind) (Spec, error) {
	v, ok := s.vals[key]
	if !ok || v == "" {
		return s, nil
	}
	c, err := Canonical(kind, v)
	if err != nil {
		return Spec{}, fmt.Errorf("%s: option %s: %w", s.name, key, err)
	}
	out := s.clone()
	out.vals[key] = c
	return out, nil
}

// WithInner returns the spec with its wrapped spec replaced by inner.
func (s Spec) WithInner(inner Spec) Spec {
	out := s.clone()
	out.inner = &inner
	return out
}

func (s Spec) clone() Spec {
	out := s
	out.keys = append([]string(nil), s.keys...)
	out.vals, out.given = map[string]string{}, map[string]bool{}
	for k, v := range s.vals {
		out.vals[k] = v
	}
	for k, v := range s.given {
		out.given[k] = v
	}
	return out
}

// String writes the spec back: "name", "name:key=value,…" in Keys order, leaving out
// unset options, or "wrapper+" (for a Nested spec "wrapper:") and the wrapped spec's String.
// For a bound spec (and a bound Inner) it is the canonical form.
func (s Spec) String() string {
	if s.inner != nil {
		if s.nested {
			return s.name + ":" + s.inner.String()
		}
		return s.name + "+" + s.inner.String()
	}
	var opts []string
	for _, k := range s.keys {
		if v := s.vals[k]; v != "" {
			opts = append(opts, k+"="+v)
		}
	}
	if len(opts) == 0 {
		return s.name
	}
	return s.name + ":" + strings.Join(opts, ",")
}

// Canonical writes value in the canonical form of kind; an error says why value is not one.
func Canonical(kind Kind, value string) (string, error) {
	switch kind {
	case Int:
		i, err := strconv.Atoi(value)
		if err != nil {
			return "", fmt.Errorf("%q is not an integer", value)
		}
		return strconv.Itoa(i), nil
	case Float:
		f, err := strconv.ParseFloat(value, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return "", fmt.Errorf("%q is not a number", value)
		}
		return FormatFloat(f), nil
	case Bool:
		b, err := strconv.ParseBool(value)
		if err != nil {
			return "", fmt.Errorf("%q is not true or false", value)
		}
		return strconv.FormatBool(b), nil
	case Ints, Floats:
		one, what := Int, "whole numbers"
		if kind == Floats {
			one, what = Float, "numbers"
		}
		parts := strings.Split(value, "/")
		for i, p := range parts {
			c, err := Canonical(one, strings.TrimSpace(p))
			if err != nil {
				return "", fmt.Errorf("%q is not %s separated by / (%w)", value, what, err)
			}
			parts[i] = c
		}
		return strings.Join(parts, "/"), nil
	}
	return value, nil
}

// FormatFloat writes x in the shortest form that parses back to x exactly.
func FormatFloat(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
