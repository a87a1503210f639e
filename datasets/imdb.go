package datasets

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// imdbArchive is the official Large Movie Review Dataset v1.0 tarball.
// A variable so that tests can point it at a loopback server.
var imdbArchive = archive{
	name: "aclImdb_v1.tar.gz",
	url:  "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz",
	md5:  "7c2ac02c03563afcf9b574c7e56c153a",
}

// DownloadIMDB downloads the official aclImdb_v1.tar.gz (84 MB) into
// destDir, checks its md5 and extracts it there, giving destDir/aclImdb/
// (which LoadIMDB accepts). Progress, caching and cancellation behave as
// in [DownloadCIFAR10].
func DownloadIMDB(ctx context.Context, destDir string, progress io.Writer) error {
	return fetchArchive(ctx, imdbArchive, destDir, progress)
}

// IMDB defaults: SparDL's LSTM-IMDB classifier uses the 50,000 most
// frequent training words; reviews longer than IMDBDefaultMaxLen tokens are
// cut (a choice of this package, not of SparDL's code: set
// IMDBOptions.MaxLen to match a reference run).
const (
	IMDBDefaultVocabSize = 50000
	IMDBDefaultMaxLen    = 500
)

// IMDBPadID is the id of padding and of every word outside the vocabulary.
// Words get ids 1..VocabSize in order of decreasing training frequency, so
// the embedding table has VocabSize+1 rows (50,001 for the defaults).
const IMDBPadID = 0

// IMDBOptions configure LoadIMDB.
type IMDBOptions struct {
	// VocabSize is the number of words kept (the most frequent in train);
	// 0 means IMDBDefaultVocabSize.
	VocabSize int
	// MaxLen is the length of every encoded review: the first MaxLen tokens
	// are kept, shorter reviews are padded at the end with IMDBPadID; 0
	// means IMDBDefaultMaxLen.
	MaxLen int
}

// IMDBVocab maps words to ids: Words[i] has id i+1; id 0 is padding and
// unknown words.
type IMDBVocab struct {
	Words []string
	ids   map[string]int32
}

// Size is the number of ids, padding included: len(Words)+1.
func (v *IMDBVocab) Size() int { return len(v.Words) + 1 }

// ID returns the id of a token (as produced by TokenizeIMDB), IMDBPadID if
// it is not in the vocabulary.
func (v *IMDBVocab) ID(token string) int32 { return v.ids[token] }

// Word returns the word of id, "" for IMDBPadID or an id out of range.
func (v *IMDBVocab) Word(id int32) string {
	if id < 1 || int(id) > len(v.Words) {
		return ""
	}
	return v.Words[id-1]
}

// TextSplit is one split of a text classification dataset, encoded:
// review i is IDs[i*MaxLen:(i+1)*MaxLen], its label Labels[i], and
// Lengths[i] tokens of it are real (the rest padding).
type TextSplit struct {
	Name    string // e.g. "IMDB train"
	N       int
	MaxLen  int
	IDs     []int32
	Labels  []int32 // 0 negative, 1 positive
	Lengths []int32 // tokens before truncation/padding, capped at MaxLen
	Files   []string
}

// Review returns the MaxLen ids of review i (a view, not a copy).
func (s *TextSplit) Review(i int) []int32 {
	return s.IDs[i*s.MaxLen : (i+1)*s.MaxLen : (i+1)*s.MaxLen]
}

// IMDB is the encoded Large Movie Review Dataset.
type IMDB struct {
	Train, Test *TextSplit
	Vocab       *IMDBVocab
}

// imdbReview is one file of the aclImdb layout.
type imdbReview struct {
	path   string
	id     int
	rating int
	label  int32
}

