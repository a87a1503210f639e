// Command lstm trains an LSTM word-level language model on Penn Treebank with data-parallel
// workers: in one process, each worker a goroutine with its own model replica, or one worker
// per process under a launcher (torchrun, spargo launch, Slurm, mpirun, Kubernetes), with
// any comm hook (-hook), exactly as examples/vgg.
//
//	go run ./examples/lstm -data ~/data/ptb -model small -workers 2 -epochs 2     # PTB found or downloaded without -data
//	go run ./examples/lstm -model medium -epochs 39 -schedule ptb:after=6,decay=0.8   # Zaremba's medium
//	go run ./examples/lstm -model ptb -lr 1 -clip 0.25 -hook oktopk:density=0.02      # SparDL's 1500-unit model
//	go run ./examples/lstm -metrics run.jsonl -log-every 50 -plot run.png
//	go run ./examples/lstm -epochs 1 -steps 200 -eval-every 25 -eval-limit 20000 -metrics run.jsonl   # short run, 8 validations
//	go run ./examples/lstm -workers 4 -hook omgs:density=0.01 -profile lstm.profile.json             # omgs: measured plan
//	go run ./examples/lstm -task imdb -data ~/data/aclImdb -epochs 3                 # LSTM-IMDB
//	go build -o lstm ./examples/lstm && spargo launch -n 2 -- ./lstm -epochs 2        # 2 processes
//
// Data: each rank takes its own contiguous slice of the training stream (the stream cut
// into -workers equal parts), lays it out in -batch columns (word_language_model's
// batchify) and trains on consecutive -bptt windows, carrying the LSTM's hidden state from
// one window to the next without gradient (truncated BPTT); every epoch starts from the zero
// state. A step's loss is the mean cross-entropy over its batch × bptt words; DDP averages
// the gradients over the ranks, then they are clipped to a total norm of -clip, then SGD
// steps. Validation (and, after the last epoch, test) perplexity is computed the same way on
// -eval-batch columns per rank, the sums all-reduced. -eval-every N validates every N steps
// within the epochs too (step records with val_loss and val_ppl in -metrics, which spargo
// plot draws as the validation curve; their time is left out of words/s), and -eval-limit N
// validates on the first N tokens of the validation stream only (the test perplexity stays
// on the whole test stream).
//
// -hook omgs plans its buckets from costs measured before training (profile.Measure: the
// backward's per-tensor timings on a few training windows, top-k and collective costs);
// -profile FILE saves that profile and reuses it on the next run with the same model and
// number of workers.
//
// Defaults (-model small): batch 20, bptt 35, SGD lr 20 without momentum or weight decay,
// clip 0.25, and Zaremba et al.'s decay (-schedule ptb: ×0.5 per epoch after epoch 4). That
// is Zaremba's small recipe (lr 1 and clip 5 on a loss summed over 20 time steps) rescaled
// for a loss averaged over the window's words, which is what word_language_model uses
// (lr 20, clip 0.25). The authors' reference code's recipe for the 1500-unit model is -model ptb -lr 1
// -clip 0.25, with ×0.1 decays late in training (-schedule multistep:milestones=60/80).
//
// -task imdb trains SparDL's LSTM-IMDB classifier (embedding 50, LSTM 100,
// Linear 2; 2,561,052 parameters with the 50,000-word vocabulary) on the aclImdb folders,
// classifying each review from the LSTM's output at its last real token; -max-len sets the
// review length (default 500), and its defaults are -optim adam -lr 0.001 -batch 32 -clip 0
// with a constant rate unless those flags are given. It prints test accuracy per epoch.
//
// The shared training flags (-optim, -schedule, -warmup, -lr, -momentum, -wd, -metrics,
// -log-every, -plot) are train.Flags; -optim help and -schedule help list the specs.
// Checkpoints (-checkpoint DIR, -checkpoint-every N, -resume) resume exactly, mid-epoch
// included: besides the model, optimizer, hook, DDP and dropout-generator state, every
// rank's carried hidden state (h, c) is saved in its rank file, and a checkpoint whose state
// has another shape (layers, batch, hidden size) or world size is refused.
package main

import "github.com/spargo-dl/spargo/train"

// defaults are the program's flags' defaults (see the package doc).
func defaults() LMConfig {
	return LMConfig{
		Model: "small", Workers: 2, Hook: "allreduce", Batch: 20, Bptt: 35, Epochs: 2,
		Flags:     train.Flags{LR: 20, Optim: "sgd", Schedule: "ptb"},
		Dropout:   -1,
		Clip:      0.25,
		EvalBatch: 10,
		Keep:      3,
		Progress:  true,
	}
}

func main() {
	LMMain("lstm", defaults())
}
