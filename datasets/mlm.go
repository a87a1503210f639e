package datasets

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"unicode/utf8"
)

// IgnoreLabel marks the positions of MLMBatch.Labels that are not
// predicted (PyTorch's CrossEntropyLoss ignore_index).
const IgnoreLabel = -100

// NSP labels (BertForPreTraining's next_sentence_label).
const (
	IsNextLabel     = 0 // segment B follows segment A in the corpus
	RandomNextLabel = 1 // segment B was taken from a random place
)

// ReadDocuments reads a pre-training corpus in the format of BERT's
// create_pretraining_data.py: one sentence per line, blank lines (or lines
// of white space) between documents. A file without blank lines, such as
// PTB's, is one document. Lines must be UTF-8; the error names the line.
func ReadDocuments(ctx context.Context, r io.Reader, name string) ([][]string, error) {
	var docs [][]string
	var cur []string
	br := bufio.NewReader(r)
	for line := 1; ; line++ {
		if line%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		text, err := br.ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("datasets: %s: line %d: %w", name, line, err)
		}
		if !utf8.ValidString(text) {
			return nil, fmt.Errorf("datasets: %s: line %d: invalid UTF-8", name, line)
		}
		if s := strings.TrimSpace(text); s != "" {
			cur = append(cur, s)
		} else if len(cur) > 0 {
			docs = append(docs, cur)
			cur = nil
		}
		if err != nil {
			break
		}
	}
	if len(cur) > 0 {
		docs = append(docs, cur)
	}
	return docs, nil
}

// LoadDocuments is ReadDocuments from a file.
func LoadDocuments(ctx context.Context, path string) ([][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("datasets: %w", err)
	}
	defer f.Close()
	return ReadDocuments(ctx, f, path)
}

// MLMOptions configure NewMLMDataset.
type MLMOptions struct {
	// MaxSeqLen is the length of every sample, [CLS] A [SEP] B [SEP] and
	// padding included (default 128, at least 5).
	MaxSeqLen int
	// MaskProb is the fraction of the non-special tokens chosen for
	// prediction (default 0.15).
	MaskProb float64
	// MaxPredictions caps the chosen tokens per sample (BERT uses 20 for
	// MaxSeqLen 128); 0 means no cap.
	MaxPredictions int
	// ShortSeqProb is the probability that a sample targets a random
	// shorter length (BERT uses 0.1); 0 means never.
	ShortSeqProb float64
	// Seed decides the A/B pairs, the shuffle of every epoch and, with the
	// epoch, the masking.
	Seed uint64
}

// mlmInstance is one [CLS] A [SEP] B [SEP] sequence, without padding.
type mlmInstance struct {
	tokens     []int32
	lenA       int // tokens of A (the [CLS] is before them)
	randomNext bool
}

// MLMDataset holds BERT pre-training sequence pairs built from a corpus;
// it masks them anew in every epoch (dynamic masking, as RoBERTa).
type MLMDataset struct {
	opt                     MLMOptions
	instances               []mlmInstance
	cls, sep, mask, pad     int32
	randomIDs               []int32 // ids a "random token" replacement draws from
	vocabSize               int
	Documents, SkippedEmpty int // documents used; sentences that tokenized to nothing
}

// mlm stream constants: any fixed values, distinct per purpose.
const (
	mlmPairStream = 0x6d6c6d5f70616972
	mlmMaskStream = 0x6d6c6d5f6d61736b
)

