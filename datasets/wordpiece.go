package datasets

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// The special tokens of BERT's vocabulary, in the order a trained vocabulary
// puts them first ([PAD] gets id 0, as BERT's padding).
const (
	PadToken  = "[PAD]"
	UnkToken  = "[UNK]"
	ClsToken  = "[CLS]"
	SepToken  = "[SEP]"
	MaskToken = "[MASK]"
)

// SpecialTokens are PadToken, UnkToken, ClsToken, SepToken, MaskToken.
var SpecialTokens = []string{PadToken, UnkToken, ClsToken, SepToken, MaskToken}

// WordPieceMaxChars is BERT's max_input_chars_per_word: longer words
// become UnkToken.
const WordPieceMaxChars = 100

// BasicTokenizer is BERT's BasicTokenizer (tokenization.py): it removes NUL,
// U+FFFD and control characters, turns white space into spaces, puts
// spaces around CJK ideographs, splits on white space, optionally
// lowercases and strips accents (NFD, then drops non-spacing marks), and
// splits every punctuation character (ASCII non-alphanumerics and Unicode
// P*) into its own token.
type BasicTokenizer struct {
	Lowercase    bool
	StripAccents bool
	// NeverSplit lists tokens kept as they are when they stand between
	// white space (Hugging Face's never_split): "[MASK]" in a text stays
	// one token instead of "[", "mask", "]".
	NeverSplit []string
}

// Tokenize splits text into basic tokens.
func (b BasicTokenizer) Tokenize(text string) []string {
	var clean strings.Builder
	for _, r := range text {
		switch {
		case r == 0 || r == utf8.RuneError || isBertControl(r):
		case isBertWhitespace(r):
			clean.WriteByte(' ')
		case isCJK(r):
			clean.WriteByte(' ')
			clean.WriteRune(r)
			clean.WriteByte(' ')
		default:
			clean.WriteRune(r)
		}
	}
	var out []string
	for _, tok := range strings.Fields(clean.String()) {
		if slices.Contains(b.NeverSplit, tok) {
			out = append(out, tok)
			continue
		}
		if b.Lowercase {
			tok = strings.ToLower(tok)
		}
		if b.StripAccents {
			tok = stripAccents(tok)
		}
		out = splitOnPunct(out, tok)
	}
	return out
}

