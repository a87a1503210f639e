package datasets

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// bertTestVocab is the vocabulary of google-research/bert's
// tokenization_test.py (test_full_tokenizer, test_wordpiece_tokenizer).
var bertTestVocab = []string{"[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa", "un", "runn", "##ing", ","}

func writeVocabFile(t *testing.T, tokens []string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "vocab.txt")
	if err := os.WriteFile(path, []byte(strings.Join(tokens, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Cases from google-research/bert tokenization_test.py.
func TestWordPieceBERTFullTokenizer(t *testing.T) {
	v, err := LoadVocab(writeVocabFile(t, bertTestVocab))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := NewWordPieceTokenizer(v, true)
	if err != nil {
		t.Fatal(err)
	}
	got := tok.Tokenize("UNwant\u00E9d,running")
	want := []string{"un", "##want", "##ed", ",", "runn", "##ing"}
	if !slices.Equal(got, want) {
		t.Fatalf("Tokenize = %q, want %q", got, want)
	}
	// Special tokens of the vocabulary are kept whole between spaces; glued
	// together they are split ("[", "sep", "]", … are not in the vocabulary).
	if got, want := tok.Tokenize("[CLS] want [SEP][UNK]"), []string{"[CLS]", "want", "[UNK]", "[UNK]", "[UNK]", "[UNK]", "[UNK]", "[UNK]"}; !slices.Equal(got, want) {
		t.Errorf("Tokenize with specials = %q, want %q", got, want)
	}
	if ids, wantIDs := tok.Encode("UNwant\u00E9d,running"), []int32{7, 4, 5, 10, 8, 9}; !slices.Equal(ids, wantIDs) {
		t.Fatalf("Encode = %v, want %v", ids, wantIDs)
	}
}

func TestWordPieceBERTWordpieceTokenizer(t *testing.T) {
	v, err := NewVocab("test", bertTestVocab)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := NewWordPieceTokenizer(v, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"unwanted running", []string{"un", "##want", "##ed", "runn", "##ing"}},
		{"unwantedX running", []string{"[UNK]", "runn", "##ing"}},
		{"unun want", []string{"[UNK]", "want"}}, // "##un" is not in the vocabulary
		// 100 characters split; 104 exceed WordPieceMaxChars.
		{strings.Repeat("want", 25), append([]string{"want"}, slices.Repeat([]string{"##want"}, 24)...)},
		{strings.Repeat("want", 26), []string{"[UNK]"}},
	} {
		if got := tok.Tokenize(c.in); !slices.Equal(got, c.want) {
			t.Errorf("Tokenize(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestBasicTokenizerBERTCases(t *testing.T) {
	lower := BasicTokenizer{Lowercase: true, StripAccents: true}
	cased := BasicTokenizer{}
	for _, c := range []struct {
		tk   BasicTokenizer
		in   string
		want []string
	}{
		{lower, "ah\u535A\u63A8zz", []string{"ah", "\u535A", "\u63A8", "zz"}},
		{lower, " \tHeLLo!how  \n Are yoU?  ", []string{"hello", "!", "how", "are", "you", "?"}},
		{lower, "H\u00E9llo", []string{"hello"}},
		{cased, " \tHeLLo!how  \n Are yoU?  ", []string{"HeLLo", "!", "how", "Are", "yoU", "?"}},
		{cased, "H\u00E9llo", []string{"H\u00E9llo"}},
		{lower, "a\x00b\ufffdc\u200bd", []string{"abcd"}},   // NUL, U+FFFD, Cf removed
		{lower, "x\u00a0y$z", []string{"x", "y", "$", "z"}}, // Zs is white space, $ is ASCII punctuation
		{lower, "don't", []string{"don", "'", "t"}},
	} {
		if got := c.tk.Tokenize(c.in); !slices.Equal(got, c.want) {
			t.Errorf("%+v.Tokenize(%q) = %q, want %q", c.tk, c.in, got, c.want)
		}
	}
	// BERT's _is_whitespace / _is_control / _is_punctuation tests.
	for _, r := range []rune{' ', '\t', '\r', '\n', '\u00A0'} {
		if !isBertWhitespace(r) {
			t.Errorf("isBertWhitespace(%q) = false", r)
		}
	}
	for _, r := range []rune{'A', '-'} {
		if isBertWhitespace(r) {
			t.Errorf("isBertWhitespace(%q) = true", r)
		}
	}
	if !isBertControl('\u0005') || isBertControl('A') || isBertControl(' ') || isBertControl('\t') || isBertControl('\r') {
		t.Error("isBertControl disagrees with BERT's test")
	}
	for _, r := range []rune{'-', '$', '`', '.'} {
		if !isBertPunct(r) {
			t.Errorf("isBertPunct(%q) = false", r)
		}
	}
	if isBertPunct('A') || isBertPunct(' ') {
		t.Error("isBertPunct('A' or ' ') = true")
	}
}

func TestVocabErrors(t *testing.T) {
	for _, c := range []struct {
		name, content, want string
	}{
		{"empty", "", "is empty"},
		{"blank line", "[UNK]\n\nfoo\n", "line 2: empty token"},
		{"duplicate", "[UNK]\nfoo\nbar\nfoo\n", "line 4: token \"foo\" repeats id 1"},
		{"bad utf8", "[UNK]\nfo\xffo\n", "line 2: invalid UTF-8"},
		{"inner space", "[UNK]\nfoo bar\n", "line 2: token \"foo bar\" contains white space"},
	} {
		path := filepath.Join(t.TempDir(), "vocab.txt")
		if err := os.WriteFile(path, []byte(c.content), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := LoadVocab(path)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: LoadVocab error = %v, want %q and the path", c.name, err, c.want)
		}
	}
	path := writeVocabFile(t, []string{"[CLS]", "foo"})
	v, err := LoadVocab(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewWordPieceTokenizer(v, true); err == nil || !strings.Contains(err.Error(), "[UNK]") || !strings.Contains(err.Error(), path) {
		t.Errorf("NewWordPieceTokenizer without [UNK]: error = %v", err)
	}
	// CRLF line endings and a missing final newline are accepted.
	v, err = ReadVocab(strings.NewReader("[UNK]\r\nfoo\r\nbar"), "crlf")
	if err != nil || v.Size() != 3 || v.Token(2) != "bar" {
		t.Errorf("ReadVocab CRLF: %v, %v", v, err)
	}
}

const wordPieceCorpus = `The quick brown fox jumps over the lazy dog.
The lazy dogs were jumping; the foxes were quicker!
Quickly, quietly, the brown foxes jumped over lazier dogs.

Jumping jumpers jump jointly. Unwanted, unjumped, unquick.
`

func TestTrainWordPieceRoundTrip(t *testing.T) {
	ctx := context.Background()
	opt := WordPieceTrainerOptions{VocabSize: 90, Lowercase: true}
	v, err := TrainWordPiece(ctx, strings.NewReader(wordPieceCorpus), "corpus", opt)
	if err != nil {
		t.Fatal(err)
	}
	toks := v.Tokens()
	if !slices.Equal(toks[:5], SpecialTokens) {
		t.Fatalf("first tokens %q, want %q", toks[:5], SpecialTokens)
	}
	if v.Size() != 90 {
		t.Fatalf("vocabulary size %d, want 90", v.Size())
	}
	// Deterministic: a second training gives the same vocabulary.
	v2, err := TrainWordPiece(ctx, strings.NewReader(wordPieceCorpus), "corpus", opt)
	if err != nil || !slices.Equal(v2.Tokens(), toks) {
		t.Fatalf("second training differs: %v", err)
	}
	// Frequent whole words were learnt.
	for _, w := range []string{"lazy", "fox", "quick", "brown"} {
		if _, ok := v.ID(w); !ok {
			t.Errorf("frequent word %q not in the vocabulary", w)
		}
	}
	// With a target beyond what the corpus can give, training stops when
	// every word is one token.
	big, err := TrainWordPiece(ctx, strings.NewReader(wordPieceCorpus), "corpus", WordPieceTrainerOptions{VocabSize: 1000, Lowercase: true})
	if err != nil {
		t.Fatal(err)
	}
	if big.Size() >= 1000 {
		t.Fatalf("size %d: training did not stop", big.Size())
	}
	for _, w := range (BasicTokenizer{Lowercase: true, StripAccents: true}).Tokenize(wordPieceCorpus) {
		if _, ok := big.ID(w); !ok {
			t.Errorf("word %q is not a token of the exhaustive vocabulary", w)
		}
	}
	// Save, load, and tokenize the corpus: no [UNK] (every character is in
	// the alphabet), same ids with the loaded vocabulary, and the pieces
	// spell the words.
	path := filepath.Join(t.TempDir(), "vocab.txt")
	if err := v.Save(path); err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadVocab(path)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(loaded.Tokens(), toks) {
		t.Fatal("loaded vocabulary differs from the saved one")
	}
	tk1, _ := NewWordPieceTokenizer(v, true)
	tk2, err := NewWordPieceTokenizer(loaded, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(wordPieceCorpus, "\n") {
		pieces := tk2.Tokenize(line)
		if slices.Contains(pieces, UnkToken) {
			t.Errorf("line %q tokenized with [UNK]: %q", line, pieces)
		}
		if !slices.Equal(tk1.Encode(line), tk2.Encode(line)) {
			t.Errorf("line %q: ids differ between saved and loaded vocabulary", line)
		}
		var words []string
		for _, p := range pieces {
			if strings.HasPrefix(p, "##") {
				words[len(words)-1] += p[2:]
			} else {
				words = append(words, p)
			}
		}
		if basic := tk2.Basic.Tokenize(line); !slices.Equal(words, basic) {
			t.Errorf("pieces %q spell %q, want %q", pieces, words, basic)
		}
	}
	var buf bytes.Buffer
	if _, err := loaded.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	if saved, _ := os.ReadFile(path); !bytes.Equal(buf.Bytes(), saved) {
		t.Error("WriteTo differs from Save")
	}
}

// The merge order follows the score count(ab)/(count(a)·count(b)), not the
// pair count: hand-computed on a tiny corpus.
func TestTrainWordPieceScore(t *testing.T) {
	// Words: "ab"×4, "cd"×1, "ac"×2. Initial symbols a, c, ##b, ##c, ##d.
	// counts: a=6, c=1, ##b=4, ##c=2, ##d=1.
	// pairs: (a,##b)=4 → 4/(6·4)=1/6; (c,##d)=1 → 1/(1·1)=1; (a,##c)=2 → 2/(6·2)=1/6.
	// First merge: "cd" (score 1, though its count is the smallest). Then
	// (a,##b) and (a,##c) tie at 1/6; the larger count wins: "ab"; then "ac".
	corpus := strings.Repeat("ab ", 4) + "cd " + strings.Repeat("ac ", 2)
	v, err := TrainWordPiece(context.Background(), strings.NewReader(corpus), "tiny",
		WordPieceTrainerOptions{VocabSize: 100, Specials: []string{UnkToken}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{UnkToken, "##b", "##c", "##d", "a", "c", "cd", "ab", "ac"}
	if got := v.Tokens(); !slices.Equal(got, want) {
		t.Fatalf("vocabulary %q, want %q", got, want)
	}
	// By count (Hugging Face's trainer): ab (4), ac (2), cd (1).
	v, err = TrainWordPiece(context.Background(), strings.NewReader(corpus), "tiny",
		WordPieceTrainerOptions{VocabSize: 100, Specials: []string{UnkToken}, MergeByCount: true})
	if err != nil {
		t.Fatal(err)
	}
	want = []string{UnkToken, "##b", "##c", "##d", "a", "c", "ab", "ac", "cd"}
	if got := v.Tokens(); !slices.Equal(got, want) {
		t.Fatalf("vocabulary by count %q, want %q", got, want)
	}
}

func TestTrainWordPieceErrors(t *testing.T) {
	ctx := context.Background()
	if _, err := TrainWordPiece(ctx, strings.NewReader("abc def"), "c", WordPieceTrainerOptions{VocabSize: 6}); err == nil ||
		!strings.Contains(err.Error(), "smaller than") {
		t.Errorf("tiny VocabSize: error = %v", err)
	}
	if _, err := TrainWordPiece(ctx, strings.NewReader("  \n\n"), "blank.txt", WordPieceTrainerOptions{VocabSize: 60}); err == nil ||
		!strings.Contains(err.Error(), "blank.txt has no words") {
		t.Errorf("empty corpus: error = %v", err)
	}
	if _, err := TrainWordPiece(ctx, strings.NewReader("ok\nbad \xff\n"), "bad.txt", WordPieceTrainerOptions{VocabSize: 60}); err == nil ||
		!strings.Contains(err.Error(), "bad.txt: line 2: invalid UTF-8") {
		t.Errorf("bad UTF-8: error = %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := TrainWordPiece(cctx, strings.NewReader(wordPieceCorpus), "c", WordPieceTrainerOptions{VocabSize: 200}); err == nil {
		t.Error("cancelled context: no error")
	}
}
