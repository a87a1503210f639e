package train

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"iter"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spargo-dl/spargo/checkpoint"
	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/cluster"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/safetensors"
)

// MLMConfig is a BERT masked-LM pre-training run: the flags of examples/bert. It is the
// "config" of the -metrics summary.
type MLMConfig struct {
	// Data is a text file or a directory of .txt files (one sentence per line, blank lines
	// between documents; see datasets.ReadDocuments). In a directory, files whose name
	// contains "valid" are the held-out text and files whose name contains "test" are left
	// out; without a validation file the last HoldOut of the sentences are held out.
	Data    string  `json:"data"`
	HoldOut float64 `json:"hold_out"`
	// Vocab is a vocab.txt to load; empty builds a WordPiece vocabulary of VocabSize tokens
	// from the training text. SaveVocab, when set, is where rank 0 writes the vocabulary in
	// use (vocab.txt format).
	Vocab     string `json:"vocab,omitempty"`
	VocabSize int    `json:"vocab_size"`
	SaveVocab string `json:"save_vocab,omitempty"`
	// Model is a BERT preset (models.BertPresets); its vocabulary size becomes the
	// tokenizer's.
	Model   string `json:"model"`
	Workers int    `json:"workers"`
	Hook    string `json:"hook"`
	Batch   int    `json:"batch"`
	// Steps is the run's length in optimizer steps; 0 runs Epochs passes over the training
	// sequences.
	Steps  int `json:"steps"`
	Epochs int `json:"epochs"`
	// Seq is the length of every sequence ([CLS] A [SEP] B [SEP] and padding);
	// MaxPredictions caps the masked positions per sequence (0: round(0.15 × Seq), 19 at 128).
	Seq            int `json:"seq"`
	MaxPredictions int `json:"max_predictions"`
	// Dropout is the model's hidden and attention-probability dropout (BERT's 0.1).
	Dropout float64 `json:"dropout"`
	// Flags are the shared training flags (-lr -optim -schedule -warmup -metrics -log-every
	// -plot; -momentum and -wd for -optim sgd).
	Flags
	Seed uint64 `json:"seed"`
	// EvalEvery evaluates on the held-out text every EvalEvery steps (it must divide the
	// run's steps); 0 evaluates at the end only. EvalLimit evaluates on the first EvalLimit
	// held-out sequences (0: all).
	EvalEvery int     `json:"eval_every"`
	EvalLimit int     `json:"eval_limit"`
	BucketMB  float64 `json:"bucket_mb"`
	Profile   string  `json:"profile,omitempty"`
	Progress  bool    `json:"-"`
	// Checkpoint, CheckpointEvery, Keep and Resume are CIFARConfig's.
	Checkpoint      string `json:"checkpoint,omitempty"`
	CheckpointEvery int    `json:"checkpoint_every,omitempty"`
	Keep            int    `json:"keep,omitempty"`
	Resume          bool   `json:"resume,omitempty"`
	LogLevel        string `json:"-"`
	LogFormat       string `json:"-"`
	// DumpBatches, when set, is a directory where rank 0 writes the initial parameters
	// (init.safetensors) and every rank r its first DumpSteps training batches (rank<r>.bin),
	// so that scripts/torch_bert_lockstep.py can train PyTorch on exactly the same inputs
	// from the same weights. A batch is little-endian int32s: input ids, token type ids,
	// attention mask and MLM labels (Batch × Seq each), then the Batch NSP labels.
	DumpBatches string `json:"dump_batches,omitempty"`
	DumpSteps   int    `json:"dump_steps,omitempty"`
}