func stripAccents(s string) string {
	var b strings.Builder
	for _, r := range norm.NFD.String(s) {
		if !unicode.Is(unicode.Mn, r) {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// splitOnPunct appends tok's pieces: runs of non-punctuation and single
// punctuation characters.
func splitOnPunct(dst []string, tok string) []string {
	start := 0
	for i, r := range tok {
		if isBertPunct(r) {
			if i > start {
				dst = append(dst, tok[start:i])
			}
			dst = append(dst, string(r))
			start = i + utf8.RuneLen(r)
		}
	}
	if start < len(tok) {
		dst = append(dst, tok[start:])
	}
	return dst
}

// isBertWhitespace is BERT's _is_whitespace: space, tab, newline, CR and
// Unicode Zs.
func isBertWhitespace(r rune) bool {
	return r == ' ' || r == '\t' || r == '\n' || r == '\r' || unicode.Is(unicode.Zs, r)
}

// isBertControl is BERT's _is_control: Unicode category C* (including
// unassigned code points) except tab, newline and CR.
func isBertControl(r rune) bool {
	if r == '\t' || r == '\n' || r == '\r' {
		return false
	}
	return unicode.In(r, unicode.C) || !unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Z)
}

// isBertPunct is BERT's _is_punctuation: every non-alphanumeric ASCII
// character, and Unicode P*.
func isBertPunct(r rune) bool {
	if (r >= 33 && r <= 47) || (r >= 58 && r <= 64) || (r >= 91 && r <= 96) || (r >= 123 && r <= 126) {
		return true
	}
	return unicode.In(r, unicode.P)
}

// isCJK is BERT's _is_chinese_char: the CJK Unified Ideographs blocks
// (not Hiragana, Katakana or Hangul, which are written with spaces).
func isCJK(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) || (r >= 0x3400 && r <= 0x4DBF) ||
		(r >= 0x20000 && r <= 0x2A6DF) || (r >= 0x2A700 && r <= 0x2B73F) ||
		(r >= 0x2B740 && r <= 0x2B81F) || (r >= 0x2B820 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) || (r >= 0x2F800 && r <= 0x2FA1F)
}

// Vocab is a WordPiece vocabulary: token i has id i.
type Vocab struct {
	// Name says where the vocabulary came from (a file path), for errors.
	Name   string
	tokens []string
	ids    map[string]int32
}

// NewVocab builds a vocabulary from tokens in id order; tokens must be
// non-empty, without white space, and distinct.
func NewVocab(name string, tokens []string) (*Vocab, error) {
	v := &Vocab{Name: name, tokens: slices.Clone(tokens), ids: make(map[string]int32, len(tokens))}
	for i, t := range tokens {
		if err := v.add(t, i); err != nil {
			return nil, fmt.Errorf("datasets: vocabulary %s: token %d: %w", name, i, err)
		}
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("datasets: vocabulary %s is empty", name)
	}
	return v, nil
}

func (v *Vocab) add(t string, id int) error {
	switch {
	case t == "":
		return errors.New("empty token")
	case strings.IndexFunc(t, unicode.IsSpace) >= 0:
		return fmt.Errorf("token %q contains white space", t)
	}
	if prev, dup := v.ids[t]; dup {
		return fmt.Errorf("token %q repeats id %d", t, prev)
	}
	v.ids[t] = int32(id)
	return nil
}

// LoadVocab reads a BERT vocab.txt: one token per line, id = line number
// − 1, surrounding white space ignored. Blank lines, repeated tokens and
// invalid UTF-8 are errors naming the line.
func LoadVocab(path string) (*Vocab, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("datasets: %w", err)
	}
	defer f.Close()
	return ReadVocab(f, path)
}

// ReadVocab is LoadVocab from a reader; name is used in errors.
func ReadVocab(r io.Reader, name string) (*Vocab, error) {
	v := &Vocab{Name: name, ids: make(map[string]int32)}
	br := bufio.NewReader(r)
	for line := 1; ; line++ {
		text, err := br.ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("datasets: vocabulary %s: line %d: %w", name, line, err)
		}
		if text == "" && errors.Is(err, io.EOF) {
			break
		}
		if !utf8.ValidString(text) {
			return nil, fmt.Errorf("datasets: vocabulary %s: line %d: invalid UTF-8", name, line)
		}
		tok := strings.TrimSpace(text)
		if e := v.add(tok, len(v.tokens)); e != nil {
			return nil, fmt.Errorf("datasets: vocabulary %s: line %d: %w", name, line, e)
		}
		v.tokens = append(v.tokens, tok)
		if err != nil {
			break
		}
	}
	if len(v.tokens) == 0 {
		return nil, fmt.Errorf("datasets: vocabulary %s is empty", name)
	}
	return v, nil
}

// Size is the number of tokens.
func (v *Vocab) Size() int { return len(v.tokens) }

// ID returns the id of token and whether it is in the vocabulary.
func (v *Vocab) ID(token string) (int32, bool) {
	id, ok := v.ids[token]
	return id, ok
}

// Token returns the token of id ("" if out of range).
func (v *Vocab) Token(id int32) string {
	if id < 0 || int(id) >= len(v.tokens) {
		return ""
	}
	return v.tokens[id]
}

// Tokens returns a copy of the tokens in id order.
func (v *Vocab) Tokens() []string { return slices.Clone(v.tokens) }

// WriteTo writes the vocabulary as vocab.txt (one token per line).
func (v *Vocab) WriteTo(w io.Writer) (int64, error) {
	var buf bytes.Buffer
	for _, t := range v.tokens {
		buf.WriteString(t)
		buf.WriteByte('\n')
	}
	return buf.WriteTo(w)
}