// NewMLMDataset tokenizes docs with tok and builds the sequence pairs with
// the algorithm of BERT's create_instances_from_document (dupe factor 1):
// sentences are accumulated into a chunk up to the target length (MaxSeqLen
// − 3, or with probability ShortSeqProb a random length in [2, MaxSeqLen −
// 3]); A is a random prefix of the chunk's sentences; with probability 1/2,
// or always when the chunk is one sentence, B is text from a random place
// of another document (NSP label RandomNextLabel) and the chunk's unused
// sentences are put back, otherwise B is the rest of the chunk
// (IsNextLabel); the longer of A and B then loses tokens, from the front or
// the back at random, until the pair fits. The pairs depend only on docs,
// the vocabulary and opt.
//
// The vocabulary must have [PAD], [UNK], [CLS], [SEP] and [MASK] and at
// least one other token.
func NewMLMDataset(ctx context.Context, docs [][]string, tok *WordPieceTokenizer, opt MLMOptions) (*MLMDataset, error) {
	if opt.MaxSeqLen == 0 {
		opt.MaxSeqLen = 128
	}
	if opt.MaskProb == 0 {
		opt.MaskProb = 0.15
	}
	switch {
	case tok == nil:
		return nil, errors.New("datasets: NewMLMDataset: nil tokenizer")
	case opt.MaxSeqLen < 5:
		return nil, fmt.Errorf("datasets: MLMOptions.MaxSeqLen = %d, must be >= 5", opt.MaxSeqLen)
	case !(opt.MaskProb > 0 && opt.MaskProb <= 1):
		return nil, fmt.Errorf("datasets: MLMOptions.MaskProb = %v, must be in (0, 1]", opt.MaskProb)
	case !(opt.ShortSeqProb >= 0 && opt.ShortSeqProb <= 1):
		return nil, fmt.Errorf("datasets: MLMOptions.ShortSeqProb = %v, must be in [0, 1]", opt.ShortSeqProb)
	case opt.MaxPredictions < 0:
		return nil, fmt.Errorf("datasets: MLMOptions.MaxPredictions = %d, must be >= 0", opt.MaxPredictions)
	}
	v := tok.Vocab()
	d := &MLMDataset{opt: opt, vocabSize: v.Size()}
	special := make(map[int32]bool)
	for _, s := range SpecialTokens {
		id, ok := v.ID(s)
		if !ok {
			return nil, fmt.Errorf("datasets: NewMLMDataset: vocabulary %s has no %s token", v.Name, s)
		}
		special[id] = true
		switch s {
		case PadToken:
			d.pad = id
		case ClsToken:
			d.cls = id
		case SepToken:
			d.sep = id
		case MaskToken:
			d.mask = id
		}
	}
	for id := range int32(v.Size()) {
		if !special[id] {
			d.randomIDs = append(d.randomIDs, id)
		}
	}
	if len(d.randomIDs) == 0 {
		return nil, fmt.Errorf("datasets: NewMLMDataset: vocabulary %s has only special tokens", v.Name)
	}

	var all [][][]int32
	for _, doc := range docs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var sents [][]int32
		for _, s := range doc {
			ids := tok.Encode(s)
			if len(ids) == 0 {
				d.SkippedEmpty++
				continue
			}
			sents = append(sents, ids)
		}
		if len(sents) > 0 {
			all = append(all, sents)
		}
	}
	if len(all) == 0 {
		return nil, errors.New("datasets: NewMLMDataset: the corpus has no tokens")
	}
	d.Documents = len(all)
	var pcg rand.PCG
	pcg.Seed(opt.Seed, mlmPairStream)
	rng := rand.New(&pcg)
	for di := range all {
		if di%64 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		d.instances = appendInstances(d.instances, all, di, opt, d.cls, d.sep, rng)
	}
	if len(d.instances) == 0 {
		return nil, errors.New("datasets: NewMLMDataset: no sequence pairs could be built")
	}
	return d, nil
}

// randInt is Python's random.randint(lo, hi): inclusive.
func randInt(rng *rand.Rand, lo, hi int) int { return lo + rng.IntN(hi-lo+1) }

