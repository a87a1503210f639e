package datasets

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode/utf8"
)

// The Penn Treebank word-level language-modelling corpus (Mikolov's "simple-examples"
// split: ptb.train.txt, ptb.valid.txt, ptb.test.txt), read as TensorFlow's PTB reader reads it
// (Ok-Topk's LSTM/ptb_reader.py, TensorFlow's PTB reader): every line's whitespace-separated
// words followed by "<eos>", and a vocabulary of the training file's words sorted by
// decreasing count, ties by the word (byte order, which is Python's code-point order for
// UTF-8), so "the" is id 0 on PTB. Valid and test must use only training words: PTB has
// none outside it, and a word outside it is an error naming the file and line (TensorFlow's reader
// would drop it silently).
//
// For training, [Batchify] lays a token stream out in N columns (word_language_model's
// batchify) and [LMBatches.Window] cuts bptt windows with targets shifted by one;
// [ShardTokens] gives each data-parallel rank its own contiguous slice of the stream.

// PTBEOS is the end-of-sentence token appended to every line.
const PTBEOS = "<eos>"

// PTBFiles are the three files of the corpus, in a PTB directory.
var PTBFiles = [3]string{"ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"}

// PTBVocab maps the training words to ids 0..Size()-1 in the order of TensorFlow's PTB reader.
type PTBVocab struct {
	Words []string // Words[id]
	ids   map[string]int32
}

// Size is the number of words, <eos> included.
func (v *PTBVocab) Size() int { return len(v.Words) }

// ID returns the id of word and whether it is in the vocabulary.
func (v *PTBVocab) ID(word string) (int32, bool) {
	id, ok := v.ids[word]
	return id, ok
}

// Word returns the word of id ("" outside the vocabulary).
func (v *PTBVocab) Word(id int32) string {
	if id < 0 || int(id) >= len(v.Words) {
		return ""
	}
	return v.Words[id]
}

// PTB is the corpus encoded with its training vocabulary.
type PTB struct {
	Dir                string
	Vocab              *PTBVocab
	Train, Valid, Test []int32
}

// Summary describes the corpus in one line.
func (p *PTB) Summary() string {
	return fmt.Sprintf("PTB %s: vocabulary %d, tokens (with %s) train %d, valid %d, test %d",
		p.Dir, p.Vocab.Size(), PTBEOS, len(p.Train), len(p.Valid), len(p.Test))
}

// LoadPTB reads dir's ptb.train.txt, ptb.valid.txt and ptb.test.txt: the vocabulary from
// train, then the three files encoded with it.
func LoadPTB(dir string) (*PTB, error) {
	paths := make([]string, 3)
	for i, f := range PTBFiles {
		paths[i] = filepath.Join(dir, f)
	}
	words, err := readPTBWords(paths[0])
	if err != nil {
		return nil, err
	}
	p := &PTB{Dir: dir, Vocab: BuildPTBVocab(words.words)}
	if p.Train, err = encodePTB(paths[0], words, p.Vocab); err != nil {
		return nil, err
	}
	if p.Valid, err = ReadPTBTokens(paths[1], p.Vocab); err != nil {
		return nil, err
	}
	if p.Test, err = ReadPTBTokens(paths[2], p.Vocab); err != nil {
		return nil, err
	}
	return p, nil
}

// BuildPTBVocab returns the vocabulary of a token stream: its distinct words sorted by
// decreasing count, ties by the word, as _build_vocab of TensorFlow's PTB reader (ptb/reader.py).
func BuildPTBVocab(words []string) *PTBVocab {
	count := map[string]int{}
	for _, w := range words {
		count[w]++
	}
	v := &PTBVocab{Words: make([]string, 0, len(count)), ids: make(map[string]int32, len(count))}
	for w := range count {
		v.Words = append(v.Words, w)
	}
	sort.Slice(v.Words, func(i, j int) bool {
		a, b := v.Words[i], v.Words[j]
		if count[a] != count[b] {
			return count[a] > count[b]
		}
		return a < b
	})
	for i, w := range v.Words {
		v.ids[w] = int32(i)
	}
	return v
}

// ReadPTBTokens reads a file in the PTB format (words separated by white space, PTBEOS
// appended to every line) and encodes it with v. A word outside v, invalid UTF-8 or an
// empty file is an error naming the file and line.
func ReadPTBTokens(path string, v *PTBVocab) ([]int32, error) {
	words, err := readPTBWords(path)
	if err != nil {
		return nil, err
	}
	return encodePTB(path, words, v)
}