// Save writes the vocabulary to path as vocab.txt.
func (v *Vocab) Save(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("datasets: %w", err)
	}
	if _, err := v.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("datasets: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("datasets: write %s: %w", path, err)
	}
	return nil
}

// WordPieceTokenizer is BERT's FullTokenizer: a BasicTokenizer followed by
// greedy longest-match-first WordPiece, continuation pieces prefixed by
// "##"; a word that cannot be split into vocabulary pieces, or longer than
// WordPieceMaxChars characters, becomes UnkToken.
type WordPieceTokenizer struct {
	Basic BasicTokenizer
	vocab *Vocab
	unk   int32
}

// NewWordPieceTokenizer checks that vocab has UnkToken. lowercase selects
// BERT's uncased models (lowercase and strip accents). The special tokens
// of the vocabulary are never split (a corpus line may say "[UNK]").
func NewWordPieceTokenizer(vocab *Vocab, lowercase bool) (*WordPieceTokenizer, error) {
	if vocab == nil {
		return nil, errors.New("datasets: NewWordPieceTokenizer: nil vocabulary")
	}
	unk, ok := vocab.ID(UnkToken)
	if !ok {
		return nil, fmt.Errorf("datasets: vocabulary %s has no %s token", vocab.Name, UnkToken)
	}
	var keep []string
	for _, s := range SpecialTokens {
		if _, ok := vocab.ID(s); ok {
			keep = append(keep, s)
		}
	}
	return &WordPieceTokenizer{Basic: BasicTokenizer{Lowercase: lowercase, StripAccents: lowercase, NeverSplit: keep}, vocab: vocab, unk: unk}, nil
}

// Vocab returns the tokenizer's vocabulary.
func (t *WordPieceTokenizer) Vocab() *Vocab { return t.vocab }

// Tokenize returns the WordPiece tokens of text.
func (t *WordPieceTokenizer) Tokenize(text string) []string {
	var out []string
	for _, w := range t.Basic.Tokenize(text) {
		out = t.appendPieces(out, w)
	}
	return out
}

// Encode returns the ids of Tokenize(text).
func (t *WordPieceTokenizer) Encode(text string) []int32 {
	toks := t.Tokenize(text)
	ids := make([]int32, len(toks))
	for i, tk := range toks {
		ids[i] = t.vocab.ids[tk] // every piece is in the vocabulary
	}
	return ids
}

// appendPieces appends the WordPiece split of one basic token.
func (t *WordPieceTokenizer) appendPieces(dst []string, word string) []string {
	if utf8.RuneCountInString(word) > WordPieceMaxChars {
		return append(dst, UnkToken)
	}
	n := len(dst)
	for start := 0; start < len(word); {
		end := len(word)
		found := ""
		for end > start {
			sub := word[start:end]
			if start > 0 {
				sub = "##" + sub
			}
			if _, ok := t.vocab.ids[sub]; ok {
				found = sub
				break
			}
			_, size := utf8.DecodeLastRuneInString(word[start:end])
			end -= size
		}
		if found == "" {
			return append(dst[:n], UnkToken)
		}
		dst = append(dst, found)
		start = end
	}
	return dst
}

// WordPieceTrainerOptions configure TrainWordPiece.
type WordPieceTrainerOptions struct {
	// VocabSize is the target number of tokens, specials included (> 0).
	VocabSize int
	// Lowercase selects an uncased vocabulary (lowercase and strip
	// accents), as the tokenizer that will use it must.
	Lowercase bool
	// MinPairCount is the smallest count a pair needs to be merged (0 or 1:
	// any pair).
	MinPairCount int
	// Specials come first in the vocabulary; nil means SpecialTokens.
	Specials []string
	// MergeByCount merges the most frequent pair instead of the pair with
	// the best WordPiece score: what Hugging Face's WordPieceTrainer does
	// (it runs its BPE trainer). The score favours pairs of rare symbols,
	// so on PTB with 8,000 tokens even "the" stays "th ##e"; counting
	// makes frequent words whole tokens early.
	MergeByCount bool
}

