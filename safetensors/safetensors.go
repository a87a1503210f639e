// Package safetensors reads and writes the safetensors format of Hugging Face
// (https://github.com/huggingface/safetensors), the format PyTorch, JAX and the Hub load
// without executing code:
//
//	8 bytes     N, the header's length, unsigned little-endian
//	N bytes     JSON header: {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, …,
//	            "__metadata__": {"key": "value", …}} (the metadata optional, strings only),
//	            padded with spaces so that the data starts at a multiple of 8 bytes
//	the data    every tensor's bytes, little-endian, row-major; offsets count from the data's start
//
// It is a package of its own, not part of checkpoint, because the format is independent
// of training state: models load pre-trained weights from it and tools read spargo's
// weights with it (scripts/read_safetensors.py loads a spargo file into PyTorch with
// nothing but json and torch.frombuffer).
//
// Read checks everything a hostile or truncated file can get wrong — the header's length,
// its JSON, unknown dtypes, negative or overflowing shapes, offsets outside the data,
// tensors whose byte length does not match dtype and shape, overlapping tensors, bytes
// that belong to no tensor, duplicate names — and its errors name the file and the tensor.
package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
)

// DType is a tensor's element type, spelt as in the format.
type DType string

// The element types this package reads and writes.
const (
	F32 DType = "F32"
	F64 DType = "F64"
	I64 DType = "I64"
	I32 DType = "I32"
	U8  DType = "U8"
)

// Size returns the bytes per element, or 0 for a type this package does not know.
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	case F64, I64:
		return 8
	case U8:
		return 1
	}
	return 0
}

// MaxHeaderBytes bounds the JSON header Read accepts (the reference implementation's
// limit), so that a corrupt length does not make it allocate gigabytes.
const MaxHeaderBytes = 100 << 20

// metadataKey is the header entry holding the string-to-string metadata.
const metadataKey = "__metadata__"

// Tensor is one named array: its type, its shape and its raw little-endian bytes.
type Tensor struct {
	DType DType
	Shape []int
	Data  []byte
}

// Elements returns the product of the shape (1 for a scalar of shape []).
func (t Tensor) Elements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// FromFloat32 returns an F32 tensor holding a copy of v with the given shape (default:
// one dimension of len(v)).
func FromFloat32(v []float32, shape ...int) Tensor {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return Tensor{DType: F32, Shape: shapeOr(shape, len(v)), Data: b}
}

// FromInt64 returns an I64 tensor holding a copy of v.
func FromInt64(v []int64, shape ...int) Tensor {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return Tensor{DType: I64, Shape: shapeOr(shape, len(v)), Data: b}
}

// FromInt32 returns an I32 tensor holding a copy of v.
func FromInt32(v []int32, shape ...int) Tensor {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return Tensor{DType: I32, Shape: shapeOr(shape, len(v)), Data: b}
}

// FromBytes returns a U8 tensor holding a copy of v.
func FromBytes(v []byte, shape ...int) Tensor {
	return Tensor{DType: U8, Shape: shapeOr(shape, len(v)), Data: slices.Clone(v)}
}

func shapeOr(shape []int, n int) []int {
	if len(shape) == 0 {
		return []int{n}
	}
	return slices.Clone(shape)
}