// appendInstances is create_instances_from_document for document di.
func appendInstances(dst []mlmInstance, all [][][]int32, di int, opt MLMOptions, cls, sep int32, rng *rand.Rand) []mlmInstance {
	doc := all[di]
	maxTokens := opt.MaxSeqLen - 3
	target := maxTokens
	if rng.Float64() < opt.ShortSeqProb {
		target = randInt(rng, 2, maxTokens)
	}
	var chunk [][]int32
	length := 0
	for i := 0; i < len(doc); i++ {
		chunk = append(chunk, doc[i])
		length += len(doc[i])
		if i != len(doc)-1 && length < target {
			continue
		}
		aEnd := 1
		if len(chunk) >= 2 {
			aEnd = randInt(rng, 1, len(chunk)-1)
		}
		var a, b []int32
		for _, s := range chunk[:aEnd] {
			a = append(a, s...)
		}
		randomNext := len(chunk) == 1 || rng.Float64() < 0.5
		if randomNext {
			targetB := target - len(a)
			ri := 0
			for range 10 {
				ri = rng.IntN(len(all))
				if ri != di {
					break
				}
			}
			rdoc := all[ri]
			for j := rng.IntN(len(rdoc)); j < len(rdoc); j++ {
				b = append(b, rdoc[j]...)
				if len(b) >= targetB {
					break
				}
			}
			i -= len(chunk) - aEnd // put the unused sentences back
		} else {
			for _, s := range chunk[aEnd:] {
				b = append(b, s...)
			}
		}
		a, b = truncatePair(a, b, maxTokens, rng)
		tokens := make([]int32, 0, len(a)+len(b)+3)
		tokens = append(tokens, cls)
		tokens = append(tokens, a...)
		tokens = append(tokens, sep)
		tokens = append(tokens, b...)
		tokens = append(tokens, sep)
		dst = append(dst, mlmInstance{tokens: tokens, lenA: len(a), randomNext: randomNext})
		chunk, length = nil, 0
	}
	return dst
}

// truncatePair is BERT's truncate_seq_pair: drop a token from the front or
// back (at random) of the longer sequence until both fit in max tokens.
func truncatePair(a, b []int32, max int, rng *rand.Rand) ([]int32, []int32) {
	for len(a)+len(b) > max {
		t := &b
		if len(a) > len(b) {
			t = &a
		}
		if rng.Float64() < 0.5 {
			*t = (*t)[1:]
		} else {
			*t = (*t)[:len(*t)-1]
		}
	}
	return a, b
}

// Len is the number of sequence pairs.
func (d *MLMDataset) Len() int { return len(d.instances) }

// Options returns the options in effect, defaults filled in.
func (d *MLMDataset) Options() MLMOptions { return d.opt }

// MLMBatch is a batch of BertForPreTraining inputs: N rows of SeqLen
// int32s each, row-major.
type MLMBatch struct {
	InputIDs      []int32 // [CLS] A [SEP] B [SEP] [PAD]…, chosen tokens masked
	TokenTypeIDs  []int32 // 0 for [CLS] A [SEP], 1 for B [SEP], 0 for padding
	AttentionMask []int32 // 1 for real tokens, 0 for padding
	Labels        []int32 // original token at chosen positions, IgnoreLabel elsewhere
	NextSentence  []int32 // N labels: IsNextLabel or RandomNextLabel
	N, SeqLen     int
}

// Fill writes sample i of epoch into row k of bt (whose slices must hold
// row k): the sequence, padded with [PAD], and its masking. The masking
// depends only on (Seed, epoch, i): round(MaskProb × the non-special
// tokens) positions — randomised rounding, so the expected fraction is
// exactly MaskProb; at least 1, at most MaxPredictions — are chosen
// uniformly; each becomes [MASK] with probability 0.8, a random
// non-special token with 0.1, or stays itself with 0.1, and its label is
// the original token.
func (d *MLMDataset) Fill(bt *MLMBatch, k, epoch, i int) {
	L := d.opt.MaxSeqLen
	inst := &d.instances[i]
	ids := bt.InputIDs[k*L : (k+1)*L]
	types := bt.TokenTypeIDs[k*L : (k+1)*L]
	att := bt.AttentionMask[k*L : (k+1)*L]
	labels := bt.Labels[k*L : (k+1)*L]
	n := len(inst.tokens)
	copy(ids, inst.tokens)
	for p := range L {
		labels[p] = IgnoreLabel
		switch {
		case p >= n:
			ids[p], types[p], att[p] = d.pad, 0, 0
		case p >= inst.lenA+2:
			types[p], att[p] = 1, 1
		default:
			types[p], att[p] = 0, 1
		}
	}
	if inst.randomNext {
		bt.NextSentence[k] = RandomNextLabel
	} else {
		bt.NextSentence[k] = IsNextLabel
	}

	var pcg rand.PCG
	seedPCG(&pcg, d.opt.Seed^mlmMaskStream, epoch, 0, i)
	rng := rand.New(&pcg)
	// Candidates: every position but [CLS] (0), the middle [SEP] and the
	// final [SEP].
	cand := make([]int, 0, n-3)
	for p := 1; p < n-1; p++ {
		if p != inst.lenA+1 {
			cand = append(cand, p)
		}
	}
	want := float64(len(cand)) * d.opt.MaskProb
	num := int(math.Floor(want))
	if rng.Float64() < want-math.Floor(want) {
		num++
	}
	num = max(num, 1)
	if d.opt.MaxPredictions > 0 {
		num = min(num, d.opt.MaxPredictions)
	}
	num = min(num, len(cand))
	for j := range num { // partial Fisher–Yates: cand[:num] is a uniform choice
		r := j + rng.IntN(len(cand)-j)
		cand[j], cand[r] = cand[r], cand[j]
		p := cand[j]
		labels[p] = ids[p]
		switch u := rng.Float64(); {
		case u < 0.8:
			ids[p] = d.mask
		case u < 0.9:
			// unchanged
		default:
			ids[p] = d.randomIDs[rng.IntN(len(d.randomIDs))]
		}
	}
}

