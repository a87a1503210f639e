package hooks

import (
	"fmt"

	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/spec"
)

// Config is a parsed, validated hook spec: the hook's name and every option, defaults filled
// in. Its String is canonical, so two specs of the same hook compare equal however they were
// written ("spardl" and "spardl:density=0.01"; keys in another order; density=0.010 and
// density=1e-2): numbers are written back as the hook reads them (an option its New parses
// with Values.Float or Values.Int, or declared with a numeric Kind, in Go's shortest form).
// New builds a fresh hook from it.
//
// The zero Config is not a hook; build one with ParseConfig.
type Config struct {
	s     spec.Spec // bound and canonical; a wrapper's has no options of its own
	inner *Config   // the wrapped hook's, for "wrapper+spec"
}

// ParseConfig parses and validates a hook spec ("name", "name:key=value,…" or
// "wrapper+spec", as Parse takes): the name must be registered, every key one of its options
// and given once, and the hook must build from the values. Nothing of a run is created: call
// Config.New for each rank, since every rank needs its own hook instance.
func ParseConfig(s string) (Config, error) {
	p, err := spec.ParseNested(s, nests)
	if err != nil {
		return Config{}, fmt.Errorf("hooks: %w", err)
	}
	return resolve(p, s)
}

// resolve binds p (a part of the spec text s) to its registered hook.
func resolve(p spec.Spec, s string) (Config, error) {
	reg, ok := lookup(p.Name())
	if !ok {
		return Config{}, fmt.Errorf("hooks: unknown hook %q in %q (registered: %s)", p.Name(), s, names(false))
	}
	if in := p.Inner(); in != nil {
		switch {
		case p.Nested() && reg.Nest == nil:
			return Config{}, fmt.Errorf("hooks: %s in %q cannot wrap another hook after its colon", reg.Name, s)
		case !p.Nested() && reg.Wrap == nil && reg.Nest != nil:
			return Config{}, fmt.Errorf("hooks: %s in %q wraps a hook after a colon: write %s:%s", reg.Name, s, reg.Name, in)
		case !p.Nested() && reg.Wrap == nil:
			return Config{}, fmt.Errorf("hooks: %s in %q cannot wrap another hook (wrappers: %s)", reg.Name, s, names(true))
		}
		inner, err := resolve(*in, s)
		if err != nil {
			return Config{}, fmt.Errorf("%w (in the hook wrapped by %s in %q)", err, reg.Name, s)
		}
		c := Config{s: p.WithInner(inner.s), inner: &inner}
		if _, err := c.New(); err != nil { // the wrapper refuses some inner hooks
			return Config{}, err
		}
		return c, nil
	}
	if reg.Nest != nil { // spec.ParseNested refuses it; a Spec built otherwise may reach here
		return Config{}, fmt.Errorf("hooks: %s in %q wraps a hook: write %s:SPEC", reg.Name, s, reg.Name)
	}
	b, err := p.Bind(reg.Options)
	if err != nil {
		return Config{}, fmt.Errorf("hooks: %w", err)
	}
	vals := values(b)
	vals.read = map[string]spec.Kind{}
	if _, err := reg.New(vals); err != nil {
		return Config{}, err
	}
	for _, o := range reg.Options {
		if kind, ok := vals.read[o.Name]; ok && o.Kind == spec.Text {
			if b, err = b.Recast(o.Name, kind); err != nil {
				return Config{}, fmt.Errorf("hooks: %w", err)
			}
		}
	}
	return Config{s: b}, nil
}

// values are a bound spec's options as New takes them.
func values(b spec.Spec) Values {
	v := Values{hook: b.Name(), m: map[string]string{}}
	for _, k := range b.Keys() {
		v.m[k] = b.Get(k)
	}
	return v
}

// New builds a new hook from the configuration: call it once per rank.
func (c Config) New() (ddp.CommHook, error) {
	reg, ok := lookup(c.s.Name())
	if !ok {
		return nil, fmt.Errorf("hooks: Config %q is not a registered hook (build Configs with ParseConfig)", c.s.Name())
	}
	if c.inner != nil {
		in, err := c.inner.New()
		if err != nil {
			return nil, err
		}
		if c.s.Nested() {
			return reg.Nest(in)
		}
		return reg.Wrap(in)
	}
	return reg.New(values(c.s))
}

// String is the canonical spec: "name:key=value,…" with every option that has a value, in
// the hook's option order, or "wrapper+" ("wrapper:" for the wrappers written with a colon,
// Spec.Nest) and the wrapped hook's canonical spec.
func (c Config) String() string { return c.s.String() }

// Name is the hook's registered name; for "wrapper+spec" and "wrapper:spec" the wrapper's.
func (c Config) Name() string { return c.s.Name() }

// Inner is the wrapped hook's configuration of "wrapper+spec"; ok is false for other hooks.
func (c Config) Inner() (inner Config, ok bool) {
	if c.inner == nil {
		return Config{}, false
	}
	return *c.inner, true
}

// options is the Config that holds the options: the innermost one (a wrapper takes none of
// its own: the options after the colon of "wrapper+spec" are the wrapped hook's).
func (c Config) options() Config {
	for c.inner != nil {
		c = *c.inner
	}
	return c
}

// Has reports whether the hook takes option key (for a wrapper: the wrapped hook).
func (c Config) Has(key string) bool {
	for _, k := range c.options().s.Keys() {
		if k == key {
			return true
		}
	}
	return false
}

// Option returns option key's canonical value ("" when the hook has no such option or it is
// unset; see Has).
func (c Config) Option(key string) string { return c.options().s.Get(key) }

// Given reports whether the spec set option key itself rather than taking its default.
func (c Config) Given(key string) bool { return c.options().s.Given(key) }

// Float returns option key as a number.
func (c Config) Float(key string) (float64, error) {
	o := c.options()
	return values(o.s).Float(key)
}

// Int returns option key as an integer.
func (c Config) Int(key string) (int, error) {
	o := c.options()
	return values(o.s).Int(key)
}

// With returns the configuration with option key set to value (for a wrapper: the wrapped
// hook's option), validated as ParseConfig validates a spec.
func (c Config) With(key, value string) (Config, error) {
	if c.inner != nil {
		inner, err := c.inner.With(key, value)
		if err != nil {
			return Config{}, err
		}
		w := Config{s: c.s.WithInner(inner.s), inner: &inner}
		if _, err := w.New(); err != nil {
			return Config{}, err
		}
		return w, nil
	}
	var kind spec.Kind
	if reg, ok := lookup(c.s.Name()); ok {
		for _, o := range reg.Options {
			if o.Name == key {
				kind = o.Kind
			}
		}
	}
	b, err := c.s.With(key, value, kind)
	if err != nil {
		return Config{}, fmt.Errorf("hooks: %w", err)
	}
	return resolve(b, b.String())
}