// LoadIMDB reads dir in the aclImdb layout (dir may be the aclImdb
// directory itself or a directory containing it):
//
//	train/pos/<id>_<rating>.txt  train/neg/…  test/pos/…  test/neg/…
//
// train/unsup and any other file or directory are ignored. Every review
// must be UTF-8, have a name id_rating.txt with rating 7..10 in pos and
// 1..4 in neg (the dataset's definition), and every one of the four
// directories must hold at least one review; otherwise the error names the
// file or directory. Reviews are ordered negative then positive, by id.
//
// The vocabulary is built from train only: the VocabSize most frequent
// tokens of [TokenizeIMDB], ties broken by byte order of the word, so the
// same files always give the same ids.
func LoadIMDB(ctx context.Context, dir string, opt IMDBOptions) (*IMDB, error) {
	if opt.VocabSize == 0 {
		opt.VocabSize = IMDBDefaultVocabSize
	}
	if opt.MaxLen == 0 {
		opt.MaxLen = IMDBDefaultMaxLen
	}
	if opt.VocabSize < 0 {
		return nil, fmt.Errorf("datasets: IMDBOptions.VocabSize = %d, must be >= 0", opt.VocabSize)
	}
	if opt.MaxLen < 0 {
		return nil, fmt.Errorf("datasets: IMDBOptions.MaxLen = %d, must be >= 0", opt.MaxLen)
	}
	if st, err := os.Stat(filepath.Join(dir, "aclImdb", "train")); err == nil && st.IsDir() {
		dir = filepath.Join(dir, "aclImdb")
	}
	var tokens [2][][]string
	var reviews [2][]imdbReview
	for s, split := range []string{"train", "test"} {
		revs, err := listIMDBSplit(dir, split)
		if err != nil {
			return nil, err
		}
		reviews[s] = revs
		tokens[s] = make([][]string, len(revs))
		for i, r := range revs {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			data, err := os.ReadFile(r.path)
			if err != nil {
				return nil, fmt.Errorf("datasets: IMDB: %w", err)
			}
			if !utf8.Valid(data) {
				off := firstInvalidUTF8(data)
				return nil, fmt.Errorf("datasets: IMDB: %s: invalid UTF-8 at byte %d", r.path, off)
			}
			tokens[s][i] = TokenizeIMDB(string(data))
		}
	}
	vocab := buildIMDBVocab(tokens[0], opt.VocabSize)
	out := &IMDB{Vocab: vocab}
	for s, name := range []string{"IMDB train", "IMDB test"} {
		split := &TextSplit{Name: name, N: len(reviews[s]), MaxLen: opt.MaxLen}
		split.IDs = make([]int32, split.N*opt.MaxLen)
		split.Labels = make([]int32, split.N)
		split.Lengths = make([]int32, split.N)
		split.Files = make([]string, split.N)
		for i, r := range reviews[s] {
			row := split.Review(i)
			toks := tokens[s][i]
			n := min(len(toks), opt.MaxLen)
			for k, tk := range toks[:n] {
				row[k] = vocab.ID(tk)
			}
			split.Labels[i] = r.label
			split.Lengths[i] = int32(n)
			split.Files[i] = r.path
		}
		if s == 0 {
			out.Train = split
		} else {
			out.Test = split
		}
	}
	return out, nil
}

func firstInvalidUTF8(b []byte) int {
	for off := 0; off < len(b); {
		r, size := utf8.DecodeRune(b[off:])
		if r == utf8.RuneError && size <= 1 {
			return off
		}
		off += size
	}
	return len(b)
}

// listIMDBSplit lists dir/split/{neg,pos}, negative reviews first, each by id.
func listIMDBSplit(dir, split string) ([]imdbReview, error) {
	var all []imdbReview
	for label, class := range []string{"neg", "pos"} {
		sub := filepath.Join(dir, split, class)
		entries, err := os.ReadDir(sub)
		if err != nil {
			return nil, fmt.Errorf("datasets: IMDB: %w", err)
		}
		var revs []imdbReview
		for _, e := range entries {
			if e.IsDir() || !strings.HasSuffix(e.Name(), ".txt") {
				continue
			}
			path := filepath.Join(sub, e.Name())
			id, rating, ok := parseIMDBName(e.Name())
			if !ok {
				return nil, fmt.Errorf("datasets: IMDB: %s: file name is not <id>_<rating>.txt", path)
			}
			if (label == 1 && (rating < 7 || rating > 10)) || (label == 0 && (rating < 1 || rating > 4)) {
				return nil, fmt.Errorf("datasets: IMDB: %s: rating %d does not belong in %s (neg 1..4, pos 7..10)", path, rating, class)
			}
			revs = append(revs, imdbReview{path: path, id: id, rating: rating, label: int32(label)})
		}
		if len(revs) == 0 {
			return nil, fmt.Errorf("datasets: IMDB: %s holds no <id>_<rating>.txt reviews", sub)
		}
		slices.SortFunc(revs, func(a, b imdbReview) int {
			return cmp.Or(cmp.Compare(a.id, b.id), cmp.Compare(a.path, b.path))
		})
		all = append(all, revs...)
	}
	return all, nil
}

