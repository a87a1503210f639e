package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spargo-dl/spargo/datasets"
)

// MLMCorpus is the text of a masked-LM run, tokenized into sequence pairs.
type MLMCorpus struct {
	TrainFiles, ValidFiles []string
	// Train and Valid are the sequence pairs; Valid is masked once (epoch 0) for every
	// evaluation.
	Train, Valid *datasets.MLMDataset
	Tokenizer    *datasets.WordPieceTokenizer
	// Built is true when the vocabulary was built from the training text.
	Built bool
	// Summary describes the corpus in one line.
	Summary string
}

// LoadMLMCorpus reads c.Data, loads or builds the vocabulary and builds the training and
// held-out sequence pairs. The result depends only on the files and c's data flags, so
// every rank of a launched job computes the same corpus.
func LoadMLMCorpus(ctx context.Context, c MLMConfig) (*MLMCorpus, error) {
	trainFiles, validFiles, err := mlmFiles(c.Data)
	if err != nil {
		return nil, err
	}
	read := func(files []string) ([][]string, error) {
		var docs [][]string
		for _, f := range files {
			d, err := datasets.LoadDocuments(ctx, f)
			if err != nil {
				return nil, fmt.Errorf("-data: %w", err)
			}
			docs = append(docs, d...)
		}
		return docs, nil
	}
	trainDocs, err := read(trainFiles)
	if err != nil {
		return nil, err
	}
	validDocs, err := read(validFiles)
	if err != nil {
		return nil, err
	}
	if len(validFiles) == 0 {
		trainDocs, validDocs = holdOut(trainDocs, c.HoldOut)
		if len(validDocs) == 0 || len(trainDocs) == 0 {
			return nil, fmt.Errorf("-data %s: too little text to hold out %g of it for evaluation", c.Data, c.HoldOut)
		}
	}
	corpus := &MLMCorpus{TrainFiles: trainFiles, ValidFiles: validFiles}
	var vocab *datasets.Vocab
	if c.Vocab != "" {
		if vocab, err = datasets.LoadVocab(c.Vocab); err != nil {
			return nil, fmt.Errorf("-vocab: %w", err)
		}
	} else {
		var text strings.Builder
		for _, d := range trainDocs {
			for _, s := range d {
				text.WriteString(s)
				text.WriteByte('\n')
			}
		}
		vocab, err = datasets.TrainWordPiece(ctx, strings.NewReader(text.String()), "the training text of "+c.Data,
			datasets.WordPieceTrainerOptions{VocabSize: c.VocabSize, Lowercase: true, MergeByCount: true})
		if err != nil {
			return nil, err
		}
		corpus.Built = true
	}
	if corpus.Tokenizer, err = datasets.NewWordPieceTokenizer(vocab, true); err != nil {
		return nil, err
	}
	opt := datasets.MLMOptions{MaxSeqLen: c.Seq, MaxPredictions: c.maxPredictions(), ShortSeqProb: 0.1, Seed: c.Seed}
	if corpus.Train, err = datasets.NewMLMDataset(ctx, trainDocs, corpus.Tokenizer, opt); err != nil {
		return nil, fmt.Errorf("training text: %w", err)
	}
	if corpus.Valid, err = datasets.NewMLMDataset(ctx, validDocs, corpus.Tokenizer, opt); err != nil {
		return nil, fmt.Errorf("held-out text: %w", err)
	}
	held := strings.Join(validFiles, ", ")
	if held == "" {
		held = fmt.Sprintf("the last %g of the sentences", c.HoldOut)
	}
	how := "loaded from " + c.Vocab
	if corpus.Built {
		how = "built from the training text"
	}
	corpus.Summary = fmt.Sprintf("train %s: %d sequence pairs of %d tokens from %d documents; held out (%s): %d pairs; WordPiece vocabulary of %d tokens %s",
		strings.Join(trainFiles, ", "), corpus.Train.Len(), c.Seq, corpus.Train.Documents, held, corpus.Valid.Len(), vocab.Size(), how)
	return corpus, nil
}

// maxPredictions is -max-predictions, or round(0.15 × -seq).
func (c MLMConfig) maxPredictions() int {
	if c.MaxPredictions > 0 {
		return c.MaxPredictions
	}
	return max(1, int(math.Round(0.15*float64(c.Seq))))
}

// mlmFiles lists the training and held-out files of -data.
func mlmFiles(data string) (train, valid []string, err error) {
	if data == "" {
		return nil, nil, errors.New("-data: give a text file or a directory of .txt files")
	}
	fi, err := os.Stat(data)
	if err != nil {
		return nil, nil, fmt.Errorf("-data: %w", err)
	}
	if !fi.IsDir() {
		return []string{data}, nil, nil
	}
	names, err := filepath.Glob(filepath.Join(data, "*.txt"))
	if err != nil {
		return nil, nil, fmt.Errorf("-data: %w", err)
	}
	slices.Sort(names)
	for _, n := range names {
		base := strings.ToLower(filepath.Base(n))
		switch {
		case strings.Contains(base, "valid"):
			valid = append(valid, n)
		case strings.Contains(base, "test"):
		default:
			train = append(train, n)
		}
	}
	if len(train) == 0 {
		return nil, nil, fmt.Errorf("-data %s: no training .txt files (files named *valid* and *test* are not trained on)", data)
	}
	return train, valid, nil
}

// holdOut moves the last frac of the sentences (at least one) out of docs, keeping
// document boundaries.
func holdOut(docs [][]string, frac float64) (train, held [][]string) {
	total := 0
	for _, d := range docs {
		total += len(d)
	}
	n := max(1, int(math.Round(frac*float64(total))))
	train = slices.Clone(docs)
	for n > 0 && len(train) > 0 {
		last := train[len(train)-1]
		if len(last) <= n {
			held = append([][]string{last}, held...)
			train = train[:len(train)-1]
			n -= len(last)
			continue
		}
		held = append([][]string{last[len(last)-n:]}, held...)
		train[len(train)-1] = last[:len(last)-n]
		n = 0
	}
	return train, held
}