// Register defines the run's flags on fs; the struct's current values are the defaults.
func (c *MLMConfig) Register(fs *flag.FlagSet) {
	fs.StringVar(&c.Data, "data", c.Data, "a text file or a directory of .txt files, one sentence per line, blank lines between documents "+
		"(a directory's *valid*.txt is the held-out text, *test*.txt is left out; e.g. ../shared/data/ptb)")
	fs.Float64Var(&c.HoldOut, "hold-out", c.HoldOut, "without a *valid*.txt file, hold out this fraction of the sentences (the last ones) for evaluation")
	fs.StringVar(&c.Vocab, "vocab", c.Vocab, "WordPiece vocabulary to load (vocab.txt, one token a line); empty: build one from the training text")
	fs.IntVar(&c.VocabSize, "vocab-size", c.VocabSize, "tokens of the vocabulary built from the training text (without -vocab)")
	fs.StringVar(&c.SaveVocab, "save-vocab", c.SaveVocab, "write the vocabulary in use to this file (vocab.txt format), e.g. for scripts/torch_bert_mlm.py")
	fs.StringVar(&c.Model, "model", c.Model, "BERT size: "+strings.Join(models.BertPresets(), "|"))
	fs.IntVar(&c.Workers, "workers", c.Workers, "data-parallel workers (in-process ranks); under a launcher leave it out, or give 1 or the world size")
	fs.StringVar(&c.Hook, "hook", c.Hook, "comm hook spec, e.g. allreduce, spardl:density=0.01 (see `spargo hooks`)")
	fs.IntVar(&c.Batch, "batch", c.Batch, "sequences per worker per step")
	fs.IntVar(&c.Steps, "steps", c.Steps, "optimizer steps to train (0: -epochs passes over the training sequences)")
	fs.IntVar(&c.Epochs, "epochs", c.Epochs, "passes over the training sequences, when -steps is 0")
	fs.IntVar(&c.Seq, "seq", c.Seq, "sequence length in tokens ([CLS] A [SEP] B [SEP] and padding)")
	fs.IntVar(&c.MaxPredictions, "max-predictions", c.MaxPredictions, "most masked positions per sequence (0: round(0.15 × seq), 19 at 128; BERT's recipe has 20)")
	fs.Float64Var(&c.Dropout, "dropout", c.Dropout, "hidden and attention-probability dropout of the model (BERT's 0.1)")
	c.Flags.Register(fs)
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed for initialisation, sequence pairs, masking, shuffling and dropout")
	fs.IntVar(&c.EvalEvery, "eval-every", c.EvalEvery, "evaluate on the held-out text every N steps (N must divide the run's steps; 0: at the end only)")
	fs.IntVar(&c.EvalLimit, "eval-limit", c.EvalLimit, "evaluate on the first N held-out sequences (0: all)")
	fs.Float64Var(&c.BucketMB, "bucket-mb", c.BucketMB, "DDP bucket cap in MiB (0: ddp's defaults)")
	fs.StringVar(&c.Profile, "profile", c.Profile, "for hooks that plan from measured costs (omgs): reuse the profile in this file when it fits, else measure and save it here")
	fs.StringVar(&c.Checkpoint, "checkpoint", c.Checkpoint, "save checkpoints into this directory after every evaluation round (and every -checkpoint-every steps)")
	fs.IntVar(&c.CheckpointEvery, "checkpoint-every", c.CheckpointEvery, "also save a checkpoint every N steps")
	fs.IntVar(&c.Keep, "keep", c.Keep, "keep the newest N checkpoints (0: all)")
	fs.BoolVar(&c.Resume, "resume", c.Resume, "continue from the latest checkpoint in -checkpoint DIR exactly where it stopped (the same flags are required)")
	fs.BoolVar(&c.Progress, "progress", c.Progress, "show a progress bar (launched: on rank 0, when its stderr is a terminal)")
	fs.StringVar(&c.LogLevel, "log-level", orDefault(c.LogLevel, "info"), "log level of the hooks' messages on stderr: debug|info|warn|error")
	fs.StringVar(&c.LogFormat, "log-format", orDefault(c.LogFormat, "text"), "text|json")
	fs.StringVar(&c.DumpBatches, "dump-batches", c.DumpBatches, "write the initial parameters and the first -dump-steps training batches of every rank into this directory "+
		"(for scripts/torch_bert_lockstep.py)")
	fs.IntVar(&c.DumpSteps, "dump-steps", c.DumpSteps, "steps whose batches -dump-batches writes")
}

