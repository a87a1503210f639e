package datasets

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The committed fixtures (see docs/data.md): small copies in the
// official layouts, so that no test needs a real data set.
var (
	cifar10Fixture = filepath.Join("..", "testdata", "cifar10-mini")
	ptbFixture     = filepath.Join("..", "testdata", "ptb-mini")
	aclImdbFixture = filepath.Join("..", "testdata", "aclImdb-mini")
)

// realData returns the directory of a real copy of d found on the search
// path ($SPARGO_DATA, the user cache; never a download), or skips the test
// with what to do to run it.
func realData(t *testing.T, d *Dataset) string {
	t.Helper()
	dir, err := Lookup(d, "")
	if errors.Is(err, ErrNotFound) {
		t.Skipf("no real %s on this machine: to run this test set %s=ROOT where ROOT/%s/ holds %s (from %s); the fixture tests cover the code without it",
			d, DataEnv, d.Name(), d.holds, strings.Join(d.URLs(), " "))
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// record is one generated CIFAR record: labels (1 or 2 bytes) and a seed
// from which its pixels are derived.
type record struct {
	labels []byte
	seed   byte
}

// recordPixels is the deterministic pixel content of a generated record.
func recordPixels(seed byte) []byte {
	p := make([]byte, cifarPixels)
	for i := range p {
		p[i] = byte(i*7) ^ seed
	}
	return p
}

// writeRecords writes records in the official layout to path.
func writeRecords(t testing.TB, path string, recs []record) {
	t.Helper()
	var buf []byte
	for _, r := range recs {
		buf = append(buf, r.labels...)
		buf = append(buf, recordPixels(r.seed)...)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
}

// The fixture's records are the first 16 of the official data_batch_1.bin
// and the first 8 of test_batch.bin, byte for byte.
func TestCIFAR10Fixture(t *testing.T) {
	train, test, err := LoadCIFAR10(cifar10Fixture)
	if err != nil {
		t.Fatal(err)
	}
	if train.N != 16 || len(train.Labels) != 16 || len(train.Pixels) != 16*3072 || test.N != 8 {
		t.Fatalf("train N=%d labels=%d pixels=%d, test N=%d", train.N, len(train.Labels), len(train.Pixels), test.N)
	}
	for _, c := range []struct {
		i     int
		label int32
		red   []uint8
	}{
		{0, 6, []uint8{59, 43, 50}},
		{1, 9, []uint8{154, 126, 105}},
	} {
		if got := train.Labels[c.i]; got != c.label {
			t.Errorf("train record %d label = %d, want %d", c.i, got, c.label)
		}
		if got := train.Image(c.i)[:3]; !slices.Equal(got, c.red) {
			t.Errorf("train record %d R plane starts %v, want %v", c.i, got, c.red)
		}
	}
	if got := test.Labels[:4]; !slices.Equal(got, []int32{3, 8, 8, 0}) {
		t.Errorf("test labels 0..3 = %v, want [3 8 8 0]", got)
	}
	if train.ClassNames[train.Labels[0]] != "frog" {
		t.Errorf("class names = %v", train.ClassNames)
	}
	for _, c := range []struct{ got, want string }{
		{train.Summary, "CIFAR-10 train: 16 records from data_batch_1.bin (batches 2-5 not present)"},
		{test.Summary, "CIFAR-10 test: 8 records from test_batch.bin"},
	} {
		if c.got != c.want {
			t.Errorf("Summary = %q, want %q", c.got, c.want)
		}
	}
	files, err := LoadCIFARFiles([]string{filepath.Join(cifar10Fixture, "data_batch_1.bin"), filepath.Join(cifar10Fixture, "test_batch.bin")}, FormatCIFAR10)
	if err != nil {
		t.Fatal(err)
	}
	if want := "CIFAR-10: 24 records from data_batch_1.bin, test_batch.bin"; files.Summary != want || files.Labels[16] != 3 {
		t.Errorf("LoadCIFARFiles: Summary %q (want %q), label 16 = %d", files.Summary, want, files.Labels[16])
	}
}

// A real copy (the official tarball or the project's JPEG-degraded
// approximation): every class present, data_batch_1's official labels.
func TestRealCIFAR10(t *testing.T) {
	train, test, err := LoadCIFAR10(realData(t, CIFAR10Set))
	if err != nil {
		t.Fatal(err)
	}
	if train.N < 10000 || train.N%10000 != 0 || test.N != 10000 {
		t.Fatalf("N = %d train, %d test; want a multiple of 10000 and 10000", train.N, test.N)
	}
	for _, m := range []*Images{train, test} {
		counts := make([]int, 10)
		for i, l := range m.Labels {
			if l < 0 || l >= 10 {
				t.Fatalf("%s label %d = %d", m.Name, i, l)
			}
			counts[l]++
		}
		for c, n := range counts {
			if n == 0 {
				t.Errorf("%s: class %d has no images", m.Name, c)
			}
		}
	}
	if !slices.Equal(train.ClassNames, cifar10ClassNames) {
		t.Errorf("class names = %v", train.ClassNames)
	}
	if !strings.HasPrefix(train.Summary, "CIFAR-10 train: ") || test.Summary != "CIFAR-10 test: 10000 records from test_batch.bin" {
		t.Errorf("Summary = %q; %q", train.Summary, test.Summary)
	}
	if train.Labels[0] != 6 || train.Labels[1] != 9 {
		t.Errorf("train labels 0,1 = %d,%d; want 6,9", train.Labels[0], train.Labels[1])
	}
}

func TestLoadCIFAR10OfficialLayout(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, cifar10Subdir)
	writeRecords(t, filepath.Join(dir, "data_batch_1.bin"), []record{{[]byte{1}, 1}, {[]byte{2}, 2}})
	writeRecords(t, filepath.Join(dir, "data_batch_3.bin"), []record{{[]byte{3}, 3}})
	writeRecords(t, filepath.Join(dir, "test_batch.bin"), []record{{[]byte{9}, 9}})
	train, test, err := LoadCIFAR10(root) // the tarball's parent directory
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(train.Labels, []int32{1, 2, 3}) || !slices.Equal(test.Labels, []int32{9}) {
		t.Errorf("labels train %v test %v", train.Labels, test.Labels)
	}
	if !slices.Equal(train.Image(2), recordPixels(3)) {
		t.Error("pixels of record 2 (first of data_batch_3.bin) differ")
	}
	want := "CIFAR-10 train: 3 records from data_batch_1.bin, data_batch_3.bin (batches 2, 4-5 not present)"
	if train.Summary != want {
		t.Errorf("Summary = %q, want %q", train.Summary, want)
	}
}

func TestLoadCIFAR100(t *testing.T) {
	dir := filepath.Join(t.TempDir(), cifar100Subdir)
	writeRecords(t, filepath.Join(dir, "train.bin"), []record{
		{[]byte{4, 30}, 1}, {[]byte{19, 99}, 2}, {[]byte{0, 0}, 3},
	})
	writeRecords(t, filepath.Join(dir, "test.bin"), []record{{[]byte{7, 55}, 4}})
	if len(cifar100FineNames) != 100 || len(cifar100CoarseNames) != 20 {
		t.Fatalf("built-in names: %d fine, %d coarse", len(cifar100FineNames), len(cifar100CoarseNames))
	}

	train, test, err := LoadCIFAR100(filepath.Dir(dir), true)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(train.Labels, []int32{30, 99, 0}) || !slices.Equal(train.Coarse, []int32{4, 19, 0}) {
		t.Errorf("fine: Labels %v Coarse %v", train.Labels, train.Coarse)
	}
	if train.Classes != 100 || train.ClassNames[99] != "worm" || train.Mean != CIFAR100Mean {
		t.Errorf("fine: Classes %d, name 99 %q, mean %v", train.Classes, train.ClassNames[99], train.Mean)
	}
	if !slices.Equal(train.Image(1), recordPixels(2)) || !slices.Equal(test.Image(0), recordPixels(4)) {
		t.Error("pixels differ from the written records")
	}
	if want := "CIFAR-100 train: 3 records from train.bin (fine labels)"; train.Summary != want {
		t.Errorf("Summary = %q, want %q", train.Summary, want)
	}

	train, test, err = LoadCIFAR100(dir, false) // the directory itself works too
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(train.Labels, []int32{4, 19, 0}) || train.Classes != 20 || test.Labels[0] != 7 {
		t.Errorf("coarse: Labels %v Classes %d test %v", train.Labels, train.Classes, test.Labels)
	}
	if !slices.Equal(train.Fine, []int32{30, 99, 0}) || train.ClassNames[19] != "vehicles_2" {
		t.Errorf("coarse: Fine %v names %v", train.Fine, train.ClassNames)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	good := record{[]byte{1}, 0}
	trunc := filepath.Join(dir, "data_batch_1.bin")
	writeRecords(t, trunc, []record{good, good, good})
	data, _ := os.ReadFile(trunc)
	os.WriteFile(trunc, data[:2*3073+1200], 0o644)

	badLabel := filepath.Join(dir, "bad10.bin")
	writeRecords(t, badLabel, []record{good, good, {[]byte{12}, 0}})
	badFine := filepath.Join(dir, "bad100.bin")
	writeRecords(t, badFine, []record{{[]byte{3, 100}, 0}})
	badCoarse := filepath.Join(dir, "badcoarse.bin")
	writeRecords(t, badCoarse, []record{{[]byte{3, 3}, 0}, {[]byte{20, 3}, 0}})
	empty := filepath.Join(dir, "empty.bin")
	os.WriteFile(empty, nil, 0o644)

	for _, c := range []struct {
		name   string
		files  []string
		format Format
		want   []string
	}{
		{"truncated", []string{trunc}, FormatCIFAR10, []string{trunc, "record 2 truncated: 1200 of 3073 bytes"}},
		{"label", []string{badLabel}, FormatCIFAR10, []string{badLabel, "record 2", "label 12 out of range"}},
		{"fine label", []string{badFine}, FormatCIFAR100, []string{badFine, "record 0", "fine label 100"}},
		{"coarse label", []string{badCoarse}, FormatCIFAR100, []string{badCoarse, "record 1", "coarse label 20"}},
		{"empty", []string{empty}, FormatCIFAR10, []string{empty, "empty"}},
		{"missing", []string{filepath.Join(dir, "nope.bin")}, FormatCIFAR10, []string{"nope.bin"}},
		{"wrong record size", []string{badLabel}, FormatCIFAR100, []string{badLabel, "truncated"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := LoadCIFARFiles(c.files, c.format)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}

	// A directory without batches names what was looked for.
	_, _, err := LoadCIFAR10(t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "data_batch_1.bin") || !strings.Contains(err.Error(), "test_batch.bin") {
		t.Errorf("empty dir: %v", err)
	}
	_, _, err = LoadCIFAR10(filepath.Join(dir, "does-not-exist"))
	if err == nil || !strings.Contains(err.Error(), "does-not-exist") {
		t.Errorf("missing dir: %v", err)
	}
	_, _, err = LoadCIFAR100(dir, true)
	if err == nil || !strings.Contains(err.Error(), "train.bin") {
		t.Errorf("CIFAR-100 empty dir: %v", err)
	}
}
