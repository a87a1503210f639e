package cluster

import (
	"fmt"
	"strconv"
	"strings"
)

// ExpandNodelist expands a Slurm hostlist expression such as "node[01-04,07],gpu3" or
// "rack[1-2]-n[1-3]" into host names, in Slurm's order (ranges left to right, the last
// bracket varying fastest), keeping zero padding ("01-04" → 01 02 03 04). It refuses more
// than limit hosts (limit <= 0: MaxNodelistHosts) so a typo such as "n[1-99999999]" is an
// error, not an allocation.
func ExpandNodelist(list string, limit int) ([]string, error) {
	if limit <= 0 {
		limit = MaxNodelistHosts
	}
	items, err := splitTopLevel(list)
	if err != nil {
		return nil, err
	}
	var hosts []string
	for _, item := range items {
		if len(hosts) >= limit {
			return nil, fmt.Errorf("nodelist %q: more than %d hosts", list, limit)
		}
		expanded, err := expandHostItem(item, 0, limit-len(hosts))
		if err != nil {
			return nil, fmt.Errorf("nodelist %q (at most %d hosts): %w", list, limit, err)
		}
		hosts = append(hosts, expanded...)
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("nodelist %q names no host", list)
	}
	return hosts, nil
}

// MaxNodelistHosts is the most hosts a nodelist may name (the largest machines have about
// 10^4 nodes).
const MaxNodelistHosts = 1 << 20

// FirstNode is the first host of a Slurm hostlist expression, without expanding the rest.
func FirstNode(list string) (string, error) {
	items, err := splitTopLevel(list)
	if err != nil {
		return "", err
	}
	if len(items) == 0 {
		return "", fmt.Errorf("nodelist %q names no host", list)
	}
	hosts, err := expandHostItem(items[0], 1, MaxNodelistHosts)
	if err != nil {
		return "", fmt.Errorf("nodelist %q: %w", list, err)
	}
	return hosts[0], nil
}

// splitTopLevel splits on commas outside brackets and checks that brackets pair up.
func splitTopLevel(list string) ([]string, error) {
	var items []string
	depth, start := 0, 0
	for i, c := range list {
		switch c {
		case '[':
			if depth++; depth > 1 {
				return nil, fmt.Errorf("nodelist %q: nested '[' at byte %d", list, i)
			}
		case ']':
			if depth--; depth < 0 {
				return nil, fmt.Errorf("nodelist %q: ']' without '[' at byte %d", list, i)
			}
		case ',':
			if depth == 0 {
				if item := strings.TrimSpace(list[start:i]); item != "" {
					items = append(items, item)
				}
				start = i + 1
			}
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("nodelist %q: unclosed '['", list)
	}
	if item := strings.TrimSpace(list[start:]); item != "" {
		items = append(items, item)
	}
	return items, nil
}

// expandHostItem expands one comma-free item such as "rack[1-2]-n[01,03]". It stops after
// `want` hosts (want <= 0: all) and fails past limit hosts.
func expandHostItem(item string, want, limit int) ([]string, error) {
	// Split into literal parts and bracket groups: lit0 [g0] lit1 [g1] … litN.
	var lits []string
	var groups [][]string
	rest := item
	for {
		open := strings.IndexByte(rest, '[')
		if open < 0 {
			lits = append(lits, rest)
			break
		}
		end := strings.IndexByte(rest, ']')
		lits = append(lits, rest[:open])
		g, err := expandRanges(rest[open+1:end], limit)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", item, err)
		}
		groups = append(groups, g)
		rest = rest[end+1:]
	}
	total := 1
	for _, g := range groups {
		total *= len(g)
		if total > limit {
			return nil, fmt.Errorf("%q expands to too many hosts", item)
		}
	}
	if want > 0 && want < total {
		total = want
	}
	hosts := make([]string, 0, total)
	idx := make([]int, len(groups))
	for len(hosts) < total {
		var b strings.Builder
		for i, g := range groups {
			b.WriteString(lits[i])
			b.WriteString(g[idx[i]])
		}
		b.WriteString(lits[len(lits)-1])
		hosts = append(hosts, b.String())
		for i := len(idx) - 1; i >= 0; i-- { // odometer: the last group varies fastest
			if idx[i]++; idx[i] < len(groups[i]) {
				break
			}
			idx[i] = 0
		}
	}
	return hosts, nil
}

// expandRanges expands "01-04,07" into 01 02 03 04 07, keeping the width of the lower bound.
func expandRanges(spec string, limit int) ([]string, error) {
	var out []string
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		if part == "" || lo == "" || (isRange && hi == "") {
			return nil, fmt.Errorf("empty range in [%s]", spec)
		}
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("%q in [%s] is not a number", lo, spec)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("range %q in [%s] is not low-high", part, spec)
			}
		}
		if b-a+1 > limit-len(out) {
			return nil, fmt.Errorf("[%s] expands to too many hosts", spec)
		}
		for v := a; v <= b; v++ {
			out = append(out, fmt.Sprintf("%0*d", len(lo), v))
		}
	}
	return out, nil
}