// MLMMain is the main function of examples/bert (see Main): it registers c's flags (c holds
// the defaults), parses the command line and trains.
func MLMMain(name string, c MLMConfig) {
	c.Register(flag.CommandLine)
	Main(Program{Name: name, Flags: &c.Flags, LogLevel: &c.LogLevel, LogFormat: &c.LogFormat, Workers: &c.Workers,
		InProcess: func(ctx context.Context, stdout, stderr io.Writer) error {
			_, err := RunMLM(ctx, c, stdout, stderr)
			return err
		},
		Process: func(ctx context.Context, env cluster.Env, stdout, stderr io.Writer) error {
			_, err := RunMLMProcess(ctx, c, env, stdout, stderr)
			return err
		}})
}

func (c *MLMConfig) check() error {
	switch {
	case c.Workers < 1 || c.Batch < 1:
		return fmt.Errorf("-workers and -batch must be at least 1 (got %d, %d)", c.Workers, c.Batch)
	case c.Steps < 0 || c.Steps == 0 && c.Epochs < 1:
		return fmt.Errorf("-steps %d, -epochs %d: give a number of steps, or of epochs with -steps 0", c.Steps, c.Epochs)
	case c.Seq < 5:
		return fmt.Errorf("-seq %d: want at least 5 tokens ([CLS] A [SEP] B [SEP])", c.Seq)
	case c.MaxPredictions < 0 || c.EvalEvery < 0 || c.EvalLimit < 0:
		return fmt.Errorf("-max-predictions %d, -eval-every %d, -eval-limit %d: want 0 or more", c.MaxPredictions, c.EvalEvery, c.EvalLimit)
	case !(c.HoldOut > 0 && c.HoldOut < 1):
		return fmt.Errorf("-hold-out %v: want a fraction in (0, 1)", c.HoldOut)
	case c.Vocab == "" && c.VocabSize < len(datasets.SpecialTokens)+1:
		return fmt.Errorf("-vocab-size %d: too small for a vocabulary", c.VocabSize)
	case c.CheckpointEvery < 0 || c.Keep < 0:
		return fmt.Errorf("-checkpoint-every %d, -keep %d: want 0 or more", c.CheckpointEvery, c.Keep)
	case (c.Resume || c.CheckpointEvery > 0) && c.Checkpoint == "":
		return errors.New("-resume and -checkpoint-every need -checkpoint DIR")
	case c.BucketMB < 0:
		return fmt.Errorf("-bucket-mb %g: want a positive size in MiB, or 0 for the defaults", c.BucketMB)
	case !(c.Dropout >= 0 && c.Dropout < 1):
		return fmt.Errorf("-dropout %v: want a probability in [0, 1)", c.Dropout)
	case c.DumpSteps < 0 || c.DumpSteps > 0 && c.DumpBatches == "":
		return fmt.Errorf("-dump-steps %d: want 0 or more, with -dump-batches DIR", c.DumpSteps)
	}
	if _, err := models.BertPreset(c.Model); err != nil {
		return fmt.Errorf("-model: %w", err)
	}
	if err := c.Flags.Check(); err != nil {
		return err
	}
	_, err := hooks.Parse(c.Hook)
	return err
}

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

// MLMRound is the -metrics record of an evaluation round: training statistics since the
// previous one and the held-out evaluation. It is an epoch record for package plot (one
// "epoch" per round of EvalEvery steps).
type MLMRound struct {
	Round     int     `json:"epoch"`
	Steps     int     `json:"steps"`
	AtStep    int64   `json:"at_step"`
	TrainLoss float64 `json:"train_loss"` // masked-LM cross-entropy (the NSP term is trained but not in it)
	TrainAcc  float64 `json:"train_acc"`  // masked-LM accuracy
	ValLoss   float64 `json:"val_loss"`
	ValAcc    float64 `json:"val_acc"`
	ValNSPAcc float64 `json:"val_nsp_acc,omitempty"`
	SeqPerSec float64 `json:"seq_s"`
	TrainSec  float64 `json:"train_s"`
	TotalSec  float64 `json:"total_s"`
	LR        float64 `json:"lr"`
}

// MLMSummary is a run's result, and the last line of -metrics.
type MLMSummary struct {
	Config    MLMConfig   `json:"config"`
	Corpus    string      `json:"corpus"`
	Vocab     int         `json:"vocab"`
	Kernels   string      `json:"kernels"`
	Params    int         `json:"params"`
	Rounds    []MLMRound  `json:"epochs"`
	ValLoss   float64     `json:"final_val_loss"`
	ValAcc    float64     `json:"final_val_acc"`
	TotalSec  float64     `json:"total_s"`
	Summary   bool        `json:"summary"`
	CommStats comm.Stats  `json:"comm_rank0"`
	Launcher  cluster.Source `json:"launcher,omitempty"`
}