// MLMLoaderOptions configure an MLMLoader. The shuffle uses the dataset's
// Seed.
type MLMLoaderOptions struct {
	Batch       int // samples per batch (per rank), > 0
	Rank, World int // World 0 means 1
	Shuffle     bool
	DropLast    bool
}

// MLMLoader yields masked batches of an MLMDataset for one rank, split
// across ranks by a DistributedSampler.
type MLMLoader struct {
	d       *MLMDataset
	opt     MLMLoaderOptions
	sampler DistributedSampler
	buf     MLMBatch
}

// NewMLMLoader checks opt.
func NewMLMLoader(d *MLMDataset, opt MLMLoaderOptions) (*MLMLoader, error) {
	if d == nil || d.Len() == 0 {
		return nil, errors.New("datasets: NewMLMLoader: empty dataset")
	}
	s, err := newSampler("MLMLoaderOptions", d.Len(), opt.Batch, opt.Rank, opt.World, d.opt.Seed, opt.Shuffle)
	if err != nil {
		return nil, err
	}
	opt.World = s.World
	L := d.opt.MaxSeqLen
	return &MLMLoader{d: d, opt: opt, sampler: s, buf: MLMBatch{
		InputIDs: make([]int32, opt.Batch*L), TokenTypeIDs: make([]int32, opt.Batch*L),
		AttentionMask: make([]int32, opt.Batch*L), Labels: make([]int32, opt.Batch*L),
		NextSentence: make([]int32, opt.Batch), SeqLen: L,
	}}, nil
}

// NumBatches is how many batches Epoch yields; the same on every rank.
func (l *MLMLoader) NumBatches() int {
	return numBatches(l.sampler.NumSamples(), l.opt.Batch, l.opt.DropLast)
}

// Epoch returns this rank's batches of one epoch, masked for that epoch.
// The same (Seed, Rank, World, epoch) gives the same batches. If ctx is
// cancelled the loop yields its error once and stops. Batches share one
// buffer, valid until the next one is requested.
func (l *MLMLoader) Epoch(ctx context.Context, epoch int) iter.Seq2[MLMBatch, error] {
	return l.EpochFrom(ctx, epoch, 0)
}

// EpochFrom is Epoch from batch start on (the batches before it are skipped, not
// built): a resumed run continues mid-epoch with the batches it would have had.
func (l *MLMLoader) EpochFrom(ctx context.Context, epoch, start int) iter.Seq2[MLMBatch, error] {
	return func(yield func(MLMBatch, error) bool) {
		idx := l.sampler.Indices(epoch)
		L := l.buf.SeqLen
		for b := max(start, 0); b < l.NumBatches(); b++ {
			if err := ctx.Err(); err != nil {
				yield(MLMBatch{}, err)
				return
			}
			lo := b * l.opt.Batch
			hi := min(lo+l.opt.Batch, len(idx))
			n := hi - lo
			bt := &l.buf
			bt.N = n
			bt.InputIDs, bt.TokenTypeIDs = bt.InputIDs[:n*L], bt.TokenTypeIDs[:n*L]
			bt.AttentionMask, bt.Labels, bt.NextSentence = bt.AttentionMask[:n*L], bt.Labels[:n*L], bt.NextSentence[:n]
			for k, i := range idx[lo:hi] {
				l.d.Fill(bt, k, epoch, i)
			}
			if !yield(*bt, nil) {
				return
			}
		}
	}
}