// TrainWordPiece builds a WordPiece vocabulary from a corpus read from r
// (any text; lines are tokenized with BasicTokenizer), the WordPiece
// training algorithm as described by Hugging Face's course:
//
//  1. the initial vocabulary is Specials, then every character that starts
//     a word and "##"+every character that continues one (sorted);
//  2. every word is split into those pieces; then, repeatedly, the
//     adjacent pair (a, b) with the highest score
//     count(ab) / (count(a)·count(b)) (counts weighted by word frequency)
//     is merged into a + b without b's "##" — ties go to the pair with
//     the larger count, then to the smaller merged token, then smaller a —
//     until the vocabulary has VocabSize tokens or no pair is left.
//
// (Hugging Face's tokenizers library trains WordPiece vocabularies with
// its BPE trainer, which merges by count alone: MergeByCount; the score
// above is WordPiece's own criterion.) Words longer than WordPieceMaxChars are
// skipped, as the tokenizer maps them to UnkToken. The result depends only
// on the corpus and the options. name is used in errors.
func TrainWordPiece(ctx context.Context, r io.Reader, name string, opt WordPieceTrainerOptions) (*Vocab, error) {
	specials := opt.Specials
	if specials == nil {
		specials = SpecialTokens
	}
	if opt.VocabSize <= 0 {
		return nil, fmt.Errorf("datasets: WordPieceTrainerOptions.VocabSize = %d, must be > 0", opt.VocabSize)
	}
	basic := BasicTokenizer{Lowercase: opt.Lowercase, StripAccents: opt.Lowercase}
	wordCount := make(map[string]int)
	br := bufio.NewReader(r)
	for line := 1; ; line++ {
		if line%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		text, err := br.ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("datasets: TrainWordPiece: %s: line %d: %w", name, line, err)
		}
		if !utf8.ValidString(text) {
			return nil, fmt.Errorf("datasets: TrainWordPiece: %s: line %d: invalid UTF-8", name, line)
		}
		for _, w := range basic.Tokenize(text) {
			if utf8.RuneCountInString(w) <= WordPieceMaxChars {
				wordCount[w]++
			}
		}
		if err != nil {
			break
		}
	}
	if len(wordCount) == 0 {
		return nil, fmt.Errorf("datasets: TrainWordPiece: %s has no words", name)
	}
	tr := newWordPieceTrainer(wordCount)
	vocab := slices.Clone(specials)
	inVocab := make(map[string]bool)
	for _, s := range specials {
		inVocab[s] = true
	}
	for _, s := range tr.alphabet() {
		if !inVocab[s] {
			inVocab[s] = true
			vocab = append(vocab, s)
		}
	}
	if len(vocab) > opt.VocabSize {
		return nil, fmt.Errorf("datasets: TrainWordPiece: VocabSize %d is smaller than the %d special tokens and characters of %s",
			opt.VocabSize, len(vocab), name)
	}
	minCount := max(opt.MinPairCount, 1)
	for merges := 0; len(vocab) < opt.VocabSize; merges++ {
		if merges%64 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		tok, ok := tr.mergeBest(minCount, opt.MergeByCount)
		if !ok {
			break
		}
		if !inVocab[tok] {
			inVocab[tok] = true
			vocab = append(vocab, tok)
		}
	}
	return NewVocab(name, vocab)
}

// wordPieceTrainer holds the corpus's words split into symbols and the
// counts of symbols and adjacent pairs, updated incrementally by merges.
type wordPieceTrainer struct {
	words     [][]int32 // symbol ids of each distinct word
	counts    []int     // frequency of each word
	symbols   []string
	symID     map[string]int32
	symCount  []int
	pairCount map[[2]int32]int
	pairWords map[[2]int32][]int // words that contained the pair when it was counted (may be stale)
}