// RunMLM trains with c.Workers in-process ranks, each on its own goroutine.
func RunMLM(ctx context.Context, c MLMConfig, stdout, stderr io.Writer) (*MLMSummary, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	corpus, err := LoadMLMCorpus(ctx, c)
	if err != nil {
		return nil, err
	}
	groups, err := comm.NewLocal(c.Workers)
	if err != nil {
		return nil, err
	}
	return trainMLMRanks(ctx, c, groups, corpus, stdout, stderr, "")
}

// RunMLMProcess trains this process's rank of a launched job (env from cluster.DetectEnv,
// c.Workers its world size) like one of RunMLM's workers: every rank reads the corpus and
// builds the same vocabulary and sequence pairs; rank 0 prints and writes -metrics.
func RunMLMProcess(ctx context.Context, c MLMConfig, env cluster.Env, stdout, stderr io.Writer) (sum *MLMSummary, err error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	g, stdout, progress, err := joinJob(ctx, c.Workers, stdout, stderr, c.Progress)
	if err != nil {
		return nil, err
	}
	defer closeGroup(g, &err)
	c.Progress = progress
	corpus, err := LoadMLMCorpus(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("rank %d: %w", g.Rank(), err)
	}
	return trainMLMRanks(ctx, c, []comm.Group{g}, corpus, stdout, stderr, env.Source)
}

// trainMLMRanks trains this process's ranks (see trainCIFARRanks).
func trainMLMRanks(ctx context.Context, c MLMConfig, groups []comm.Group, corpus *MLMCorpus, stdout, stderr io.Writer, launcher cluster.Source) (*MLMSummary, error) {
	hasRank0 := groups[0].Rank() == 0
	vocab := corpus.Tokenizer.Vocab()
	var metrics *metricsLog
	if hasRank0 {
		fmt.Fprintln(stdout, corpus.Summary)
		if c.SaveVocab != "" {
			if err := vocab.Save(c.SaveVocab); err != nil {
				return nil, fmt.Errorf("-save-vocab: %w", err)
			}
			fmt.Fprintf(stdout, "vocabulary: %s\n", c.SaveVocab)
		}
		m, err := openMetricsLog(c.Metrics, c.Resume)
		if err != nil {
			return nil, err
		}
		defer m.close()
		metrics = m
	}
	sum := &MLMSummary{Config: c, Corpus: corpus.Summary, Vocab: vocab.Size(), Kernels: kernels.Impl(), Summary: true, Launcher: launcher}
	start := time.Now()
	err := runRanks(ctx, groups, func(ctx context.Context, g comm.Group) error {
		w := &mlmWorker{cfg: c, group: g, corpus: corpus, stdout: stdout, stderr: stderr, metrics: metrics, sum: sum, start: start}
		return w.run(ctx)
	})
	if err != nil {
		return nil, err
	}
	if !hasRank0 {
		return sum, nil
	}
	sum.TotalSec = time.Since(start).Seconds()
	if len(sum.Rounds) == 0 {
		fmt.Fprintf(stdout, "done: nothing left to train: the checkpoint in %s is at the end of the run\n", c.Checkpoint)
		return sum, nil
	}
	last := sum.Rounds[len(sum.Rounds)-1]
	sum.ValLoss, sum.ValAcc = last.ValLoss, last.ValAcc
	fmt.Fprintf(stdout, "done: bert-%s %s, %d workers × batch %d × %d tokens, %d steps: held-out MLM loss %.4f, accuracy %.2f%%, NSP accuracy %.2f%%, %.0fs total\n",
		c.Model, c.Hook, c.Workers, c.Batch, c.Seq, last.AtStep, last.ValLoss, 100*last.ValAcc, 100*last.ValNSPAcc, sum.TotalSec)
	if err := metrics.finish(sum, &c.Flags, stdout); err != nil {
		return nil, err
	}
	return sum, nil
}

