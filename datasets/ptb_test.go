package datasets

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func writePTB(t *testing.T, train, valid, test string) string {
	t.Helper()
	dir := t.TempDir()
	for i, text := range []string{train, valid, test} {
		if err := os.WriteFile(filepath.Join(dir, PTBFiles[i]), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestPTBVocabAndTokens(t *testing.T) {
	// Counts: b 3, <eos> 3, a 2, c 2, d 1: ties broken by the word in byte order.
	dir := writePTB(t, " b a c \n b c\n\n  b a d\n", " a b \n", "d\n")
	p, err := LoadPTB(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(p.Vocab.Words, " "), "<eos> b a c d"; got != want {
		t.Fatalf("vocabulary %q, want %q", got, want)
	}
	if want := []int32{1, 2, 3, 0, 1, 3, 0, 0, 1, 2, 4, 0}; !slices.Equal(p.Train, want) {
		t.Fatalf("train %v, want %v", p.Train, want)
	}
	if !slices.Equal(p.Valid, []int32{2, 1, 0}) || !slices.Equal(p.Test, []int32{4, 0}) {
		t.Fatalf("valid %v, test %v", p.Valid, p.Test)
	}
	if id, ok := p.Vocab.ID("c"); !ok || id != 3 || p.Vocab.Word(3) != "c" || p.Vocab.Word(9) != "" {
		t.Fatal("ID/Word disagree")
	}
}

func TestPTBErrorsNameFileAndLine(t *testing.T) {
	for _, tc := range []struct{ name, train, valid, want string }{
		{"unknown word", "a b\n", "a\nb z\n", "ptb.valid.txt:2: word \"z\" is not in the training vocabulary"},
		{"invalid utf-8", "a b\na \xff\n", "a\n", "ptb.train.txt:2: invalid UTF-8"},
		{"empty train", "", "a\n", "ptb.train.txt: empty file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadPTB(writePTB(t, tc.train, tc.valid, "a\n"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
	_, err := LoadPTB(t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "ptb.train.txt") {
		t.Fatalf("missing files: %v", err)
	}
	if _, err := FindPTB(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no ptb.train.txt") {
		t.Fatalf("FindPTB on an empty directory: %v", err)
	}
}

func TestBatchifyWindowsShards(t *testing.T) {
	tokens := make([]int32, 23)
	for i := range tokens {
		tokens[i] = int32(i)
	}
	b, err := Batchify(tokens, 3) // 7 rows; tokens 21, 22 dropped
	if err != nil {
		t.Fatal(err)
	}
	if b.Rows != 7 || b.Cols != 3 || !slices.Equal(b.Data[:6], []int32{0, 7, 14, 1, 8, 15}) {
		t.Fatalf("batchify: %d×%d %v", b.Rows, b.Cols, b.Data)
	}
	if n := b.Windows(4); n != 2 {
		t.Fatalf("%d windows of 4 over 7 rows, want 2 (4 + 2)", n)
	}
	x, y, steps := b.Window(1, 4)
	if steps != 2 || !slices.Equal(x, []int32{4, 11, 18, 5, 12, 19}) || !slices.Equal(y, []int32{5, 12, 19, 6, 13, 20}) {
		t.Fatalf("window 1: steps %d x %v y %v", steps, x, y)
	}
	if _, _, s := b.Window(2, 4); s != 0 {
		t.Fatal("window past the end")
	}
	s1, err := ShardTokens(tokens, 1, 2)
	if err != nil || !slices.Equal(s1, tokens[11:22]) {
		t.Fatalf("shard 1 of 2: %v %v", s1, err)
	}
	if _, err := ShardTokens(tokens, 2, 2); err == nil {
		t.Fatal("rank 2 of 2 accepted")
	}
	if _, err := Batchify(tokens[:3], 2); err == nil {
		t.Fatal("1 row accepted")
	}
}

// The full corpus (Mikolov's split): the counts of its published files and the ids of TensorFlow's PTB reader.
func TestRealPTB(t *testing.T) {
	p, err := LoadPTB(realData(t, PTBSet))
	if err != nil {
		t.Fatal(err)
	}
	if p.Vocab.Size() != 10000 || len(p.Train) != 929589 || len(p.Valid) != 73760 || len(p.Test) != 82430 {
		t.Fatal(p.Summary())
	}
	// TensorFlow's PTB reader order: the, <unk>, <eos>, N, of …; the first words of train.
	if got := strings.Join(p.Vocab.Words[:5], " "); got != "the <unk> <eos> N of" {
		t.Fatalf("first words %q", got)
	}
	if want := []int32{9970, 9971, 9972, 9974, 9975, 9976, 9980, 9981, 9982, 9983}; !slices.Equal(p.Train[:10], want) {
		t.Fatalf("first train ids %v, want %v", p.Train[:10], want)
	}
}

// The fixture: PTB's first 40 training lines and three valid and test lines that use
// only their words. The expected values come from TensorFlow's PTB reader's reading, done in Python:
// words+<eos> per line, vocabulary by (-count, word).
func TestPTBFixture(t *testing.T) {
	p, err := LoadPTB(ptbFixture)
	if err != nil {
		t.Fatal(err)
	}
	if p.Vocab.Size() != 386 || len(p.Train) != 890 || len(p.Valid) != 16 || len(p.Test) != 16 {
		t.Fatal(p.Summary())
	}
	if got := strings.Join(p.Vocab.Words[:6], " "); got != "<unk> the <eos> of a N" {
		t.Errorf("first words %q", got)
	}
	if want := []int32{107, 125, 128, 138, 143, 148, 203, 206, 209, 219}; !slices.Equal(p.Train[:10], want) {
		t.Errorf("first train ids %v, want %v", p.Train[:10], want)
	}
	if want := []int32{354, 29, 4, 0, 2, 344, 0, 0, 1, 0, 2, 10, 15, 260, 64, 2}; !slices.Equal(p.Valid, want) {
		t.Errorf("valid ids %v, want %v", p.Valid, want)
	}
}