func newWordPieceTrainer(wordCount map[string]int) *wordPieceTrainer {
	words := make([]string, 0, len(wordCount))
	for w := range wordCount {
		words = append(words, w)
	}
	slices.Sort(words)
	t := &wordPieceTrainer{symID: make(map[string]int32), pairCount: make(map[[2]int32]int), pairWords: make(map[[2]int32][]int)}
	for wi, w := range words {
		var syms []int32
		for i, r := range w {
			s := string(r)
			if i > 0 {
				s = "##" + s
			}
			syms = append(syms, t.symbol(s))
		}
		t.words = append(t.words, syms)
		t.counts = append(t.counts, wordCount[w])
		t.account(wi, +1)
	}
	return t
}

func (t *wordPieceTrainer) symbol(s string) int32 {
	if id, ok := t.symID[s]; ok {
		return id
	}
	id := int32(len(t.symbols))
	t.symbols = append(t.symbols, s)
	t.symID[s] = id
	t.symCount = append(t.symCount, 0)
	return id
}

// account adds (sign +1) or removes (−1) word wi's symbols and pairs.
func (t *wordPieceTrainer) account(wi int, sign int) {
	syms, c := t.words[wi], t.counts[wi]*sign
	for i, s := range syms {
		t.symCount[s] += c
		if i > 0 {
			p := [2]int32{syms[i-1], s}
			t.pairCount[p] += c
			if sign > 0 {
				if ws := t.pairWords[p]; len(ws) == 0 || ws[len(ws)-1] != wi {
					t.pairWords[p] = append(ws, wi)
				}
			} else if t.pairCount[p] == 0 {
				delete(t.pairCount, p)
			}
		}
	}
}

// alphabet is the initial symbols, sorted.
func (t *wordPieceTrainer) alphabet() []string {
	s := slices.Clone(t.symbols)
	slices.Sort(s)
	return s
}

// mergeBest merges the best-scoring pair (the most frequent one if
// byCount) in every word and returns the merged token; false if no pair
// has at least minCount occurrences.
func (t *wordPieceTrainer) mergeBest(minCount int, byCount bool) (string, bool) {
	var best [2]int32
	var bestScore float64
	bestCount := 0
	bestTok := ""
	for p, c := range t.pairCount {
		if c < minCount {
			continue
		}
		score := float64(c) / (float64(t.symCount[p[0]]) * float64(t.symCount[p[1]]))
		if byCount {
			score = float64(c)
		}
		if bestCount > 0 {
			if score < bestScore || (score == bestScore && c < bestCount) {
				continue
			}
			if score == bestScore && c == bestCount {
				tok := t.merged(p)
				if tok > bestTok || (tok == bestTok && t.symbols[p[0]] >= t.symbols[best[0]]) {
					continue
				}
			}
		}
		best, bestScore, bestCount, bestTok = p, score, c, t.merged(p)
	}
	if bestCount == 0 {
		return "", false
	}
	newSym := t.symbol(bestTok)
	for _, wi := range t.pairWords[best] {
		syms := t.words[wi]
		if !containsPair(syms, best) {
			continue // stale entry
		}
		t.account(wi, -1)
		out := syms[:0:0]
		for i := 0; i < len(syms); i++ {
			if i+1 < len(syms) && syms[i] == best[0] && syms[i+1] == best[1] {
				out = append(out, newSym)
				i++
			} else {
				out = append(out, syms[i])
			}
		}
		t.words[wi] = out
		t.account(wi, +1)
	}
	delete(t.pairWords, best)
	return bestTok, true
}

func (t *wordPieceTrainer) merged(p [2]int32) string {
	return t.symbols[p[0]] + strings.TrimPrefix(t.symbols[p[1]], "##")
}

func containsPair(syms []int32, p [2]int32) bool {
	for i := 1; i < len(syms); i++ {
		if syms[i-1] == p[0] && syms[i] == p[1] {
			return true
		}
	}
	return false
}
