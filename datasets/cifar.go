package datasets

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CIFAR image geometry: 3 colour planes (R, G, B) of 32×32 pixels, row-major.
const (
	cifarChannels = 3
	cifarSide     = 32
	cifarPixels   = cifarChannels * cifarSide * cifarSide // 3072 bytes per image
)

// Format is a CIFAR binary record layout.
type Format int

const (
	// FormatCIFAR10 records are 1 label byte (0..9) + 3072 pixel bytes.
	FormatCIFAR10 Format = 10
	// FormatCIFAR100 records are 1 coarse label byte (0..19) + 1 fine label
	// byte (0..99) + 3072 pixel bytes.
	FormatCIFAR100 Format = 100
)

// labelBytes is the number of label bytes in front of each record's pixels.
func (f Format) labelBytes() int {
	if f == FormatCIFAR100 {
		return 2
	}
	return 1
}

// RecordSize is the size in bytes of one record: 3073 or 3074.
func (f Format) RecordSize() int { return f.labelBytes() + cifarPixels }

func (f Format) String() string {
	switch f {
	case FormatCIFAR10:
		return "CIFAR-10"
	case FormatCIFAR100:
		return "CIFAR-100"
	}
	return "Format(" + strconv.Itoa(int(f)) + ")"
}

// Default per-channel normalisation constants (R, G, B) for pixels scaled to
// [0,1]; the same values as the PyTorch reference training scripts.
var (
	CIFAR10Mean  = [3]float32{0.4914, 0.4822, 0.4465}
	CIFAR10Std   = [3]float32{0.2470, 0.2435, 0.2616}
	CIFAR100Mean = [3]float32{0.5071, 0.4865, 0.4409}
	CIFAR100Std  = [3]float32{0.2673, 0.2564, 0.2762}
)

// Images is one split of an image dataset held in memory.
//
// Pixels are kept as uint8 (a quarter of the float32 size); the [Loader]
// normalises them batch by batch. Image i occupies
// Pixels[i*C*H*W : (i+1)*C*H*W] as C planes of H×W row-major bytes.
type Images struct {
	Name       string // e.g. "CIFAR-10 train"
	N, C, H, W int
	Pixels     []uint8
	// Labels are the targets a Loader yields: the CIFAR-10 label, or the
	// CIFAR-100 fine or coarse label (see LoadCIFAR100). In [0, Classes).
	Labels []int32
	// Fine and Coarse are both CIFAR-100 label sets (nil for CIFAR-10);
	// Labels is one of them.
	Fine, Coarse []int32
	Classes      int
	ClassNames   []string // len Classes
	Mean, Std    [3]float32
	Files        []string // files read, in order
	// Summary says how many records came from which files, e.g.
	// "CIFAR-10 train: 10000 records from data_batch_1.bin (batches 2-5 not present)".
	Summary string
}

// Image returns the C*H*W pixel bytes of image i (a view, not a copy).
func (m *Images) Image(i int) []uint8 {
	size := m.C * m.H * m.W
	return m.Pixels[i*size : (i+1)*size : (i+1)*size]
}

