package datasets_test

import (
	"context"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/spargo-dl/spargo/datasets"
)

// writeFiles creates files (path → content) under a new temporary
// directory, standing in for a real dataset on disk.
func writeFiles(files map[string]string) string {
	root, err := os.MkdirTemp("", "spargo-example-")
	if err != nil {
		log.Fatal(err)
	}
	for name, content := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			log.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	return root
}

// The LSTM-IMDB input pipeline: LoadIMDB on an aclImdb directory (a real
// program would call DownloadIMDB first), then a TextLoader per rank.
func ExampleLoadIMDB() {
	root := writeFiles(map[string]string{
		"aclImdb/train/pos/0_9.txt":   "A wonderful film.<br /><br />Wonderful!",
		"aclImdb/train/neg/1_2.txt":   "Dull, dull film.",
		"aclImdb/test/pos/2_8.txt":    "Wonderful acting.",
		"aclImdb/test/neg/3_1.txt":    "Dull.",
		"aclImdb/train/unsup/4_0.txt": "ignored",
	})
	defer os.RemoveAll(root)

	ds, err := datasets.LoadIMDB(context.Background(), root, datasets.IMDBOptions{MaxLen: 6})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("embedding rows:", ds.Vocab.Size(), "words:", ds.Vocab.Words)
	ld, err := datasets.NewTextLoader(ds.Train, datasets.TextLoaderOptions{Batch: 2, Rank: 0, World: 1, Seed: 1, Shuffle: true})
	if err != nil {
		log.Fatal(err)
	}
	for b, err := range ld.Epoch(context.Background(), 0) {
		if err != nil {
			log.Fatal(err)
		}
		for k := range b.N {
			fmt.Println(b.Y[k], b.Lengths[k], b.X[k*b.MaxLen:(k+1)*b.MaxLen])
		}
	}
	// Output:
	// embedding rows: 8 words: [. dull film wonderful ! , a]
	// 0 5 [2 6 2 3 1 0]
	// 1 6 [7 4 3 1 4 5]
}

// BERT's tokenizer on the vocabulary of BERT's own tests.
func ExampleNewWordPieceTokenizer() {
	vocab, err := datasets.ReadVocab(strings.NewReader(
		"[UNK]\n[CLS]\n[SEP]\nwant\n##want\n##ed\nwa\nun\nrunn\n##ing\n,\n"), "vocab.txt")
	if err != nil {
		log.Fatal(err)
	}
	tok, err := datasets.NewWordPieceTokenizer(vocab, true) // uncased
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(tok.Tokenize("UNwant\u00E9d,running"))
	fmt.Println(tok.Encode("UNwant\u00E9d,running"))
	// Output:
	// [un ##want ##ed , runn ##ing]
	// [7 4 5 10 8 9]
}

// The BERT pre-training pipeline: train (or LoadVocab) a WordPiece
// vocabulary, read the corpus, build the pairs, and mask them per epoch.
func ExampleNewMLMDataset() {
	corpus := "the cat sat on the mat .\nthe dog sat on the log .\n\n" +
		"a bird sang in the tree .\nthe sun rose over the hill .\nit was morning .\n"
	ctx := context.Background()
	vocab, err := datasets.TrainWordPiece(ctx, strings.NewReader(corpus), "corpus.txt",
		datasets.WordPieceTrainerOptions{VocabSize: 60, Lowercase: true})
	if err != nil {
		log.Fatal(err)
	}
	tok, err := datasets.NewWordPieceTokenizer(vocab, true)
	if err != nil {
		log.Fatal(err)
	}
	docs, err := datasets.ReadDocuments(ctx, strings.NewReader(corpus), "corpus.txt")
	if err != nil {
		log.Fatal(err)
	}
	ds, err := datasets.NewMLMDataset(ctx, docs, tok, datasets.MLMOptions{MaxSeqLen: 16, Seed: 1})
	if err != nil {
		log.Fatal(err)
	}
	ld, err := datasets.NewMLMLoader(ds, datasets.MLMLoaderOptions{Batch: 8, Rank: 0, World: 1, Shuffle: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(docs), "documents,", ds.Len(), "sequence pairs")
	for b, err := range ld.Epoch(ctx, 0) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(b.N, "samples of", b.SeqLen, "tokens;", len(b.InputIDs), len(b.TokenTypeIDs),
			len(b.AttentionMask), len(b.Labels), "ids, types, mask, labels;", len(b.NextSentence), "NSP labels")
	}
	// Output:
	// 2 documents, 4 sequence pairs
	// 4 samples of 16 tokens; 64 64 64 64 ids, types, mask, labels; 4 NSP labels
}

// An ImageNet-style folder: class directories of JPEG or PNG files,
// decoded by parallel workers into normalised NCHW batches.
func ExampleNewImageFolder() {
	root, err := os.MkdirTemp("", "spargo-imagefolder-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(root)
	for i, class := range []string{"cat", "dog"} {
		if err := os.MkdirAll(filepath.Join(root, class), 0o755); err != nil {
			log.Fatal(err)
		}
		img := image.NewRGBA(image.Rect(0, 0, 64, 48))
		for p := range img.Pix {
			img.Pix[p] = uint8(100 * i)
		}
		img.Set(0, 0, color.RGBA{255, 0, 0, 255})
		f, err := os.Create(filepath.Join(root, class, "1.png"))
		if err != nil {
			log.Fatal(err)
		}
		if err := png.Encode(f, img); err != nil {
			log.Fatal(err)
		}
		f.Close()
	}

	folder, err := datasets.NewImageFolder(root)
	if err != nil {
		log.Fatal(err)
	}
	ld, err := datasets.NewImageFolderLoader(folder, datasets.ImageFolderLoaderOptions{
		Batch: 2, Rank: 0, World: 1, Seed: 1, Shuffle: true, Workers: 2,
		Transform: datasets.ImageTransform{Train: true, Size: 32}, // RandomResizedCrop(32) + flip
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(folder.Classes, len(folder.Samples), "images")
	for b, err := range ld.Epoch(context.Background(), 0) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(b.N, "images,", len(b.X), "floats (2×3×32×32)")
	}
	// Output:
	// [cat dog] 2 images
	// 2 images, 6144 floats (2×3×32×32)
}

// ExampleLoadPTB reads a corpus in the Penn Treebank layout, gives rank 1 of 2 its half of
// the training stream, lays it out in 2 columns and cuts windows of 3 words with their
// next-word targets.
func ExampleLoadPTB() {
	dir := writeFiles(map[string]string{
		"ptb.train.txt": " the cat sat \n the dog ran \n a cat ran \n",
		"ptb.valid.txt": " the cat \n",
		"ptb.test.txt":  " a dog \n",
	})
	defer os.RemoveAll(dir)
	p, err := datasets.LoadPTB(dir)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(p.Vocab.Words)
	shard, _ := datasets.ShardTokens(p.Train, 1, 2)
	b, _ := datasets.Batchify(shard, 2)
	x, y, steps := b.Window(0, 3)
	fmt.Println(len(p.Train), b.Rows, b.Windows(3), steps, x, y)
	// Output:
	// [<eos> cat ran the a dog sat]
	// 12 3 1 2 [2 1 0 2] [0 2 4 0]
}