func parseIMDBName(name string) (id, rating int, ok bool) {
	base := strings.TrimSuffix(name, ".txt")
	idStr, ratingStr, found := strings.Cut(base, "_")
	if !found {
		return 0, 0, false
	}
	id, err1 := strconv.Atoi(idStr)
	rating, err2 := strconv.Atoi(ratingStr)
	if err1 != nil || err2 != nil || id < 0 || idStr[0] == '+' || ratingStr[0] == '+' {
		return 0, 0, false
	}
	return id, rating, true
}

// TokenizeIMDB splits a review into tokens, the rule of SparDL's
// LSTM-IMDB preprocessing:
//
//  1. every "<br />" (also "<br/>", "<br>", any case) becomes a space;
//  2. the text is lowercased (Unicode simple case mapping);
//  3. a word is a maximal run of letters, digits and marks, which may
//     contain an apostrophe between two such characters ("don't",
//     "director's" stay one token); every other character that is not
//     white space (punctuation, symbols) is a token of its own.
//
// So "I didn't like it.<br /><br />10/10!!" gives
// [i didn't like it . 10 / 10 ! !].
func TokenizeIMDB(text string) []string {
	text = stripBreaks(text)
	text = strings.ToLower(text)
	var toks []string
	isWord := func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r) }
	runes := []rune(text)
	for i := 0; i < len(runes); {
		r := runes[i]
		switch {
		case unicode.IsSpace(r):
			i++
		case isWord(r):
			j := i + 1
			for j < len(runes) {
				if isWord(runes[j]) {
					j++
				} else if (runes[j] == '\'' || runes[j] == '’') && j+1 < len(runes) && isWord(runes[j+1]) {
					j += 2
				} else {
					break
				}
			}
			toks = append(toks, string(runes[i:j]))
			i = j
		default:
			toks = append(toks, string(r))
			i++
		}
	}
	return toks
}

// stripBreaks replaces the HTML line breaks of the reviews by spaces.
func stripBreaks(s string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, "<")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i])
		rest := s[i:]
		n := breakTagLen(rest)
		if n == 0 {
			b.WriteByte('<')
			s = rest[1:]
			continue
		}
		b.WriteByte(' ')
		s = rest[n:]
	}
}

// breakTagLen is the length of a <br>, <br/> or <br /> tag (any case) at
// the start of s, 0 if there is none.
func breakTagLen(s string) int {
	if len(s) < 4 || !strings.EqualFold(s[:3], "<br") {
		return 0
	}
	i := 3
	for i < len(s) && s[i] == ' ' {
		i++
	}
	if i < len(s) && s[i] == '/' {
		i++
	}
	if i < len(s) && s[i] == '>' {
		return i + 1
	}
	return 0
}

// buildIMDBVocab keeps the size most frequent tokens of docs.
func buildIMDBVocab(docs [][]string, size int) *IMDBVocab {
	counts := make(map[string]int)
	for _, d := range docs {
		for _, t := range d {
			counts[t]++
		}
	}
	words := make([]string, 0, len(counts))
	for w := range counts {
		words = append(words, w)
	}
	slices.SortFunc(words, func(a, b string) int {
		return cmp.Or(cmp.Compare(counts[b], counts[a]), strings.Compare(a, b))
	})
	if len(words) > size {
		words = words[:size]
	}
	v := &IMDBVocab{Words: words, ids: make(map[string]int32, len(words))}
	for i, w := range words {
		v.ids[w] = int32(i + 1)
	}
	return v
}

// TextLoaderOptions configure a TextLoader.
type TextLoaderOptions struct {
	Batch       int // reviews per batch (per rank), > 0
	Rank, World int // World 0 means 1
	Seed        uint64
	Shuffle     bool // reshuffle every epoch (training)
	DropLast    bool // drop this rank's short last batch
}