// LoadCIFARFiles reads the given files, in order, as records of the given
// format. CIFAR-100 files get Labels = Fine. Class names are the built-in
// ones. It is the building block of LoadCIFAR10 and LoadCIFAR100, and
// reads files with any name (the project's partial copies are named like
// train_00000-00999.bin).
func LoadCIFARFiles(files []string, format Format) (*Images, error) {
	if format != FormatCIFAR10 && format != FormatCIFAR100 {
		return nil, fmt.Errorf("datasets: unknown CIFAR format %d", int(format))
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("datasets: no %v files given", format)
	}
	rec := int64(format.RecordSize())
	var total int64
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			return nil, fmt.Errorf("datasets: %w", err)
		}
		if st.IsDir() {
			return nil, fmt.Errorf("datasets: %s is a directory, not a %v batch file", f, format)
		}
		size := st.Size()
		if size == 0 {
			return nil, fmt.Errorf("datasets: %s: empty file, want %v records of %d bytes", f, format, rec)
		}
		if rem := size % rec; rem != 0 {
			return nil, fmt.Errorf("datasets: %s: record %d truncated: %d of %d bytes", f, size/rec, rem, rec)
		}
		total += size / rec
	}

	n := int(total)
	m := &Images{
		Name: format.String(), N: n, C: cifarChannels, H: cifarSide, W: cifarSide,
		Pixels: make([]uint8, n*cifarPixels),
		Files:  append([]string(nil), files...),
	}
	if format == FormatCIFAR10 {
		m.Labels = make([]int32, n)
		m.Classes, m.ClassNames = 10, cifar10ClassNames
		m.Mean, m.Std = CIFAR10Mean, CIFAR10Std
	} else {
		m.Fine, m.Coarse = make([]int32, n), make([]int32, n)
		m.Labels = m.Fine
		m.Classes, m.ClassNames = 100, cifar100FineNames
		m.Mean, m.Std = CIFAR100Mean, CIFAR100Std
	}
	next := 0
	for _, f := range files {
		got, err := readCIFARFile(f, format, m, next)
		if err != nil {
			return nil, err
		}
		next += got
	}
	if next != n { // a file changed size between Stat and read
		return nil, fmt.Errorf("datasets: read %d records, expected %d from file sizes", next, n)
	}
	names := make([]string, len(files))
	for i, f := range files {
		names[i] = filepath.Base(f)
	}
	m.Summary = fmt.Sprintf("%s: %d records from %s", m.Name, n, listNames(names))
	return m, nil
}

// readCIFARFile reads the records of one file into m starting at record
// index first, and returns how many it read.
func readCIFARFile(path string, format Format, m *Images, first int) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("datasets: %w", err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	var label [2]byte
	lb := format.labelBytes()
	for rec := 0; ; rec++ {
		i := first + rec
		if _, err := io.ReadFull(r, label[:lb]); err != nil {
			if err == io.EOF {
				return rec, nil
			}
			return rec, fmt.Errorf("datasets: %s: record %d: %w", path, rec, err)
		}
		if i >= m.N {
			return rec, fmt.Errorf("datasets: %s: record %d: file grew while reading", path, rec)
		}
		if _, err := io.ReadFull(r, m.Pixels[i*cifarPixels:(i+1)*cifarPixels]); err != nil {
			return rec, fmt.Errorf("datasets: %s: record %d: %w", path, rec, err)
		}
		if format == FormatCIFAR10 {
			if label[0] >= 10 {
				return rec, fmt.Errorf("datasets: %s: record %d: label %d out of range [0,10)", path, rec, label[0])
			}
			m.Labels[i] = int32(label[0])
			continue
		}
		if label[0] >= 20 {
			return rec, fmt.Errorf("datasets: %s: record %d: coarse label %d out of range [0,20)", path, rec, label[0])
		}
		if label[1] >= 100 {
			return rec, fmt.Errorf("datasets: %s: record %d: fine label %d out of range [0,100)", path, rec, label[1])
		}
		m.Coarse[i], m.Fine[i] = int32(label[0]), int32(label[1])
	}
}

// The official file names.
const (
	cifar10Subdir   = "cifar-10-batches-bin"
	cifar10Batches  = 5
	cifar10TestFile = "test_batch.bin"
	cifar10MetaFile = "batches.meta.txt"

	cifar100Subdir     = "cifar-100-binary"
	cifar100TrainFile  = "train.bin"
	cifar100TestFile   = "test.bin"
	cifar100FineMeta   = "fine_label_names.txt"
	cifar100CoarseMeta = "coarse_label_names.txt"
)

func cifar10BatchName(k int) string { return fmt.Sprintf("data_batch_%d.bin", k) }

// cifar10Layout is what a directory holds of the official CIFAR-10 layout.
type cifar10Layout struct {
	dir     string   // directory holding the files (dir or dir/cifar-10-batches-bin)
	train   []string // data_batch_k.bin paths that exist, in k order
	missing []int    // batch numbers k that do not exist
	test    string
}