// Float32 returns the values of an F32 tensor (a copy, bit patterns preserved).
func (t Tensor) Float32() ([]float32, error) {
	if err := t.want(F32); err != nil {
		return nil, err
	}
	v := make([]float32, len(t.Data)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return v, nil
}

// Int64 returns the values of an I64 tensor.
func (t Tensor) Int64() ([]int64, error) {
	if err := t.want(I64); err != nil {
		return nil, err
	}
	v := make([]int64, len(t.Data)/8)
	for i := range v {
		v[i] = int64(binary.LittleEndian.Uint64(t.Data[8*i:]))
	}
	return v, nil
}

// Int32 returns the values of an I32 tensor.
func (t Tensor) Int32() ([]int32, error) {
	if err := t.want(I32); err != nil {
		return nil, err
	}
	v := make([]int32, len(t.Data)/4)
	for i := range v {
		v[i] = int32(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return v, nil
}

// Bytes returns the values of a U8 tensor (a copy).
func (t Tensor) Bytes() ([]byte, error) {
	if err := t.want(U8); err != nil {
		return nil, err
	}
	return slices.Clone(t.Data), nil
}

func (t Tensor) want(d DType) error {
	if t.DType != d {
		return fmt.Errorf("tensor is %s, not %s", t.DType, d)
	}
	if len(t.Data) != t.Elements()*d.Size() {
		return fmt.Errorf("%s tensor of shape %v has %d bytes, want %d", d, t.Shape, len(t.Data), t.Elements()*d.Size())
	}
	return nil
}

// File is the content of one safetensors file: named tensors and optional metadata.
type File struct {
	Metadata map[string]string
	Tensors  map[string]Tensor
}

// New returns an empty File.
func New() *File { return &File{Metadata: map[string]string{}, Tensors: map[string]Tensor{}} }

// Names returns the tensors' names, sorted.
func (f *File) Names() []string {
	names := make([]string, 0, len(f.Tensors))
	for n := range f.Tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Float32 returns the values of the F32 tensor name; the error names the tensor.
func (f *File) Float32(name string) ([]float32, error) {
	t, ok := f.Tensors[name]
	if !ok {
		return nil, fmt.Errorf("no tensor %q", name)
	}
	v, err := t.Float32()
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %w", name, err)
	}
	return v, nil
}

// headerEntry is one tensor's header record.
type headerEntry struct {
	DType       DType    `json:"dtype"`
	Shape       []int    `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// Encode writes f to w: tensors in name order, the header padded to 8 bytes.
func (f *File) Encode(w io.Writer) error {
	names := f.Names()
	var hdr bytes.Buffer
	hdr.WriteByte('{')
	first := true
	sep := func() {
		if !first {
			hdr.WriteByte(',')
		}
		first = false
	}
	if len(f.Metadata) > 0 {
		sep()
		k, _ := json.Marshal(metadataKey)
		m, err := json.Marshal(f.Metadata)
		if err != nil {
			return fmt.Errorf("safetensors: metadata: %w", err)
		}
		hdr.Write(k)
		hdr.WriteByte(':')
		hdr.Write(m)
	}
	var off int64
	for _, name := range names {
		t := f.Tensors[name]
		if name == metadataKey {
			return fmt.Errorf("safetensors: a tensor may not be named %q", name)
		}
		if t.DType.Size() == 0 {
			return fmt.Errorf("safetensors: tensor %q: unsupported dtype %q", name, t.DType)
		}
		for _, d := range t.Shape {
			if d < 0 {
				return fmt.Errorf("safetensors: tensor %q: negative dimension in shape %v", name, t.Shape)
			}
		}
		if want := t.Elements() * t.DType.Size(); len(t.Data) != want {
			return fmt.Errorf("safetensors: tensor %q: %s of shape %v needs %d bytes, has %d", name, t.DType, t.Shape, want, len(t.Data))
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		e := headerEntry{DType: t.DType, Shape: shape, DataOffsets: [2]int64{off, off + int64(len(t.Data))}}
		off += int64(len(t.Data))
		sep()
		k, _ := json.Marshal(name)
		v, _ := json.Marshal(e)
		hdr.Write(k)
		hdr.WriteByte(':')
		hdr.Write(v)
	}
	hdr.WriteByte('}')
	for (8+hdr.Len())%8 != 0 {
		hdr.WriteByte(' ')
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(hdr.Len()))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	if _, err := w.Write(hdr.Bytes()); err != nil {
		return err
	}
	for _, name := range names {
		if _, err := w.Write(f.Tensors[name].Data); err != nil {
			return err
		}
	}
	return nil
}

// WriteFile writes f to path atomically: into a temporary file in the same directory,
// synced, then renamed over path, so that a crash leaves either the old file or the new
// one, never a partial one.
func (f *File) WriteFile(path string) error {
	return WriteAtomic(path, f.Encode)
}

// WriteAtomic creates path with the bytes write produces, through a temporary file in the
// same directory that is synced and renamed over path; on error the temporary file is
// removed and path is untouched.
func WriteAtomic(path string, write func(io.Writer) error) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err = write(tmp); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	return nil
}

// ReadFile reads and validates the safetensors file at path.
func ReadFile(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	return Decode(b, path)
}

// Decode parses and validates a whole safetensors file held in b; name (a path) is used
// in errors. The tensors' Data alias b.
func Decode(b []byte, name string) (*File, error) {
	fail := func(format string, a ...any) error {
		return fmt.Errorf("safetensors: %s: %s", name, fmt.Sprintf(format, a...))
	}
	if len(b) < 8 {
		return nil, fail("truncated: %d bytes, too short for the 8-byte header length", len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > MaxHeaderBytes {
		return nil, fail("header length %d exceeds the %d-byte limit: not a safetensors file, or a corrupt one", n, MaxHeaderBytes)
	}
	if n > uint64(len(b)-8) {
		return nil, fail("truncated: header of %d bytes, but only %d bytes follow the length", n, len(b)-8)
	}
	hdr, data := b[8:8+n], b[8+n:]
	f := New()
	entries, order, err := parseHeader(hdr, f.Metadata)
	if err != nil {
		return nil, fail("header: %v", err)
	}
	type span struct {
		name       string
		begin, end int64
	}
	spans := make([]span, 0, len(entries))
	for _, tname := range order {
		e := entries[tname]
		size := e.DType.Size()
		if size == 0 {
			return nil, fail("tensor %q: unsupported dtype %q (this reader knows F32, F64, I64, I32, U8)", tname, e.DType)
		}
		elems := int64(1)
		for _, d := range e.Shape {
			if d < 0 {
				return nil, fail("tensor %q: negative dimension in shape %v", tname, e.Shape)
			}
			if d > 0 && elems > math.MaxInt64/int64(size)/int64(d) {
				return nil, fail("tensor %q: shape %v overflows", tname, e.Shape)
			}
			elems *= int64(d)
		}
		begin, end := e.DataOffsets[0], e.DataOffsets[1]
		switch {
		case begin < 0 || end < begin:
			return nil, fail("tensor %q: data_offsets [%d, %d] are not an increasing pair", tname, begin, end)
		case end > int64(len(data)):
			return nil, fail("tensor %q: data_offsets [%d, %d] run past the %d data bytes (truncated file?)", tname, begin, end, len(data))
		case end-begin != elems*int64(size):
			return nil, fail("tensor %q: %s of shape %v needs %d bytes, data_offsets [%d, %d] give %d", tname, e.DType, e.Shape, elems*int64(size), begin, end, end-begin)
		}
		spans = append(spans, span{tname, begin, end})
		f.Tensors[tname] = Tensor{DType: e.DType, Shape: e.Shape, Data: data[begin:end:end]}
	}
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].begin != spans[j].begin {
			return spans[i].begin < spans[j].begin
		}
		return spans[i].end < spans[j].end
	})
	var pos int64
	prev := ""
	for _, s := range spans {
		switch {
		case s.begin < pos:
			return nil, fail("tensor %q (bytes %d..%d) overlaps tensor %q (ending at %d)", s.name, s.begin, s.end, prev, pos)
		case s.begin > pos:
			return nil, fail("bytes %d..%d of the data belong to no tensor (before %q)", pos, s.begin, s.name)
		}
		pos, prev = s.end, s.name
	}
	if pos != int64(len(data)) {
		return nil, fail("%d trailing data bytes belong to no tensor", int64(len(data))-pos)
	}
	return f, nil
}

// parseHeader reads the header object token by token, so that duplicate names are caught
// (encoding/json's maps keep the last silently). It fills meta and returns the entries and
// their names in header order.
func parseHeader(hdr []byte, meta map[string]string) (map[string]headerEntry, []string, error) {
	dec := json.NewDecoder(bytes.NewReader(hdr))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, nil, fmt.Errorf("not JSON: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, nil, errors.New("not a JSON object")
	}
	entries := map[string]headerEntry{}
	var order []string
	seenMeta := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, fmt.Errorf("not JSON: %v", err)
		}
		key, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, nil, fmt.Errorf("entry %q: not JSON: %v", key, err)
		}
		if key == metadataKey {
			if seenMeta {
				return nil, nil, fmt.Errorf("%s appears twice", metadataKey)
			}
			seenMeta = true
			if err := json.Unmarshal(raw, &meta); err != nil {
				return nil, nil, fmt.Errorf("%s must map strings to strings: %v", metadataKey, err)
			}
			continue
		}
		if _, dup := entries[key]; dup {
			return nil, nil, fmt.Errorf("tensor %q appears twice", key)
		}
		var e headerEntry
		d := json.NewDecoder(bytes.NewReader(raw))
		d.DisallowUnknownFields()
		if err := d.Decode(&e); err != nil {
			return nil, nil, fmt.Errorf("tensor %q: %v", key, err)
		}
		if e.DType == "" || e.Shape == nil || !bytes.Contains(raw, []byte(`"data_offsets"`)) {
			return nil, nil, fmt.Errorf("tensor %q: needs dtype, shape and data_offsets", key)
		}
		entries[key] = e
		order = append(order, key)
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, fmt.Errorf("not JSON: %v", err)
	}
	if rest := bytes.TrimRight(hdr[dec.InputOffset():], " "); len(rest) != 0 {
		return nil, nil, fmt.Errorf("%d bytes after the JSON object (only space padding is allowed)", len(rest))
	}
	return entries, order, nil
}