// mlmWorker is one rank of a masked-LM run.
type mlmWorker struct {
	cfg     MLMConfig
	group   comm.Group
	corpus  *MLMCorpus
	stdout  io.Writer
	stderr  io.Writer
	metrics *metricsLog // rank 0's, with -metrics
	sum     *MLMSummary
	start   time.Time
}

// maskedPositions lists the positions of b that carry an MLM label (sample-major flat
// indices) and their labels, for BertForPreTraining.ForwardMaskedLM.
func maskedPositions(b datasets.MLMBatch) (positions, labels []int) {
	for i, l := range b.Labels {
		if l != datasets.IgnoreLabel {
			positions = append(positions, i)
			labels = append(labels, int(l))
		}
	}
	return positions, labels
}

// firstRows is b cut to its first n sequences.
func firstRows(b datasets.MLMBatch, n int) datasets.MLMBatch {
	L := b.SeqLen
	b.InputIDs, b.TokenTypeIDs, b.AttentionMask, b.Labels = b.InputIDs[:n*L], b.TokenTypeIDs[:n*L], b.AttentionMask[:n*L], b.Labels[:n*L]
	b.NextSentence, b.N = b.NextSentence[:n], n
	return b
}

// mlmForward runs the model on b through dp and returns the total pre-training loss (MLM +
// NSP), the MLM cross-entropy and the MLM and NSP logits with their labels.
func mlmForward(dp *ddp.DDP, model *models.BertForPreTraining, tape *nn.Tape, b datasets.MLMBatch) (loss, mlmLoss, mlm, nsp *nn.Var, labels, nspLabels []int) {
	positions, labels := maskedPositions(b)
	nspLabels = make([]int, b.N)
	for i, l := range b.NextSentence {
		nspLabels[i] = int(l)
	}
	tape.Reset()
	dp.BeforeForward(tape)
	mlm, nsp = model.ForwardMaskedLM(tape, b.InputIDs, b.TokenTypeIDs, b.AttentionMask, b.N, b.SeqLen, positions)
	mlmLoss = nn.CrossEntropyIgnore(mlm, labels, nn.IgnoreIndex)
	loss = mlmLoss
	if nsp != nil {
		loss = nn.Add(mlmLoss, nn.CrossEntropyIgnore(nsp, nspLabels, nn.IgnoreIndex))
	}
	return loss, mlmLoss, mlm, nsp, labels, nspLabels
}

// tagMLMEval is the all-reduce tag of the held-out evaluation's sums.
const tagMLMEval = 104

// evaluate runs the model (recording off, dropout off) over the held-out pairs, split across
// ranks, and returns the masked-LM loss and accuracy and the NSP accuracy over all of them.
func (w *mlmWorker) evaluate(ctx context.Context, dp *ddp.DDP, model *models.BertForPreTraining, tape *nn.Tape, ld *datasets.MLMLoader) (loss, acc, nspAcc float64, err error) {
	g := w.group
	nn.SetTraining(model, false)
	tape.SetGradEnabled(false)
	defer tape.SetGradEnabled(true)
	var sums [5]float32 // loss × tokens, correct tokens, tokens, correct NSP, sequences
	i, seen := 0, 0
	for b, err := range ld.Epoch(ctx, 0) {
		if err != nil {
			return 0, 0, 0, err
		}
		if w.cfg.EvalLimit > 0 && seen >= w.cfg.EvalLimit {
			break
		}
		if w.cfg.EvalLimit > 0 && seen+b.N > w.cfg.EvalLimit {
			b = firstRows(b, w.cfg.EvalLimit-seen)
		}
		seen += b.N
		mine := i%g.Size() == g.Rank()
		i++
		if !mine {
			continue
		}
		_, mlmLoss, mlm, nsp, labels, nspLabels := mlmForward(dp, model, tape, b)
		if err := tape.Err(); err != nil {
			return 0, 0, 0, err
		}
		sums[0] += mlmLoss.Item() * float32(len(labels))
		sums[1] += float32(nn.Accuracy(mlm.Value, labels))
		sums[2] += float32(len(labels))
		if nsp != nil {
			sums[3] += float32(nn.Accuracy(nsp.Value, nspLabels))
			sums[4] += float32(b.N)
		}
	}
	s := sums[:]
	if err := comm.AllReduce(ctx, g, tagMLMEval, s, comm.Auto); err != nil {
		return 0, 0, 0, err
	}
	if s[2] == 0 {
		return 0, 0, 0, errors.New("evaluation saw no masked tokens")
	}
	if s[4] > 0 {
		nspAcc = float64(s[3] / s[4])
	}
	return float64(s[0] / s[2]), float64(s[1] / s[2]), nspAcc, nil
}

