package safetensors

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func sample() *File {
	f := New()
	f.Metadata["format"] = "pt"
	f.Tensors["features.0.weight"] = FromFloat32([]float32{1, -2.5, float32(math.Inf(1)), math.Float32frombits(0x7fc00123), 0, -0}, 2, 3)
	f.Tensors["step"] = FromInt64([]int64{-1, 1 << 40})
	f.Tensors["idx"] = FromInt32([]int32{7, -9, 1 << 30})
	f.Tensors["rng"] = FromBytes([]byte("pcg state"))
	f.Tensors["empty"] = FromFloat32(nil, 0, 4)
	f.Tensors["scalar"] = Tensor{DType: F32, Shape: []int{}, Data: FromFloat32([]float32{3}).Data}
	return f
}

// A written file reads back bit for bit (NaN payloads and -0 included), the header is
// padded so that the data starts at a multiple of 8, and the names are sorted.
func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	if err := sample().Encode(&buf); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	n := binary.LittleEndian.Uint64(b)
	if (8+n)%8 != 0 {
		t.Fatalf("data starts at %d, not a multiple of 8", 8+n)
	}
	f, err := Decode(b, "mem")
	if err != nil {
		t.Fatal(err)
	}
	want := sample()
	if !slices.Equal(f.Names(), want.Names()) || f.Metadata["format"] != "pt" {
		t.Fatalf("names %v metadata %v", f.Names(), f.Metadata)
	}
	for _, name := range want.Names() {
		g, w := f.Tensors[name], want.Tensors[name]
		if g.DType != w.DType || !slices.Equal(g.Shape, w.Shape) || !bytes.Equal(g.Data, w.Data) {
			t.Errorf("%s: got %s %v %x, want %s %v %x", name, g.DType, g.Shape, g.Data, w.DType, w.Shape, w.Data)
		}
	}
	v, err := f.Float32("features.0.weight")
	if err != nil || math.Float32bits(v[3]) != 0x7fc00123 || v[1] != -2.5 {
		t.Fatalf("Float32: %v %v", v, err)
	}
	if s, err := f.Tensors["step"].Int64(); err != nil || s[1] != 1<<40 {
		t.Fatalf("Int64: %v %v", s, err)
	}
	if s, err := f.Tensors["idx"].Int32(); err != nil || s[1] != -9 {
		t.Fatalf("Int32: %v %v", s, err)
	}
	if s, err := f.Tensors["rng"].Bytes(); err != nil || string(s) != "pcg state" {
		t.Fatalf("Bytes: %q %v", s, err)
	}
	if _, err := f.Tensors["idx"].Float32(); err == nil || !strings.Contains(err.Error(), "I32, not F32") {
		t.Fatalf("wrong-type read: %v", err)
	}
	if _, err := f.Float32("nosuch"); err == nil || !strings.Contains(err.Error(), `"nosuch"`) {
		t.Fatalf("missing tensor: %v", err)
	}
}

// raw builds a file from a header text and data bytes, padding nothing.
func raw(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

// Every kind of damage gives an error that names the file and, where there is one, the
// tensor; none panics.
func TestDecodeRejects(t *testing.T) {
	var good bytes.Buffer
	if err := sample().Encode(&good); err != nil {
		t.Fatal(err)
	}
	eight := make([]byte, 8)
	huge := binary.LittleEndian.AppendUint64(nil, 1<<62)
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "too short"},
		{"truncated data", good.Bytes()[:good.Len()-3], "run past"},
		{"truncated header", good.Bytes()[:40], "truncated: header of"},
		{"huge header", append(huge, "{}"...), "exceeds"},
		{"not json", raw("hello", nil), "not JSON"},
		{"not an object", raw("[1]", nil), "not a JSON object"},
		{"unknown dtype", raw(`{"a":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}}`, eight), `tensor "a": unsupported dtype "C64"`},
		{"length mismatch", raw(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, eight), `tensor "a": F32 of shape [3] needs 12 bytes`},
		{"negative dim", raw(`{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, eight), `tensor "a": negative dimension`},
		{"overflow", raw(`{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, eight), `tensor "a": shape`},
		{"reversed offsets", raw(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}}`, eight), `tensor "a": data_offsets [8, 0]`},
		{"overlap", raw(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight), "overlaps"},
		{"gap", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight), "belong to no tensor"},
		{"trailing", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, eight), "4 trailing data bytes"},
		{"duplicate", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight), `tensor "a" appears twice`},
		{"missing field", raw(`{"a":{"dtype":"F32","data_offsets":[0,8]}}`, eight), `tensor "a": needs dtype, shape and data_offsets`},
		{"unknown field", raw(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}}`, eight), `tensor "a"`},
		{"bad metadata", raw(`{"__metadata__":{"k":1}}`, nil), "__metadata__ must map strings to strings"},
		{"junk after object", raw(`{} x`, nil), "after the JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(tc.b, "dir/x.safetensors")
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), "dir/x.safetensors") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q: want the file and %q", err, tc.want)
			}
		})
	}
}

func TestEncodeRejects(t *testing.T) {
	for _, tc := range []struct {
		t    Tensor
		want string
	}{
		{Tensor{DType: "BOOL", Shape: []int{1}, Data: []byte{1}}, "unsupported dtype"},
		{Tensor{DType: F32, Shape: []int{2}, Data: []byte{1, 2, 3, 4}}, "needs 8 bytes, has 4"},
		{Tensor{DType: U8, Shape: []int{-1}}, "negative dimension"},
	} {
		f := New()
		f.Tensors["w"] = tc.t
		if err := f.Encode(&bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"w"`) {
			t.Errorf("%+v: %v, want %q", tc.t, err, tc.want)
		}
	}
}

// WriteFile replaces a file atomically and leaves no temporary file; a failing write
// leaves the old file in place.
func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	if err := sample().WriteFile(path); err != nil {
		t.Fatal(err)
	}
	bad := New()
	bad.Tensors["w"] = Tensor{DType: F32, Shape: []int{2}}
	if err := bad.WriteFile(path); err == nil {
		t.Fatal("bad file written")
	}
	f, err := ReadFile(path)
	if err != nil || len(f.Tensors) != len(sample().Tensors) {
		t.Fatalf("old file damaged: %v", err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("directory holds %d entries, want the file alone", len(ents))
	}
	if _, err := ReadFile(filepath.Join(dir, "nosuch")); err == nil || !strings.Contains(err.Error(), "nosuch") {
		t.Fatalf("missing file: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	var good bytes.Buffer
	sample().Encode(&good)
	f.Add(good.Bytes())
	f.Add(raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, make([]byte, 4)))
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := Decode(b, "fuzz")
		if err != nil {
			return
		}
		var out bytes.Buffer
		if err := file.Encode(&out); err != nil {
			t.Fatalf("a decoded file does not encode: %v", err)
		}
	})
}
