// Package datasets owns spargo's training data: reading the CIFAR-10 and
// CIFAR-100 binary files, ImageNet-style folders of JPEGs, the IMDB review
// folders and text corpora for BERT pre-training; finding them on disk or
// downloading them; turning them into normalised, augmented batches; and
// splitting an epoch across the ranks of a data-parallel job.
//
// The nouns, one file each:
//
//   - [Images] (cifar.go): a whole split in memory as uint8 CHW pixels plus
//     int32 labels, with a Summary of which files it came from. Built by
//     [LoadCIFAR10], [LoadCIFAR100] or [LoadCIFARFiles].
//   - [Dataset] (sets.go): a data set that can be found and downloaded:
//     [CIFAR10Set], [CIFAR100Set], [PTBSet], [IMDBSet], [TextCorpus].
//   - [Find], [Lookup] (find.go): where a data set lives, the one search
//     order of every spargo program; [NotFoundError] says where it looked.
//   - [DownloadCIFAR10], [DownloadCIFAR100], [DownloadPTB], [DownloadIMDB]
//     (download.go): the official files, md5-checked, extracted into a
//     directory, with deadlines on connecting and on a silent server.
//   - [Normalizer] (transform.go): per-channel (x/255-mean)/std, random
//     crop with zero padding, horizontal flip.
//   - [DistributedSampler] (sampler.go): PyTorch DistributedSampler
//     semantics: which dataset indices a rank sees in an epoch.
//   - [Loader] (loader.go): batches of X (B×3×32×32 float32, NCHW) and Y,
//     prepared on a goroutine one batch ahead of the training loop, in
//     buffers that are reused from batch to batch.
//   - [ImageFolder], [ImageFolderLoader] (imagefolder.go): torchvision's
//     ImageFolder layout (root/class/*.jpg|.jpeg|.png, classes sorted),
//     decoded by parallel workers; [ImageTransform] is RandomResizedCrop +
//     flip for training, Resize(256) + CenterCrop(224) for evaluation,
//     with PIL's antialiased bilinear resampling and ImageNet
//     normalisation. Each image's randomness is seeded by (Seed, epoch,
//     Rank, position), so batches do not depend on the number of workers.
//   - [LoadIMDB], [TextLoader] (imdb.go): the aclImdb folders, tokenized by
//     [TokenizeIMDB], a train-only vocabulary of the 50,000 most frequent
//     words (id 0 = padding and unknown), reviews as MaxLen int32 ids;
//     [DownloadIMDB] fetches the official tarball.
//   - [LoadPTB], [PTBVocab], [Batchify], [LMBatches], [ShardTokens]
//     (ptb.go): the Penn Treebank word-level corpus as TensorFlow's PTB reader reads it
//     (<eos> per line, vocabulary by decreasing count), laid out in N
//     columns and cut into bptt windows with targets shifted by one; each
//     data-parallel rank takes a contiguous slice of the stream.
//   - [BasicTokenizer], [WordPieceTokenizer], [Vocab], [TrainWordPiece]
//     (wordpiece.go): BERT's tokenizer, vocab.txt files, and WordPiece
//     vocabulary training.
//   - [ReadDocuments], [MLMDataset], [MLMLoader] (mlm.go): a corpus (one
//     sentence per line, blank lines between documents) turned into BERT
//     pre-training batches: [CLS] A [SEP] B [SEP] pairs with next-sentence
//     labels, built once from Seed as BERT's create_pretraining_data does,
//     and masked anew each epoch (15 %: 80 % [MASK], 10 % random, 10 %
//     unchanged; labels [IgnoreLabel] elsewhere).
//
// Every loader splits an epoch with [DistributedSampler] (disjoint shards,
// a reshuffle per epoch, the same batches for the same seed) and has an
// Epoch(ctx, epoch) method returning an iterator of (batch, error).
//
// # Where the data is looked for
//
// Every program takes a data set's directory as -data and otherwise calls
// [Find], which returns the first directory holding the set's files:
//
//  1. the explicit directory (the -data flag): the set's own directory, the
//     official archive's layout inside it (cifar-10-batches-bin/,
//     aclImdb/, …) or one of its subdirectories; given, it must hold the
//     data, and nothing else is tried;
//  2. $SPARGO_DATA/<name>, where $SPARGO_DATA is a data root holding
//     cifar10/, cifar100/, ptb/, aclImdb/ and text corpora (each in the
//     same layouts as above, e.g. cifar10/approx/), then $SPARGO_DATA
//     itself as the set's own directory. A $SPARGO_DATA that does not
//     exist is an error, not skipped;
//  3. os.UserCacheDir()/spargo/<name> (~/.cache/spargo/cifar10 on Linux);
//  4. a download of the official files into that cache directory, with a
//     progress bar and md5 checks (never for an explicit directory, nor
//     for a text corpus).
//
// If all fail, one [NotFoundError] lists each place and why it did not
// qualify, the download's failure, the flag and variable to set and the
// URLs to fetch by hand. [Lookup] is the same search without the download.
// FindCIFAR10, EnsureCIFAR10 and FindPTB are the older names of these.
//
// Tests never need a real data set: small copies in the official layouts
// are committed under testdata/ (cifar10-mini, ptb-mini, aclImdb-mini).
//
// # Which CIFAR-10 a number was measured on
//
// A copy with only data_batch_1.bin and test_batch.bin whose pixels went
// through JPEG (such as the project's development copy, cifar10/approx)
// loads the same way. Accuracy measured on it is "CIFAR-10 (JPEG-degraded,
// 10k-train subset)", not CIFAR-10 accuracy; [Images.Summary] says how many records were loaded
// from which files so that a training log can say which one it was.
//
// # Using the loader
//
//	dir, err := datasets.Find(ctx, datasets.CIFAR10Set, *dataFlag, os.Stderr)
//	train, test, err := datasets.LoadCIFAR10(dir)
//	fmt.Println(train.Summary)
//	ld, err := datasets.NewLoader(train, datasets.LoaderOptions{
//		Batch: 128, Rank: rank, World: world, Seed: 1,
//		Shuffle: true, Augment: true, DropLast: true,
//	})
//	for epoch := range epochs {
//		for b, err := range ld.Epoch(ctx, epoch) {
//			if err != nil { return err }
//			step(b.X, b.Y) // b.N images; valid until the next batch
//		}
//	}
package datasets