// runLength returns the run's steps and its evaluation rounds' length: the Loop's "epochs"
// are rounds of EvalEvery steps (one round of all the steps without -eval-every), and the
// data's epochs run on underneath them.
func (c MLMConfig) runLength(batchesPerEpoch int) (steps, round int, err error) {
	steps = c.Steps
	if steps == 0 {
		steps = c.Epochs * batchesPerEpoch
	}
	round = steps
	if c.EvalEvery > 0 && c.EvalEvery < steps {
		if steps%c.EvalEvery != 0 {
			return 0, 0, fmt.Errorf("-eval-every %d does not divide the run's %d steps", c.EvalEvery, steps)
		}
		round = c.EvalEvery
	}
	return steps, round, nil
}

// scheduleSpec is -schedule, with BERT's warm-up over the first 10 % of the steps added to
// a plain "linear" (an explicit warmup or warmup_steps option wins).
func (c MLMConfig) scheduleSpec(steps int) string {
	spec := strings.TrimSpace(c.Schedule)
	if spec == "linear" && c.Warmup == 0 {
		return fmt.Sprintf("linear:warmup_steps=%d", steps/10)
	}
	return spec
}

func (w *mlmWorker) run(ctx context.Context) error {
	c, g := w.cfg, w.group
	rank, world := g.Rank(), g.Size()
	vocab := w.corpus.Tokenizer.Vocab()
	bcfg, err := models.BertPreset(c.Model)
	if err != nil {
		return err
	}
	bcfg.VocabSize = vocab.Size()
	bcfg.HiddenDropout, bcfg.AttentionDropout = c.Dropout, c.Dropout
	if pad, ok := vocab.ID(datasets.PadToken); ok {
		bcfg.PadTokenID = int(pad)
	}
	model, err := models.NewBertForPreTraining(bcfg, nn.NewRand(c.Seed))
	if err != nil {
		return err
	}
	dump, err := w.openDump(model)
	if err != nil {
		return err
	}
	defer dump.Close()
	hook, err := hooks.Parse(c.Hook)
	if err != nil {
		return err
	}
	loader, err := datasets.NewMLMLoader(w.corpus.Train, datasets.MLMLoaderOptions{Batch: c.Batch, Rank: rank, World: world, Shuffle: true, DropLast: true})
	if err != nil {
		return err
	}
	nb := loader.NumBatches()
	if nb == 0 {
		return fmt.Errorf("-batch %d × %d workers: the training text has only %d sequence pairs", c.Batch, world, w.corpus.Train.Len())
	}
	// batches yields the data's batches from global step s on, across data epochs.
	batches := func(ctx context.Context, s int) iter.Seq2[datasets.MLMBatch, error] {
		return func(yield func(datasets.MLMBatch, error) bool) {
			for {
				epoch, first := s/nb, s%nb
				for b, err := range loader.EpochFrom(ctx, epoch, first) {
					if !yield(b, err) || err != nil {
						return
					}
				}
				s = (epoch + 1) * nb
			}
		}
	}
	tape := nn.NewTape()
	opts := []ddp.Option{ddp.WithCommHook(hook)}
	opts = append(opts, bucketCap(c.BucketMB)...)
	opts, err = withProfile(ctx, g, model, hook, c.Profile, w.stdout, opts, func() (ddp.ProfileStep, func(), error) {
		next, stop := iter.Pull2(batches(ctx, 0))
		nn.SetTraining(model, true)
		return func(backward func(*nn.Var) error) error {
			b, err, _ := next()
			if err != nil {
				return err
			}
			positions, labels := maskedPositions(b)
			tape.Reset()
			mlm, nsp := model.ForwardMaskedLM(tape, b.InputIDs, b.TokenTypeIDs, b.AttentionMask, b.N, b.SeqLen, positions)
			nspLabels := make([]int, b.N)
			for i, l := range b.NextSentence {
				nspLabels[i] = int(l)
			}
			return backward(model.Loss(mlm, nsp, labels, nspLabels))
		}, stop, nil
	})
	if err != nil {
		return err
	}
	traffic := g.Counters().Snapshot() // the summary counts training's traffic, not the set-up's (omgs's profile)
	dp, err := ddp.New(ctx, model, g, opts...)
	if err != nil {
		return err
	}
	opt, err := c.NewOptimizer(dp, hook)
	if err != nil {
		return err
	}
	steps, round, err := c.runLength(nb)
	if err != nil {
		return err
	}
	rounds := steps / round
	sc := c
	sc.Schedule = c.scheduleSpec(steps)
	sched, err := sc.NewSchedule(rounds, round, world)
	if err != nil {
		return err
	}
	evalLoader, err := datasets.NewMLMLoader(w.corpus.Valid, datasets.MLMLoaderOptions{Batch: c.Batch})
	if err != nil {
		return err
	}
	if rank == 0 {
		w.sum.Params = nn.NumParams(dp.Parameters())
		fmt.Fprintf(w.stdout, "model bert-%s: %d parameters in %d tensors, %d buckets; hook %s; %d workers × batch %d × %d tokens; %d steps (%d per data epoch), schedule %s; kernels %s, GOMAXPROCS %d\n",
			c.Model, w.sum.Params, len(dp.Parameters()), len(dp.Plan()), c.Hook, world, c.Batch, c.Seq, steps, nb, orDefault(sc.Schedule, "constant"), kernels.Impl(), runtime.GOMAXPROCS(0))
	}
	loop := &Loop[datasets.MLMBatch]{
		Group: g, DDP: dp, Model: model, Optimizer: opt, Schedule: sched, Epochs: rounds, StepsPerEpoch: round, Unit: "seq",
		Batches: func(ctx context.Context, r, start int) iter.Seq2[datasets.MLMBatch, error] {
			return batches(ctx, r*round+start)
		},
		Step: func(ctx context.Context, b datasets.MLMBatch) (StepResult, error) {
			if err := dump.write(b); err != nil {
				return StepResult{}, err
			}
			tape.SetGradEnabled(true)
			loss, mlmLoss, mlm, _, labels, _ := mlmForward(dp, model, tape, b)
			if err := dp.Backward(ctx, loss); err != nil {
				return StepResult{}, err
			}
			acc := float64(nn.Accuracy(mlm.Value, labels)) / float64(len(labels))
			return StepResult{Loss: float64(mlmLoss.Item()), Correct: acc * float64(b.N), N: b.N}, nil
		},
		EndEpoch: func(ctx context.Context, es EpochStats) error {
			vl, va, vn, err := w.evaluate(ctx, dp, model, tape, evalLoader)
			if err != nil {
				return err
			}
			if rank != 0 {
				return nil
			}
			res := MLMRound{Round: es.Epoch, Steps: es.Steps, AtStep: int64(es.Epoch * round), TrainLoss: es.Loss, TrainAcc: es.Acc,
				ValLoss: vl, ValAcc: va, ValNSPAcc: vn, SeqPerSec: es.Samples / es.TrainSec, TrainSec: es.TrainSec,
				TotalSec: time.Since(w.start).Seconds(), LR: opt.LR()}
			w.sum.Rounds = append(w.sum.Rounds, res)
			w.sum.CommStats = g.Counters().Snapshot().Sub(traffic)
			fmt.Fprintf(w.stdout, "step %d train_loss %.4f train_acc %.4f val_loss %.4f val_acc %.4f val_nsp_acc %.4f seq_s %.1f train_s %.1f total_s %.1f\n",
				res.AtStep, res.TrainLoss, res.TrainAcc, res.ValLoss, res.ValAcc, res.ValNSPAcc, res.SeqPerSec, res.TrainSec, res.TotalSec)
			return w.metrics.Write(res)
		},
		LogEvery: c.LogEvery,
		Start:    w.start,
	}
	if c.Checkpoint != "" {
		loop.Checkpoints = &Checkpointer{Dir: c.Checkpoint, Every: c.CheckpointEvery, Keep: c.Keep, Resume: c.Resume, Meta: c.checkpointMeta(world, vocab.Size(), round)}
	}
	loop.report(rank, w.metrics, c.Progress, w.stdout, w.stderr, func(pos checkpoint.Position) string {
		return fmt.Sprintf("step %d", pos.Iteration)
	})
	return loop.Run(ctx)
}