// findCIFAR10Layout looks for the official file names in dir and then in
// dir/cifar-10-batches-bin; it needs at least one training batch and the
// test batch. Its errors have no "datasets:" prefix; callers add context.
func findCIFAR10Layout(dir string) (cifar10Layout, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return cifar10Layout{}, err
	}
	if !st.IsDir() {
		return cifar10Layout{}, fmt.Errorf("%s is not a directory", dir)
	}
	var tried []string
	for _, d := range []string{dir, filepath.Join(dir, cifar10Subdir)} {
		var l cifar10Layout
		l.dir = d
		for k := 1; k <= cifar10Batches; k++ {
			p := filepath.Join(d, cifar10BatchName(k))
			if isFile(p) {
				l.train = append(l.train, p)
			} else {
				l.missing = append(l.missing, k)
			}
		}
		if p := filepath.Join(d, cifar10TestFile); isFile(p) {
			l.test = p
		}
		if len(l.train) > 0 && l.test != "" {
			return l, nil
		}
		tried = append(tried, d)
	}
	return cifar10Layout{}, fmt.Errorf("no CIFAR-10 batches in %s: looked for data_batch_1.bin … data_batch_5.bin (at least one) and test_batch.bin in %s",
		dir, strings.Join(tried, " and "))
}

// LoadCIFAR10 reads CIFAR-10 from dir (or dir/cifar-10-batches-bin): the
// training batches data_batch_1.bin … data_batch_5.bin that exist, and
// test_batch.bin. Class names come from batches.meta.txt when present.
// train.Summary says which batches were loaded and which were missing.
func LoadCIFAR10(dir string) (train, test *Images, err error) {
	l, err := findCIFAR10Layout(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("datasets: load CIFAR-10: %w", err)
	}
	names := cifar10ClassNames
	if meta := filepath.Join(l.dir, cifar10MetaFile); isFile(meta) {
		if names, err = readClassNames(meta, 10); err != nil {
			return nil, nil, err
		}
	}
	if train, err = LoadCIFARFiles(l.train, FormatCIFAR10); err != nil {
		return nil, nil, err
	}
	if test, err = LoadCIFARFiles([]string{l.test}, FormatCIFAR10); err != nil {
		return nil, nil, err
	}
	train.Name, test.Name = "CIFAR-10 train", "CIFAR-10 test"
	train.ClassNames, test.ClassNames = names, names
	trainFiles := make([]string, len(l.train))
	for i, p := range l.train {
		trainFiles[i] = filepath.Base(p)
	}
	train.Summary = fmt.Sprintf("%s: %d records from %s", train.Name, train.N, listNames(trainFiles))
	if len(l.missing) > 0 {
		word := "batches"
		if len(l.missing) == 1 {
			word = "batch"
		}
		train.Summary += fmt.Sprintf(" (%s %s not present)", word, numberRanges(l.missing))
	}
	test.Summary = fmt.Sprintf("%s: %d records from %s", test.Name, test.N, filepath.Base(l.test))
	return train, test, nil
}

