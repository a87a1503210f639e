// Command bert pre-trains BERT (masked LM + next-sentence prediction, Devlin et al. 2019) on a
// text corpus with data-parallel workers: in one process, each worker a goroutine with its
// own replica, or one worker per process under a launcher (torchrun, spargo launch, Slurm,
// mpirun), exactly as examples/vgg; any comm hook drops in with -hook.
//
//	go run ./examples/bert -model tiny -workers 2 -steps 2000    # PTB, found or downloaded
//	go run ./examples/bert -hook spardl:density=0.01 -metrics run.jsonl -log-every 100 -plot run.png
//	go run ./examples/bert -data corpus/ -vocab vocab.txt -seq 256 -model mini
//	go run ./examples/bert -data ~/data/ptb -save-vocab vocab.txt   # for scripts/torch_bert_mlm.py
//	go build -o bert ./examples/bert && spargo launch -n 2 -- ./bert
//
// Data: -data is a text file or a directory of .txt files in the format of BERT's
// create_pretraining_data.py (one sentence per line, blank lines between documents; a file
// without blank lines, such as PTB's, is one document). A directory's *valid*.txt files are
// the held-out text (ptb.valid.txt for PTB) and *test*.txt files are left out. Without
// -data the corpus is PTB, found by datasets.Find ($SPARGO_DATA/ptb, the user cache, or
// downloaded; docs/data.md); otherwise the last -hold-out of the sentences are held out. The WordPiece vocabulary
// (lowercased) is built from the training text (-vocab-size tokens) unless -vocab loads a
// vocab.txt; -save-vocab writes the one in use. Sequence pairs are built as BERT's
// create_instances_from_document (-seq tokens, 10 % shorter targets, half of the B segments
// from a random place) and masked anew every data epoch: 15 % of the tokens, at most
// -max-predictions per sequence, 80 % [MASK], 10 % a random token, 10 % unchanged
// (datasets.NewMLMDataset).
//
// Model: a BERT preset (tiny 2×128, mini 4×256, small 4×512, medium 8×512, base 12×768;
// models.BertPreset) with the corpus's vocabulary, dropout 0.1, the MLM decoder tied to the
// word embeddings; the MLM head runs only at the masked positions, as Google's BERT. The loss
// is masked-LM cross-entropy plus NSP cross-entropy; the reported training loss is the
// masked-LM part.
//
// Recipe (the defaults): AdamW with BERT's no-decay groups (-optim adamw:wd=0.01,no_decay=true;
// biases and LayerNorm weights do not decay), -lr 1e-3, -schedule linear: linear warm-up over
// the first 10 % of the steps (unless the spec has warmup= or warmup_steps=), then linear
// decay to 0 at the last step; -batch is per worker.
//
// -steps counts optimizer steps (-steps 0: -epochs passes over the training pairs). Every
// -eval-every steps (it must divide the steps; 0: at the end) rank 0 prints and writes to
// -metrics the training MLM loss and accuracy since the last evaluation and the held-out MLM
// loss and accuracy and NSP accuracy; -log-every N adds a step record of the training loss
// every N steps. The rounds between evaluations are the "epochs" of the progress bar, of
// -metrics' epoch records and of -warmup. Checkpoints (-checkpoint, -checkpoint-every,
// -resume) resume exactly, mid-round included, with the same flags.
package main

import (
	"github.com/spargo-dl/spargo/train"
)

// defaults are the program's flags' defaults: BERT-tiny on 2 workers of 16 sequences of 128
// tokens, 2000 steps, AdamW 1e-3 with BERT's warm-up and linear decay.
func defaults() MLMConfig {
	return MLMConfig{
		Model: "tiny", Workers: 2, Hook: "allreduce", Batch: 16, Steps: 2000, Epochs: 1, Seq: 128, Dropout: 0.1,
		HoldOut: 0.05, VocabSize: 8000,
		Flags:    train.Flags{LR: 1e-3, Optim: "adamw:wd=0.01,no_decay=true", Schedule: "linear"},
		Keep:     3,
		Progress: true,
	}
}

func main() {
	MLMMain("bert", defaults())
}