// batchDump writes a rank's first training batches for -dump-batches (nil: nothing to do).
type batchDump struct {
	f      *os.File
	w      *bufio.Writer
	left   int
	path   string
	closed bool
}

// openDump writes init.safetensors (rank 0) and opens this rank's batch file, for
// -dump-batches; it returns nil without that flag.
func (w *mlmWorker) openDump(model *models.BertForPreTraining) (*batchDump, error) {
	c, rank := w.cfg, w.group.Rank()
	if c.DumpBatches == "" {
		return nil, nil
	}
	if err := os.MkdirAll(c.DumpBatches, 0o755); err != nil {
		return nil, fmt.Errorf("-dump-batches: %w", err)
	}
	if rank == 0 {
		st := safetensors.New()
		for _, p := range nn.Parameters(model) {
			st.Tensors[p.Name] = safetensors.FromFloat32(slices.Clone(p.Value.Data), p.Value.Shape...)
		}
		for k, v := range map[string]string{"workers": strconv.Itoa(w.group.Size()), "batch": strconv.Itoa(c.Batch), "seq": strconv.Itoa(c.Seq),
			"steps": strconv.Itoa(c.Steps), "dump_steps": strconv.Itoa(c.DumpSteps), "seed": strconv.FormatUint(c.Seed, 10), "model": c.Model} {
			st.Metadata[k] = v
		}
		if err := st.WriteFile(filepath.Join(c.DumpBatches, "init.safetensors")); err != nil {
			return nil, fmt.Errorf("-dump-batches: %w", err)
		}
	}
	path := filepath.Join(c.DumpBatches, fmt.Sprintf("rank%d.bin", rank))
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("-dump-batches: %w", err)
	}
	return &batchDump{f: f, w: bufio.NewWriter(f), left: c.DumpSteps, path: path}, nil
}

