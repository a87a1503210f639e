package datasets

import (
	"archive/tar"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestTokenizeIMDB(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"I didn't like it.<br /><br />10/10!!", []string{"i", "didn't", "like", "it", ".", "10", "/", "10", "!", "!"}},
		{"Great<BR/>film<br>ever", []string{"great", "film", "ever"}},
		{"a <b>bold</b> 'quote'", []string{"a", "<", "b", ">", "bold", "<", "/", "b", ">", "'", "quote", "'"}},
		{"Café's  DÉJÀ-vu…", []string{"café's", "déjà", "-", "vu", "…"}},
		{"x<br", []string{"x", "<", "br"}},
		{"", nil},
	} {
		if got := TokenizeIMDB(c.in); !slices.Equal(got, c.want) {
			t.Errorf("TokenizeIMDB(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// writeIMDB writes an aclImdb tree under root from a map path → content.
func writeIMDB(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func imdbFixture() map[string]string {
	return map[string]string{
		"aclImdb/train/pos/10_9.txt":    "Good good film.<br />Great!",
		"aclImdb/train/pos/2_7.txt":     "good acting",
		"aclImdb/train/neg/3_1.txt":     "Bad film, bad bad acting.",
		"aclImdb/train/neg/11_4.txt":    "boring",
		"aclImdb/train/unsup/0_0.txt":   "unsup unsup unsup unsup unsup",
		"aclImdb/train/urls_pos.txt":    "http://example.com",
		"aclImdb/test/pos/0_10.txt":     "great great unseenword",
		"aclImdb/test/neg/1_2.txt":      "bad",
		"aclImdb/test/neg/README":       "not a review",
		"aclImdb/imdb.vocab":            "the\n",
		"aclImdb/train/labeledBow.feat": "0 0:1\n",
	}
}

func TestLoadIMDB(t *testing.T) {
	root := t.TempDir()
	writeIMDB(t, root, imdbFixture())
	ds, err := LoadIMDB(context.Background(), root, IMDBOptions{VocabSize: 6, MaxLen: 5})
	if err != nil {
		t.Fatal(err)
	}
	// Train counts: bad 3, good 3, film 2, acting 2, "." 2, boring 1,
	// great 1, "!" 1, "," 1. Ties go to byte order: "." < "acting" <
	// "film"; "!" < "," < "boring" < "great".
	wantWords := []string{"bad", "good", ".", "acting", "film", "!"}
	if !slices.Equal(ds.Vocab.Words, wantWords) {
		t.Fatalf("vocabulary %q, want %q", ds.Vocab.Words, wantWords)
	}
	if ds.Vocab.Size() != 7 || ds.Vocab.ID("bad") != 1 || ds.Vocab.ID("unsup") != IMDBPadID || ds.Vocab.Word(3) != "." {
		t.Fatalf("vocabulary lookups wrong: size %d", ds.Vocab.Size())
	}
	tr := ds.Train
	if tr.N != 4 || tr.MaxLen != 5 {
		t.Fatalf("train N=%d MaxLen=%d", tr.N, tr.MaxLen)
	}
	// Negative first, by numeric id (3 before 11), then positive (2, 10).
	wantFiles := []string{"neg/3_1.txt", "neg/11_4.txt", "pos/2_7.txt", "pos/10_9.txt"}
	for i, f := range wantFiles {
		if !strings.HasSuffix(filepath.ToSlash(tr.Files[i]), "train/"+f) {
			t.Errorf("train file %d = %s, want …/train/%s", i, tr.Files[i], f)
		}
	}
	if want := []int32{0, 0, 1, 1}; !slices.Equal(tr.Labels, want) {
		t.Errorf("labels %v, want %v", tr.Labels, want)
	}
	// "bad film , bad bad acting ." truncated to 5: bad film , bad bad;
	// "," is not in the vocabulary → 0.
	for i, want := range [][]int32{
		{1, 5, 0, 1, 1},
		{0, 0, 0, 0, 0}, // boring: out of vocabulary, then padding
		{2, 4, 0, 0, 0},
		{2, 2, 5, 3, 0}, // good good film . great ! → truncated after "great"(0)
	} {
		if got := tr.Review(i); !slices.Equal(got, want) {
			t.Errorf("review %d = %v, want %v", i, got, want)
		}
	}
	if want := []int32{5, 1, 2, 5}; !slices.Equal(tr.Lengths, want) {
		t.Errorf("lengths %v, want %v", tr.Lengths, want)
	}
	te := ds.Test
	if te.N != 2 || !slices.Equal(te.Labels, []int32{0, 1}) || !slices.Equal(te.Review(1), []int32{0, 0, 0, 0, 0}) {
		t.Errorf("test split: N=%d labels %v review 1 %v", te.N, te.Labels, te.Review(1))
	}
	// The aclImdb directory itself works too.
	ds2, err := LoadIMDB(context.Background(), filepath.Join(root, "aclImdb"), IMDBOptions{VocabSize: 6, MaxLen: 5})
	if err != nil || !slices.Equal(ds2.Train.IDs, tr.IDs) {
		t.Errorf("loading aclImdb directly: %v", err)
	}
}

func TestLoadIMDBErrors(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(m map[string]string)
		want   string
	}{
		{"malformed name", func(m map[string]string) { m["aclImdb/train/pos/12-8.txt"] = "x" }, "12-8.txt: file name is not <id>_<rating>.txt"},
		{"no rating", func(m map[string]string) { m["aclImdb/test/neg/5_.txt"] = "x" }, "5_.txt: file name"},
		{"rating in wrong class", func(m map[string]string) { m["aclImdb/train/pos/7_3.txt"] = "x" }, "7_3.txt: rating 3 does not belong in pos"},
		{"non-UTF-8", func(m map[string]string) { m["aclImdb/test/pos/9_8.txt"] = "ok \xff\xfe bad" }, "9_8.txt: invalid UTF-8 at byte 3"},
		{"empty dir", func(m map[string]string) { delete(m, "aclImdb/test/pos/0_10.txt") }, filepath.Join("test", "pos") + " holds no"},
		{"missing dir", func(m map[string]string) {
			delete(m, "aclImdb/train/neg/3_1.txt")
			delete(m, "aclImdb/train/neg/11_4.txt")
		}, filepath.Join("train", "neg")},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := imdbFixture()
			c.change(m)
			root := t.TempDir()
			writeIMDB(t, root, m)
			if c.name == "empty dir" {
				os.MkdirAll(filepath.Join(root, "aclImdb", "test", "pos"), 0o755)
			}
			_, err := LoadIMDB(context.Background(), root, IMDBOptions{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error = %v, want it to contain %q", err, c.want)
			}
		})
	}
	if _, err := LoadIMDB(context.Background(), t.TempDir(), IMDBOptions{MaxLen: -1}); err == nil || !strings.Contains(err.Error(), "MaxLen") {
		t.Errorf("negative MaxLen: %v", err)
	}
	root := t.TempDir()
	writeIMDB(t, root, imdbFixture())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := LoadIMDB(ctx, root, IMDBOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

// syntheticTextSplit has review i = [i+1, 0, …] with label i%2.
func syntheticTextSplit(n, maxLen int) *TextSplit {
	s := &TextSplit{Name: "synthetic", N: n, MaxLen: maxLen, IDs: make([]int32, n*maxLen), Labels: make([]int32, n), Lengths: make([]int32, n)}
	for i := range n {
		s.IDs[i*maxLen] = int32(i + 1)
		s.Labels[i] = int32(i % 2)
		s.Lengths[i] = 1
	}
	return s
}

func textEpoch(t *testing.T, l *TextLoader, epoch int) []int32 {
	t.Helper()
	var firsts []int32
	for b, err := range l.Epoch(context.Background(), epoch) {
		if err != nil {
			t.Fatal(err)
		}
		if len(b.X) != b.N*b.MaxLen || len(b.Y) != b.N || len(b.Lengths) != b.N {
			t.Fatalf("batch shapes: X %d Y %d Lengths %d N %d", len(b.X), len(b.Y), len(b.Lengths), b.N)
		}
		for k := range b.N {
			id := b.X[k*b.MaxLen]
			if b.Y[k] != int(id-1)%2 || b.Lengths[k] != 1 {
				t.Fatalf("review %d has label %d length %d", id, b.Y[k], b.Lengths[k])
			}
			firsts = append(firsts, id)
		}
	}
	return firsts
}

func TestTextLoaderShardsAndShuffle(t *testing.T) {
	split := syntheticTextSplit(23, 4)
	const world = 3
	seen := map[int32]int{}
	var rank0 [][]int32
	for rank := range world {
		l, err := NewTextLoader(split, TextLoaderOptions{Batch: 4, Rank: rank, World: world, Seed: 7, Shuffle: true})
		if err != nil {
			t.Fatal(err)
		}
		if l.NumBatches() != 2 { // ceil(23/3)=8 samples → 2 batches
			t.Fatalf("NumBatches = %d, want 2", l.NumBatches())
		}
		got := textEpoch(t, l, 0)
		if len(got) != 8 {
			t.Fatalf("rank %d: %d samples, want 8", rank, len(got))
		}
		for _, id := range got {
			seen[id]++
		}
		if rank == 0 {
			rank0 = append(rank0, got, textEpoch(t, l, 0), textEpoch(t, l, 1))
		}
	}
	// All 23 reviews, one repeated once (padding to 24).
	if len(seen) != 23 {
		t.Errorf("%d distinct reviews seen, want 23", len(seen))
	}
	if !slices.Equal(rank0[0], rank0[1]) {
		t.Error("same epoch, different order")
	}
	if slices.Equal(rank0[0], rank0[2]) {
		t.Error("epoch 1 has epoch 0's order")
	}
	// Without shuffle, rank 1 of 3 sees 2, 5, 8, … (ids are index+1).
	l, _ := NewTextLoader(split, TextLoaderOptions{Batch: 5, Rank: 1, World: 3, DropLast: true})
	if got := textEpoch(t, l, 0); !slices.Equal(got, []int32{2, 5, 8, 11, 14}) {
		t.Errorf("unshuffled rank 1 = %v", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, err := range l.Epoch(ctx, 0) {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled epoch: %v", err)
		}
	}
	if _, err := NewTextLoader(split, TextLoaderOptions{Batch: 0}); err == nil {
		t.Error("Batch 0 accepted")
	}
	if _, err := NewTextLoader(split, TextLoaderOptions{Batch: 1, Rank: 2, World: 2}); err == nil {
		t.Error("Rank 2 of 2 accepted")
	}
}

func TestDownloadIMDB(t *testing.T) {
	var entries []tarEntry
	for name, content := range imdbFixture() {
		entries = append(entries, tarEntry{name: name, data: []byte(content), typ: tar.TypeReg})
	}
	body := makeTarGz(t, entries)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(body) }))
	defer srv.Close()
	saved := imdbArchive
	t.Cleanup(func() { imdbArchive = saved })
	sum := md5.Sum(body)
	imdbArchive = archive{name: saved.name, url: srv.URL + "/aclImdb_v1.tar.gz", md5: hex.EncodeToString(sum[:])}
	dest := t.TempDir()
	if err := DownloadIMDB(context.Background(), dest, nil); err != nil {
		t.Fatal(err)
	}
	ds, err := LoadIMDB(context.Background(), dest, IMDBOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ds.Train.N != 4 || ds.Test.N != 2 || ds.Train.MaxLen != IMDBDefaultMaxLen {
		t.Errorf("downloaded dataset: train %d test %d MaxLen %d", ds.Train.N, ds.Test.N, ds.Train.MaxLen)
	}
	imdbArchive.md5 = "00000000000000000000000000000000"
	os.Remove(filepath.Join(dest, saved.name))
	if err := DownloadIMDB(context.Background(), dest, nil); err == nil || !strings.Contains(err.Error(), "md5 mismatch") {
		t.Errorf("wrong md5: %v", err)
	}
}
