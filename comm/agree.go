package comm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Field is one setting that every rank of a job must share, by name ("lr", "model",
// "hook") with its value formatted the same way on every rank.
type Field struct {
	Name, Value string
}

// ConfigError is AgreeConfig's error when the ranks' settings differ: the first field (in the
// order of the lowest rank that has it) whose value is not the same on every rank, and its
// values with the ranks that have each. Every rank gets the same ConfigError.
type ConfigError struct {
	Tag    uint32
	Field  string
	Values []ConfigValue // by lowest rank
}

// ConfigValue is one value of a differing field and the ranks that have it; Missing marks
// ranks that have no such field.
type ConfigValue struct {
	Value   string
	Missing bool
	Ranks   []int
}

func (e *ConfigError) Error() string {
	parts := make([]string, len(e.Values))
	for i, v := range e.Values {
		if v.Missing {
			parts[i] = "absent on " + ranksText(v.Ranks)
		} else {
			parts[i] = fmt.Sprintf("%q on %s", v.Value, ranksText(v.Ranks))
		}
	}
	return fmt.Sprintf("comm: the ranks' settings differ: %s is %s", e.Field, strings.Join(parts, ", "))
}

func ranksText(ranks []int) string {
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = strconv.Itoa(r)
	}
	if len(ranks) == 1 {
		return "rank " + s[0]
	}
	return "ranks " + strings.Join(s, ", ")
}

// AgreeConfig checks that every rank of g passes the same fields (names, order and values),
// and is a collective over g under tag: each rank sends one SHA-256 digest of its fields
// (one small all-gather); only when the digests differ are the fields themselves gathered
// (a second all-gather under the same tag), so that every rank returns the same *ConfigError
// naming the first field that differs, each value and the ranks that have it. Call it before
// the first step with everything that must agree (model, parameter shapes, hook, optimizer,
// schedule, learning rate, batch, seed, steps…); settings that may differ per rank (its data
// shard, log level) stay out.
func AgreeConfig(ctx context.Context, g Group, tag uint32, fields []Field) error {
	if g.Size() == 1 {
		return nil
	}
	enc := encodeFields(fields)
	sum := sha256.Sum256(enc)
	digests, err := AllGatherBytes(ctx, g, tag, sum[:])
	if err != nil {
		return fmt.Errorf("comm: agreeing on the settings: %w", err)
	}
	same := true
	for _, d := range digests {
		same = same && bytes.Equal(d, sum[:])
	}
	if same {
		return nil
	}
	all, err := AllGatherBytes(ctx, g, tag, enc)
	if err != nil {
		return fmt.Errorf("comm: the ranks' settings differ (gathering them to say how: %w)", err)
	}
	ranks := make([][]Field, len(all))
	for r, b := range all {
		if ranks[r], err = decodeFields(b); err != nil {
			return fmt.Errorf("comm: the ranks' settings differ; rank %d sent them malformed: %w", r, err)
		}
	}
	if e := firstDifference(ranks); e != nil {
		e.Tag = tag
		return e
	}
	return errors.New("comm: the ranks' settings differ, but no field does (a digest was corrupted?)")
}

// firstDifference finds the first field whose value is not the same on every rank, in the
// order of the lowest rank that has the field; nil when all match (same fields, same order).
func firstDifference(ranks [][]Field) *ConfigError {
	var names []string
	seen := map[string]bool{}
	for _, fs := range ranks {
		for _, f := range fs {
			if !seen[f.Name] {
				seen[f.Name] = true
				names = append(names, f.Name)
			}
		}
	}
	for _, name := range names {
		var values []ConfigValue
		for r, fs := range ranks {
			v := ConfigValue{Missing: true}
			if i := slices.IndexFunc(fs, func(f Field) bool { return f.Name == name }); i >= 0 {
				v = ConfigValue{Value: fs[i].Value}
			}
			j := slices.IndexFunc(values, func(x ConfigValue) bool { return x.Missing == v.Missing && x.Value == v.Value })
			if j < 0 {
				values = append(values, v)
				j = len(values) - 1
			}
			values[j].Ranks = append(values[j].Ranks, r)
		}
		if len(values) > 1 {
			return &ConfigError{Field: name, Values: values}
		}
	}
	// Same names and values everywhere: the order differs.
	for r := 1; r < len(ranks); r++ {
		if !slices.Equal(ranks[r], ranks[0]) {
			return &ConfigError{Field: "(order of the fields)", Values: []ConfigValue{
				{Value: fieldNames(ranks[0]), Ranks: []int{0}}, {Value: fieldNames(ranks[r]), Ranks: []int{r}}}}
		}
	}
	return nil
}

func fieldNames(fs []Field) string {
	s := make([]string, len(fs))
	for i, f := range fs {
		s[i] = f.Name
	}
	return strings.Join(s, " ")
}

// encodeFields is the fields as length-prefixed names and values.
func encodeFields(fields []Field) []byte {
	var b []byte
	for _, f := range fields {
		b = binary.AppendUvarint(b, uint64(len(f.Name)))
		b = append(b, f.Name...)
		b = binary.AppendUvarint(b, uint64(len(f.Value)))
		b = append(b, f.Value...)
	}
	return b
}

func decodeFields(b []byte) ([]Field, error) {
	var fs []Field
	next := func() (string, error) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return "", errors.New("bad length")
		}
		s := string(b[k : k+int(n)])
		b = b[k+int(n):]
		return s, nil
	}
	for len(b) > 0 {
		name, err := next()
		if err != nil {
			return nil, err
		}
		value, err := next()
		if err != nil {
			return nil, err
		}
		fs = append(fs, Field{Name: name, Value: value})
	}
	return fs, nil
}