// write appends b while steps are left to dump.
func (d *batchDump) write(b datasets.MLMBatch) error {
	if d == nil || d.left == 0 {
		return nil
	}
	d.left--
	for _, a := range [][]int32{b.InputIDs, b.TokenTypeIDs, b.AttentionMask, b.Labels, b.NextSentence} {
		if err := binary.Write(d.w, binary.LittleEndian, a); err != nil {
			return fmt.Errorf("-dump-batches: %s: %w", d.path, err)
		}
	}
	if d.left == 0 {
		return d.Close()
	}
	return nil
}

// Close flushes and closes the file (once).
func (d *batchDump) Close() error {
	if d == nil || d.closed {
		return nil
	}
	d.closed = true
	err := d.w.Flush()
	if cerr := d.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("-dump-batches: %s: %w", d.path, err)
	}
	return nil
}

// checkpointMeta describes the run for checkpoints: resuming requires the same model, hook,
// world size, vocabulary size, round length and the flags that change the trajectory.
func (c MLMConfig) checkpointMeta(world, vocab, round int) checkpoint.Meta {
	cfg := c.Flags.MetaConfig()
	for k, v := range map[string]string{"batch": strconv.Itoa(c.Batch), "steps": strconv.Itoa(c.Steps), "epochs": strconv.Itoa(c.Epochs),
		"seq": strconv.Itoa(c.Seq), "dropout": formatFloat(c.Dropout), "max_predictions": strconv.Itoa(c.MaxPredictions), "seed": strconv.FormatUint(c.Seed, 10),
		"bucket_mb": formatFloat(c.BucketMB), "vocab": strconv.Itoa(vocab), "round": strconv.Itoa(round), "hold_out": formatFloat(c.HoldOut)} {
		cfg[k] = v
	}
	return checkpoint.Meta{Model: "bert-" + c.Model, Hook: c.Hook, World: world, Config: cfg}
}