// TextBatch is one batch of a TextLoader. Its slices are valid until the
// next batch is requested; copy them to keep them.
type TextBatch struct {
	X       []int32 // N×MaxLen token ids, row-major, padded with IMDBPadID
	Y       []int   // N labels
	Lengths []int   // N real lengths (≤ MaxLen)
	N       int
	MaxLen  int
}

// TextLoader yields batches of a TextSplit for one rank, split across
// ranks by a [DistributedSampler] (disjoint shards, reshuffled every
// epoch, the same for the same Seed).
type TextLoader struct {
	split   *TextSplit
	opt     TextLoaderOptions
	sampler DistributedSampler
	buf     TextBatch
}

// NewTextLoader checks opt.
func NewTextLoader(split *TextSplit, opt TextLoaderOptions) (*TextLoader, error) {
	if split == nil || split.N == 0 {
		return nil, errors.New("datasets: NewTextLoader: empty split")
	}
	if len(split.IDs) != split.N*split.MaxLen || len(split.Labels) != split.N || len(split.Lengths) != split.N {
		return nil, fmt.Errorf("datasets: NewTextLoader: %s: %d ids, %d labels, %d lengths do not match N=%d of length %d",
			split.Name, len(split.IDs), len(split.Labels), len(split.Lengths), split.N, split.MaxLen)
	}
	sampler, err := newSampler("TextLoaderOptions", split.N, opt.Batch, opt.Rank, opt.World, opt.Seed, opt.Shuffle)
	if err != nil {
		return nil, err
	}
	opt.World = sampler.World
	return &TextLoader{split: split, opt: opt, sampler: sampler, buf: TextBatch{
		X: make([]int32, opt.Batch*split.MaxLen), Y: make([]int, opt.Batch), Lengths: make([]int, opt.Batch), MaxLen: split.MaxLen,
	}}, nil
}

// newSampler validates the common loader options and returns the sampler.
// The sampler always pads (every rank gets the same count); a loader's
// DropLast applies to its batches.
func newSampler(what string, n, batch, rank, world int, seed uint64, shuffle bool) (DistributedSampler, error) {
	if batch <= 0 {
		return DistributedSampler{}, fmt.Errorf("datasets: %s.Batch = %d, must be > 0", what, batch)
	}
	if world == 0 {
		world = 1
	}
	if world < 0 {
		return DistributedSampler{}, fmt.Errorf("datasets: %s.World = %d, must be >= 1", what, world)
	}
	if rank < 0 || rank >= world {
		return DistributedSampler{}, fmt.Errorf("datasets: %s.Rank = %d, must be in [0, World=%d)", what, rank, world)
	}
	return DistributedSampler{N: n, Rank: rank, World: world, Seed: seed, Shuffle: shuffle}, nil
}

// numBatches is the number of batches of a rank's epoch.
func numBatches(samples, batch int, dropLast bool) int {
	if dropLast {
		return samples / batch
	}
	return (samples + batch - 1) / batch
}

// NumBatches is how many batches Epoch yields; the same on every rank.
func (l *TextLoader) NumBatches() int {
	return numBatches(l.sampler.NumSamples(), l.opt.Batch, l.opt.DropLast)
}

// Epoch returns this rank's batches of one epoch. The same (Seed, Rank,
// World, epoch) always gives the same batches. If ctx is cancelled the
// loop yields its error once and stops. The batches share one buffer, so
// an epoch must be consumed before the next is started.
func (l *TextLoader) Epoch(ctx context.Context, epoch int) iter.Seq2[TextBatch, error] {
	return func(yield func(TextBatch, error) bool) {
		idx := l.sampler.Indices(epoch)
		for b := range l.NumBatches() {
			if err := ctx.Err(); err != nil {
				yield(TextBatch{}, err)
				return
			}
			lo := b * l.opt.Batch
			hi := min(lo+l.opt.Batch, len(idx))
			bt := &l.buf
			n := hi - lo
			bt.N, bt.X, bt.Y, bt.Lengths = n, bt.X[:n*bt.MaxLen], bt.Y[:n], bt.Lengths[:n]
			for k, i := range idx[lo:hi] {
				copy(bt.X[k*bt.MaxLen:(k+1)*bt.MaxLen], l.split.Review(i))
				bt.Y[k] = int(l.split.Labels[i])
				bt.Lengths[k] = int(l.split.Lengths[i])
			}
			if !yield(*bt, nil) {
				return
			}
		}
	}
}