// ptbWords is a file's tokens with the line each came from.
type ptbWords struct {
	words []string
	lines []int32
}

func readPTBWords(path string) (ptbWords, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return ptbWords{}, fmt.Errorf("datasets: PTB: %w (want %s in the directory)", err, strings.Join(PTBFiles[:], ", "))
		}
		return ptbWords{}, fmt.Errorf("datasets: PTB: %w", err)
	}
	var pw ptbWords
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), len(data)+1)
	line := int32(0)
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if !utf8.Valid(b) {
			return ptbWords{}, fmt.Errorf("datasets: %s:%d: invalid UTF-8", path, line)
		}
		for _, w := range strings.Fields(string(b)) {
			pw.words = append(pw.words, w)
			pw.lines = append(pw.lines, line)
		}
		pw.words = append(pw.words, PTBEOS)
		pw.lines = append(pw.lines, line)
	}
	if err := sc.Err(); err != nil {
		return ptbWords{}, fmt.Errorf("datasets: %s:%d: %w", path, line+1, err)
	}
	if line == 0 {
		return ptbWords{}, fmt.Errorf("datasets: %s: empty file", path)
	}
	return pw, nil
}

func encodePTB(path string, pw ptbWords, v *PTBVocab) ([]int32, error) {
	ids := make([]int32, len(pw.words))
	for i, w := range pw.words {
		id, ok := v.ids[w]
		if !ok {
			return nil, fmt.Errorf("datasets: %s:%d: word %q is not in the training vocabulary (%d words)", path, pw.lines[i], w, v.Size())
		}
		ids[i] = id
	}
	return ids, nil
}

// ShardTokens returns rank's contiguous share of a token stream for world data-parallel
// ranks: the stream cut into world equal parts (the remainder dropped, at most world−1
// tokens), as SparDL's and Ok-Topk's code give each worker its own part of the corpus. Each rank then
// batchifies its part and carries its hidden state through it.
func ShardTokens(tokens []int32, rank, world int) ([]int32, error) {
	if world < 1 || rank < 0 || rank >= world {
		return nil, fmt.Errorf("datasets: ShardTokens: rank %d of %d", rank, world)
	}
	per := len(tokens) / world
	if per < 2 {
		return nil, fmt.Errorf("datasets: ShardTokens: %d tokens for %d ranks: each needs at least 2 (an input and its target)", len(tokens), world)
	}
	return tokens[rank*per : (rank+1)*per], nil
}

// LMBatches is a token stream laid out in Cols parallel streams, word_language_model's
// batchify: Data is [Rows, Cols] row-major and column j is the stream's j-th slice of Rows
// tokens (the remainder of the stream is dropped). Row r holds time step r of every column.
type LMBatches struct {
	Data       []int32
	Rows, Cols int
}

// Batchify lays tokens out in cols columns.
func Batchify(tokens []int32, cols int) (*LMBatches, error) {
	if cols < 1 {
		return nil, fmt.Errorf("datasets: Batchify: %d columns", cols)
	}
	rows := len(tokens) / cols
	if rows < 2 {
		return nil, fmt.Errorf("datasets: Batchify: %d tokens in %d columns leave %d rows, need at least 2 (an input and its target)", len(tokens), cols, rows)
	}
	b := &LMBatches{Data: make([]int32, rows*cols), Rows: rows, Cols: cols}
	for j := 0; j < cols; j++ {
		for r := 0; r < rows; r++ {
			b.Data[r*cols+j] = tokens[j*rows+r]
		}
	}
	return b, nil
}

// Windows is the number of bptt windows: the last may be shorter (every row but the last
// is an input once).
func (b *LMBatches) Windows(bptt int) int {
	if bptt < 1 {
		return 0
	}
	return (b.Rows - 1 + bptt - 1) / bptt
}

// Window returns window i of bptt time steps: inputs x are rows [i·bptt, i·bptt+steps) and
// targets y the same rows shifted by one, both [steps, Cols] row-major views into Data
// (not copies). steps is bptt except for a shorter last window.
func (b *LMBatches) Window(i, bptt int) (x, y []int32, steps int) {
	start := i * bptt
	steps = min(bptt, b.Rows-1-start)
	if bptt < 1 || i < 0 || steps < 1 {
		return nil, nil, 0
	}
	c := b.Cols
	return b.Data[start*c : (start+steps)*c], b.Data[(start+1)*c : (start+1+steps)*c], steps
}
