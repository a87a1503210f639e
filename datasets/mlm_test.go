package datasets

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// mlmFixture is a vocabulary of the specials plus words w000…w(n-1), and a
// generated corpus of docs documents of 10–40 sentences of 3–12 words.
func mlmFixture(t *testing.T, words, docs int, seed uint64) (*WordPieceTokenizer, [][]string) {
	t.Helper()
	toks := slices.Clone(SpecialTokens)
	for i := range words {
		toks = append(toks, fmt.Sprintf("w%03d", i))
	}
	v, err := NewVocab("mlm-test", toks)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := NewWordPieceTokenizer(v, true)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	var corpus [][]string
	for range docs {
		var doc []string
		for range 10 + rng.IntN(31) {
			var s []string
			for range 3 + rng.IntN(10) {
				s = append(s, fmt.Sprintf("W%03d", rng.IntN(words))) // upper case: the tokenizer lowercases
			}
			doc = append(doc, strings.Join(s, " "))
		}
		corpus = append(corpus, doc)
	}
	return tok, corpus
}

func mlmBatches(t *testing.T, l *MLMLoader, epoch int) []MLMBatch {
	t.Helper()
	var out []MLMBatch
	for b, err := range l.Epoch(context.Background(), epoch) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, MLMBatch{ // copies: the loader reuses its buffer
			InputIDs: slices.Clone(b.InputIDs), TokenTypeIDs: slices.Clone(b.TokenTypeIDs),
			AttentionMask: slices.Clone(b.AttentionMask), Labels: slices.Clone(b.Labels),
			NextSentence: slices.Clone(b.NextSentence), N: b.N, SeqLen: b.SeqLen,
		})
	}
	return out
}