// LoadCIFAR100 reads CIFAR-100 train.bin and test.bin from dir (or
// dir/cifar-100-binary). Fine and Coarse hold both label sets; Labels (the
// Loader's targets) is Fine with 100 classes when fine is true, otherwise
// Coarse with 20 classes. Class names come from fine_label_names.txt and
// coarse_label_names.txt when present.
func LoadCIFAR100(dir string, fine bool) (train, test *Images, err error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("datasets: CIFAR-100 directory: %w", err)
	}
	if !st.IsDir() {
		return nil, nil, fmt.Errorf("datasets: CIFAR-100 directory %s is not a directory", dir)
	}
	d := dir
	if !isFile(filepath.Join(d, cifar100TrainFile)) {
		d = filepath.Join(dir, cifar100Subdir)
	}
	trainPath, testPath := filepath.Join(d, cifar100TrainFile), filepath.Join(d, cifar100TestFile)
	if !isFile(trainPath) || !isFile(testPath) {
		return nil, nil, fmt.Errorf("datasets: no CIFAR-100 data in %s: looked for %s and %s in %s and %s",
			dir, cifar100TrainFile, cifar100TestFile, dir, filepath.Join(dir, cifar100Subdir))
	}
	fineNames, coarseNames := cifar100FineNames, cifar100CoarseNames
	if p := filepath.Join(d, cifar100FineMeta); isFile(p) {
		if fineNames, err = readClassNames(p, 100); err != nil {
			return nil, nil, err
		}
	}
	if p := filepath.Join(d, cifar100CoarseMeta); isFile(p) {
		if coarseNames, err = readClassNames(p, 20); err != nil {
			return nil, nil, err
		}
	}
	labelSet := "coarse"
	if fine {
		labelSet = "fine"
	}
	splits := [2]*Images{}
	for s, p := range []string{trainPath, testPath} {
		m, err := LoadCIFARFiles([]string{p}, FormatCIFAR100)
		if err != nil {
			return nil, nil, err
		}
		m.Name = "CIFAR-100 " + [2]string{"train", "test"}[s]
		if fine {
			m.Labels, m.Classes, m.ClassNames = m.Fine, 100, fineNames
		} else {
			m.Labels, m.Classes, m.ClassNames = m.Coarse, 20, coarseNames
		}
		m.Summary = fmt.Sprintf("%s: %d records from %s (%s labels)", m.Name, m.N, filepath.Base(p), labelSet)
		splits[s] = m
	}
	return splits[0], splits[1], nil
}

// readClassNames reads one class name per non-empty line and checks there
// are exactly want of them.
func readClassNames(path string, want int) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("datasets: %w", err)
	}
	var names []string
	for line := range strings.Lines(string(data)) {
		if s := strings.TrimSpace(line); s != "" {
			names = append(names, s)
		}
	}
	if len(names) != want {
		return nil, fmt.Errorf("datasets: %s: %d class names, want %d", path, len(names), want)
	}
	return names, nil
}

func isFile(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

// listNames joins file names for a summary, shortening long lists to
// "first … last (n files)".
func listNames(names []string) string {
	if len(names) <= 5 {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s … %s (%d files)", names[0], names[len(names)-1], len(names))
}

// numberRanges formats ascending integers as "2-5" or "2, 4-5".
func numberRanges(ks []int) string {
	var parts []string
	for i := 0; i < len(ks); {
		j := i
		for j+1 < len(ks) && ks[j+1] == ks[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(ks[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", ks[i], ks[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}

var cifar10ClassNames = []string{
	"airplane", "automobile", "bird", "cat", "deer",
	"dog", "frog", "horse", "ship", "truck",
}

var cifar100CoarseNames = []string{
	"aquatic_mammals", "fish", "flowers", "food_containers", "fruit_and_vegetables",
	"household_electrical_devices", "household_furniture", "insects", "large_carnivores",
	"large_man-made_outdoor_things", "large_natural_outdoor_scenes",
	"large_omnivores_and_herbivores", "medium_mammals", "non-insect_invertebrates",
	"people", "reptiles", "small_mammals", "trees", "vehicles_1", "vehicles_2",
}

var cifar100FineNames = []string{
	"apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle",
	"bicycle", "bottle", "bowl", "boy", "bridge", "bus", "butterfly", "camel",
	"can", "castle", "caterpillar", "cattle", "chair", "chimpanzee", "clock",
	"cloud", "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur",
	"dolphin", "elephant", "flatfish", "forest", "fox", "girl", "hamster",
	"house", "kangaroo", "keyboard", "lamp", "lawn_mower", "leopard", "lion",
	"lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain", "mouse",
	"mushroom", "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear",
	"pickup_truck", "pine_tree", "plain", "plate", "poppy", "porcupine",
	"possum", "rabbit", "raccoon", "ray", "road", "rocket", "rose", "sea",
	"seal", "shark", "shrew", "skunk", "skyscraper", "snail", "snake", "spider",
	"squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank",
	"telephone", "television", "tiger", "tractor", "train", "trout", "tulip",
	"turtle", "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm",
}
