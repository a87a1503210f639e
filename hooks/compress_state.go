package hooks

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Vectors are a bucket's named vectors of a compressed hook beside its residual (DGC's and
// Signum's momenta, the two-stage pattern's server residual), each the bucket's length,
// created as zeros on first use and saved with the hook's state.
type Vectors struct {
	n int
	m map[string][]float32
}

// Get returns the vector called name, creating it as n zeros on first use.
func (v Vectors) Get(name string) []float32 {
	x, ok := v.m[name]
	if !ok {
		x = make([]float32, v.n)
		v.m[name] = x
	}
	return x
}

// vectorMemory holds every bucket's Vectors for one rank's hook; keys
// "<hook>.vec.bucket<i>.<name>".
type vectorMemory struct {
	hook    string
	mu      sync.Mutex
	buckets map[int]Vectors
}

func newVectorMemory(hook string) *vectorMemory {
	return &vectorMemory{hook: hook, buckets: map[int]Vectors{}}
}

func (m *vectorMemory) prefix() string { return m.hook + ".vec.bucket" }

// bucket returns bucket idx's vectors; a restored vector of another length than the bucket's
// n is refused (the Memory refuses the rest of a changed plan).
func (m *vectorMemory) bucket(idx, n int) (Vectors, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.buckets[idx]
	if !ok {
		v = Vectors{n: n, m: map[string][]float32{}}
		m.buckets[idx] = v
	}
	if v.n != n {
		return Vectors{}, fmt.Errorf("hooks: %s: bucket %d has %d elements, its saved vectors %d: state saved under a different bucket plan", m.hook, idx, n, v.n)
	}
	return v, nil
}

// saveInto adds the vectors to a state map.
func (m *vectorMemory) saveInto(st map[string][]float32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for idx, v := range m.buckets {
		for name, x := range v.m {
			st[fmt.Sprintf("%s%d.%s", m.prefix(), idx, name)] = append([]float32(nil), x...)
		}
	}
}

// split separates the vectors' keys of a state map from the Memory's.
func (m *vectorMemory) split(st map[string][]float32) (mem, vecs map[string][]float32) {
	mem, vecs = map[string][]float32{}, map[string][]float32{}
	for k, v := range st {
		if strings.HasPrefix(k, m.prefix()) {
			vecs[k] = v
		} else {
			mem[k] = v
		}
	}
	return mem, vecs
}

// load replaces the vectors with saved ones; a bucket's vectors must have one length.
func (m *vectorMemory) load(st map[string][]float32) error {
	buckets := map[int]Vectors{}
	keys := make([]string, 0, len(st))
	for k := range st {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		num, name, ok := strings.Cut(strings.TrimPrefix(k, m.prefix()), ".")
		idx, err := strconv.Atoi(num)
		if !ok || err != nil || idx < 0 || name == "" {
			return fmt.Errorf("hooks: %s: LoadState: malformed key %q", m.hook, k)
		}
		v, seen := buckets[idx]
		if !seen {
			v = Vectors{n: len(st[k]), m: map[string][]float32{}}
			buckets[idx] = v
		}
		if len(st[k]) != v.n {
			return fmt.Errorf("hooks: %s: LoadState: %q has %d values, the bucket's other vectors %d", m.hook, k, len(st[k]), v.n)
		}
		v.m[name] = append([]float32(nil), st[k]...)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.buckets = buckets
	return nil
}

// bitPacker appends fixed-width fields to a message, 32 bits to a little-endian word, the
// first field in the lowest bits; bytes pads the last word with zeros.
type bitPacker struct {
	b   []byte
	acc uint64
	n   uint
}

// put appends the low width bits of v (width <= 32).
func (p *bitPacker) put(v uint32, width uint) {
	p.acc |= uint64(v&(1<<width-1)) << p.n
	p.n += width
	if p.n >= 32 {
		p.b = binary.LittleEndian.AppendUint32(p.b, uint32(p.acc))
		p.acc >>= 32
		p.n -= 32
	}
}

// bytes returns the message with the last word padded.
func (p *bitPacker) bytes() []byte {
	if p.n > 0 {
		p.b = binary.LittleEndian.AppendUint32(p.b, uint32(p.acc))
		p.acc, p.n = 0, 0
	}
	return p.b
}

// bitReader reads bitPacker's fields back.
type bitReader struct {
	b   []byte
	acc uint64
	n   uint
}

// get returns the next width bits; the caller has checked the message's length.
func (r *bitReader) get(width uint) uint32 {
	if r.n < width {
		r.acc |= uint64(binary.LittleEndian.Uint32(r.b)) << r.n
		r.b = r.b[4:]
		r.n += 32
	}
	v := uint32(r.acc & (1<<width - 1))
	r.acc >>= width
	r.n -= width
	return v
}

// packedWords is the number of words of n fields of width bits.
func packedWords(n int, width uint) int { return (n*int(width) + 31) / 32 }

// checkWords is the length check of a fixed-length message: want words for n elements.
func checkWords(msg []byte, n, want int) error {
	if len(msg) != 4*want {
		return fmt.Errorf("message of %d bytes for %d elements, want %d words", len(msg), n, want)
	}
	return nil
}

// putFloat appends f as a word; getFloat reads the word at word offset i.
func putFloat(b []byte, f float32) []byte {
	return binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
}

func getFloat(b []byte, i int) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
}