func TestMLMInvariantsAndProportions(t *testing.T) {
	tok, corpus := mlmFixture(t, 200, 250, 1)
	const L = 64
	d, err := NewMLMDataset(context.Background(), corpus, tok, MLMOptions{MaxSeqLen: L, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	v := tok.Vocab()
	id := func(s string) int32 { i, _ := v.ID(s); return i }
	cls, sep, mask, pad := id(ClsToken), id(SepToken), id(MaskToken), id(PadToken)
	l, err := NewMLMLoader(d, MLMLoaderOptions{Batch: 32, Shuffle: true})
	if err != nil {
		t.Fatal(err)
	}
	var candidates, chosen, masked, kept, random, randomNext, samples int
	for _, b := range mlmBatches(t, l, 0) {
		if b.SeqLen != L || len(b.InputIDs) != b.N*L || len(b.Labels) != b.N*L || len(b.NextSentence) != b.N {
			t.Fatalf("batch shapes: N %d SeqLen %d", b.N, b.SeqLen)
		}
		for k := range b.N {
			samples++
			ids, types, att, labels := b.InputIDs[k*L:(k+1)*L], b.TokenTypeIDs[k*L:(k+1)*L], b.AttentionMask[k*L:(k+1)*L], b.Labels[k*L:(k+1)*L]
			n := int(slices.Index(att, 0))
			if n < 0 {
				n = L
			}
			if ids[0] != cls || ids[n-1] != sep {
				t.Fatalf("sample does not start with [CLS] and end with [SEP]: %v", ids[:n])
			}
			mid := slices.Index(ids[1:n-1], sep) + 1
			if mid < 2 || mid > n-3 || slices.Contains(ids[mid+1:n-1], sep) || slices.Contains(ids[1:n], cls) {
				t.Fatalf("want [CLS] A [SEP] B [SEP] with non-empty A and B: %v", ids[:n])
			}
			for p := range L {
				wantType, wantAtt := int32(0), int32(1)
				if p > mid && p < n {
					wantType = 1
				}
				if p >= n {
					wantType, wantAtt = 0, 0
					if ids[p] != pad || labels[p] != IgnoreLabel {
						t.Fatalf("padding position %d: id %d label %d", p, ids[p], labels[p])
					}
				}
				if types[p] != wantType || att[p] != wantAtt {
					t.Fatalf("position %d of %d (B from %d): type %d attention %d", p, n, mid+1, types[p], att[p])
				}
				special := p == 0 || p == mid || p >= n-1
				if special {
					if labels[p] != IgnoreLabel {
						t.Fatalf("special position %d has label %d", p, labels[p])
					}
					continue
				}
				candidates++
				if labels[p] == IgnoreLabel {
					if ids[p] == mask || ids[p] < 5 {
						t.Fatalf("unchosen position %d holds special %d", p, ids[p])
					}
					continue
				}
				if labels[p] < 5 {
					t.Fatalf("label %d at %d is a special token", labels[p], p)
				}
				chosen++
				switch {
				case ids[p] == mask:
					masked++
				case ids[p] == labels[p]:
					kept++
				case ids[p] >= 5:
					random++
				default:
					t.Fatalf("chosen position %d replaced by special %d", p, ids[p])
				}
			}
			if b.NextSentence[k] == RandomNextLabel {
				randomNext++
			} else if b.NextSentence[k] != IsNextLabel {
				t.Fatalf("NSP label %d", b.NextSentence[k])
			}
		}
	}
	if samples != d.Len() || chosen < 5000 {
		t.Fatalf("%d samples of %d, %d chosen tokens: fixture too small", samples, d.Len(), chosen)
	}
	// Binomial standard deviations at these counts are ≈0.002 (chosen
	// fraction, nearly exact by construction), ≈0.005 (0.8) and ≈0.004
	// (0.1); the tolerances are 4–5σ, far below the gap to any other
	// split (e.g. 0.85/0.05/0.1 or 0.8/0.2/0).
	check := func(what string, got, want, tol float64) {
		if math.Abs(got-want) > tol {
			t.Errorf("%s = %.4f, want %.2f ± %.3f", what, got, want, tol)
		} else {
			t.Logf("%s = %.4f (want %.2f)", what, got, want)
		}
	}
	check("chosen/candidates", float64(chosen)/float64(candidates), 0.15, 0.005)
	check("[MASK]/chosen", float64(masked)/float64(chosen), 0.8, 0.02)
	check("unchanged/chosen", float64(kept)/float64(chosen), 0.1, 0.016)
	check("random/chosen", float64(random)/float64(chosen), 0.1, 0.016)
	// BERT's pairing: a coin flip, plus a random B whenever the chunk is a
	// single sentence (rare with these documents).
	check("random next", float64(randomNext)/float64(samples), 0.52, 0.06)
}

func TestMLMDeterminismAndDynamicMasking(t *testing.T) {
	tok, corpus := mlmFixture(t, 50, 20, 2)
	ctx := context.Background()
	build := func(seed uint64, rank, world int) *MLMLoader {
		d, err := NewMLMDataset(ctx, corpus, tok, MLMOptions{MaxSeqLen: 32, Seed: seed, ShortSeqProb: 0.1, MaxPredictions: 5})
		if err != nil {
			t.Fatal(err)
		}
		l, err := NewMLMLoader(d, MLMLoaderOptions{Batch: 8, Rank: rank, World: world, Shuffle: true})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a, b := mlmBatches(t, build(7, 0, 1), 0), mlmBatches(t, build(7, 0, 1), 0)
	if !equalMLM(a, b) {
		t.Fatal("same seed and epoch, different batches")
	}
	if equalMLM(a, mlmBatches(t, build(8, 0, 1), 0)) {
		t.Error("different seeds, same batches")
	}
	// Epoch 1 of an unshuffled loader: same pairs (the unmasked text),
	// different masks.
	d, _ := NewMLMDataset(ctx, corpus, tok, MLMOptions{MaxSeqLen: 32, Seed: 7})
	l, _ := NewMLMLoader(d, MLMLoaderOptions{Batch: 8})
	e0, e1 := mlmBatches(t, l, 0), mlmBatches(t, l, 1)
	if equalMLM(e0, e1) {
		t.Error("masking did not change between epochs")
	}
	for i := range e0 {
		if !slices.Equal(unmasked(e0[i]), unmasked(e1[i])) || !slices.Equal(e0[i].NextSentence, e1[i].NextSentence) {
			t.Fatal("the sequence pairs changed between epochs")
		}
	}
	// MaxPredictions caps the chosen tokens.
	for _, bt := range a {
		for k := range bt.N {
			n := 0
			for _, lab := range bt.Labels[k*32 : (k+1)*32] {
				if lab != IgnoreLabel {
					n++
				}
			}
			if n < 1 || n > 5 {
				t.Fatalf("%d predictions, want 1..5", n)
			}
		}
	}
	// Ranks split the samples: two ranks see as many as one, same per-rank count.
	r0, r1 := mlmBatches(t, build(7, 0, 2), 0), mlmBatches(t, build(7, 1, 2), 0)
	if len(r0) != len(r1) || countMLM(r0)+countMLM(r1) < countMLM(a) || countMLM(r0)+countMLM(r1) > countMLM(a)+1 {
		t.Errorf("rank batches %d+%d samples, world-1 %d", countMLM(r0), countMLM(r1), countMLM(a))
	}
}

func countMLM(bs []MLMBatch) int {
	n := 0
	for _, b := range bs {
		n += b.N
	}
	return n
}

// unmasked restores the original tokens of a batch.
func unmasked(b MLMBatch) []int32 {
	ids := slices.Clone(b.InputIDs)
	for i, lab := range b.Labels {
		if lab != IgnoreLabel {
			ids[i] = lab
		}
	}
	return ids
}

func equalMLM(a, b []MLMBatch) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !slices.Equal(a[i].InputIDs, b[i].InputIDs) || !slices.Equal(a[i].Labels, b[i].Labels) ||
			!slices.Equal(a[i].TokenTypeIDs, b[i].TokenTypeIDs) || !slices.Equal(a[i].NextSentence, b[i].NextSentence) {
			return false
		}
	}
	return true
}

func TestTruncatePair(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	a := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	b := []int32{11, 12, 13}
	ta, tb := truncatePair(a, b, 8, rng)
	if len(ta) != 5 || !slices.Equal(tb, b) {
		t.Fatalf("truncated to %v %v, want 5 tokens of a and all of b", ta, tb)
	}
	// What is left is a contiguous run of a.
	if i := slices.Index(a, ta[0]); i < 0 || !slices.Equal(a[i:i+5], ta) {
		t.Errorf("%v is not a contiguous part of %v", ta, a)
	}
	// Equal lengths: b loses first (BERT's "len(a) > len(b)" test).
	ta, tb = truncatePair([]int32{1, 2, 3}, []int32{4, 5, 6}, 5, rng)
	if len(ta) != 3 || len(tb) != 2 {
		t.Errorf("equal lengths truncated to %v %v", ta, tb)
	}
}

func TestReadDocuments(t *testing.T) {
	ctx := context.Background()
	docs, err := ReadDocuments(ctx, strings.NewReader("s1\r\ns2\n\n  \n\ns3\n   s4  \n\n"), "c.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != 2 || !slices.Equal(docs[0], []string{"s1", "s2"}) || !slices.Equal(docs[1], []string{"s3", "s4"}) {
		t.Errorf("documents %q", docs)
	}
	if _, err := ReadDocuments(ctx, strings.NewReader("ok\nok\nbad\xc3\n"), "c.txt"); err == nil || !strings.Contains(err.Error(), "c.txt: line 3: invalid UTF-8") {
		t.Errorf("bad UTF-8: %v", err)
	}
	if _, err := LoadDocuments(ctx, "/nonexistent/corpus.txt"); err == nil || !strings.Contains(err.Error(), "corpus.txt") {
		t.Errorf("missing file: %v", err)
	}
}

func TestMLMErrors(t *testing.T) {
	ctx := context.Background()
	tok, corpus := mlmFixture(t, 20, 3, 3)
	for _, c := range []struct {
		opt  MLMOptions
		want string
	}{
		{MLMOptions{MaxSeqLen: 4}, "MaxSeqLen"},
		{MLMOptions{MaskProb: 1.5}, "MaskProb"},
		{MLMOptions{ShortSeqProb: -0.1}, "ShortSeqProb"},
		{MLMOptions{MaxPredictions: -1}, "MaxPredictions"},
	} {
		if _, err := NewMLMDataset(ctx, corpus, tok, c.opt); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v", c.opt, err)
		}
	}
	if _, err := NewMLMDataset(ctx, [][]string{{"   "}, {"\x01"}}, tok, MLMOptions{}); err == nil || !strings.Contains(err.Error(), "no tokens") {
		t.Errorf("empty corpus: %v", err)
	}
	v, _ := NewVocab("nomask.txt", []string{PadToken, UnkToken, ClsToken, SepToken, "a"})
	tk, _ := NewWordPieceTokenizer(v, true)
	if _, err := NewMLMDataset(ctx, corpus, tk, MLMOptions{}); err == nil || !strings.Contains(err.Error(), "nomask.txt has no [MASK]") {
		t.Errorf("vocabulary without [MASK]: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := NewMLMDataset(cctx, corpus, tok, MLMOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	d, _ := NewMLMDataset(ctx, corpus, tok, MLMOptions{})
	l, _ := NewMLMLoader(d, MLMLoaderOptions{Batch: 2})
	for _, err := range l.Epoch(cctx, 0) {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled epoch: %v", err)
		}
	}
}
