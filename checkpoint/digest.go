package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/safetensors"
)

// tagManifest is Save's gather of the rank files' digests (between tagWritten and tagDone).
const tagManifest uint32 = 145

// FileDigest is a checkpoint file's entry in meta.json's "files": the SHA-256 of the whole
// file, its size and the SHA-256 of each tensor's bytes (hex). Save records one for every
// file it writes; Load and Verify check them, so a flipped bit is found and named.
type FileDigest struct {
	SHA256  string            `json:"sha256"`
	Size    int64             `json:"size"`
	Tensors map[string]string `json:"tensors,omitempty"`
}

// writeDigested writes f to path atomically and returns its digest, computed from the bytes
// as they are written.
func writeDigested(path string, f *safetensors.File) (FileDigest, error) {
	h := sha256.New()
	cw := &countingWriter{h: h}
	err := safetensors.WriteAtomic(path, func(w io.Writer) error {
		h.Reset()
		cw.n = 0
		return f.Encode(io.MultiWriter(w, cw))
	})
	if err != nil {
		return FileDigest{}, err
	}
	d := FileDigest{SHA256: hex.EncodeToString(h.Sum(nil)), Size: cw.n, Tensors: map[string]string{}}
	for name, t := range f.Tensors {
		d.Tensors[name] = tensorDigest(t)
	}
	return d, nil
}

type countingWriter struct {
	h hash.Hash
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	c.n += int64(len(b))
	return c.h.Write(b)
}

func tensorDigest(t safetensors.Tensor) string {
	s := sha256.Sum256(t.Data)
	return hex.EncodeToString(s[:])
}

// gatherDigests gives rank 0 every rank's rank-file digest (a collective over g when it has
// several ranks); other ranks get nil.
func gatherDigests(ctx context.Context, g comm.Group, rank int, own FileDigest) (map[string]FileDigest, error) {
	if g == nil || g.Size() == 1 {
		return map[string]FileDigest{rankFile(rank): own}, nil
	}
	b, err := json.Marshal(own)
	if err != nil {
		return nil, err
	}
	all, err := comm.AllGatherBytes(ctx, g, tagManifest, b)
	if err != nil {
		return nil, err
	}
	if rank != 0 {
		return nil, nil
	}
	files := map[string]FileDigest{}
	for r, b := range all {
		var d FileDigest
		if err := json.Unmarshal(b, &d); err != nil {
			return nil, fmt.Errorf("rank %d sent a malformed digest of its file: %w", r, err)
		}
		files[rankFile(r)] = d
	}
	return files, nil
}

// readVerified reads the checkpoint file name of the checkpoint in dir and checks it against
// files (meta.json's record): a mismatch is an error naming the file and the tensors that
// differ. With no record at all (a checkpoint saved before digests were recorded) it warns
// and reads the file unchecked.
func readVerified(dir, name string, files map[string]FileDigest) (*safetensors.File, error) {
	path := filepath.Join(dir, name)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if files == nil {
		warnUnverified(dir)
		f, err := safetensors.Decode(b, path)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
		return f, nil
	}
	want, ok := files[name]
	if !ok {
		return nil, fmt.Errorf("checkpoint: %s: no digest recorded in %s for this file; refusing to use it", path, metaFile)
	}
	if err := checkFile(path, b, want); err != nil {
		return nil, err
	}
	f, err := safetensors.Decode(b, path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	return f, nil
}

// warned holds the checkpoints warned about, so each is warned about once.
var warned sync.Map

func warnUnverified(dir string) {
	if _, done := warned.LoadOrStore(dir, true); !done {
		slog.Warn("checkpoint has no digests (saved by an older spargo): loading it unverified", "checkpoint", dir)
	}
}

// checkFile compares the bytes b of path with their record; the error names the tensors whose
// bytes differ (or says the header is damaged when none does).
func checkFile(path string, b []byte, want FileDigest) error {
	sum := sha256.Sum256(b)
	got := hex.EncodeToString(sum[:])
	if got == want.SHA256 && int64(len(b)) == want.Size {
		return nil
	}
	what := fmt.Sprintf("SHA-256 %s (%d bytes), %s records %s (%d bytes)", short(got), len(b), metaFile, short(want.SHA256), want.Size)
	f, err := safetensors.Decode(b, path)
	if err != nil {
		return fmt.Errorf("checkpoint: %s is corrupt: %s; its header is damaged: %w", path, what, err)
	}
	bad := badTensors(f, want)
	if len(bad) == 0 {
		return fmt.Errorf("checkpoint: %s is corrupt: %s; every tensor matches its digest, so the header or metadata changed", path, what)
	}
	n, shown := len(bad), bad
	if n > 3 {
		shown = append(shown[:3:3], fmt.Sprintf("and %d more", n-3))
	}
	return fmt.Errorf("checkpoint: %s is corrupt: %s %s; %s", path, plural(n, "tensor"), strings.Join(shown, ", "), what)
}

// badTensors lists, quoted and sorted, f's tensors whose bytes do not match want, and those
// missing on either side.
func badTensors(f *safetensors.File, want FileDigest) []string {
	var bad []string
	for _, name := range slices.Sorted(maps.Keys(want.Tensors)) {
		t, ok := f.Tensors[name]
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("%q (missing)", name))
		case tensorDigest(t) != want.Tensors[name]:
			bad = append(bad, fmt.Sprintf("%q", name))
		}
	}
	for _, name := range f.Names() {
		if _, ok := want.Tensors[name]; !ok {
			bad = append(bad, fmt.Sprintf("%q (not recorded)", name))
		}
	}
	return bad
}

func plural(n int, what string) string {
	if n == 1 {
		return what
	}
	return what + "s"
}

func short(hexDigest string) string {
	if len(hexDigest) > 16 {
		return hexDigest[:16] + "…"
	}
	return hexDigest
}

// Verify checks every file of the checkpoint in directory path (or a run's latest, when path
// holds a "latest" file) against the digests meta.json records: nil when all match, an error
// naming each corrupt or missing file (and its tensors) otherwise. A checkpoint saved before
// digests were recorded cannot be verified: the error wraps ErrNoDigests.
func Verify(path string) error {
	path, err := resolve(path)
	if err != nil {
		return err
	}
	in, err := readInfo(path)
	if err != nil {
		return err
	}
	if in.Files == nil {
		return fmt.Errorf("checkpoint: %s: %w", path, ErrNoDigests)
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(in.Files)) {
		b, err := os.ReadFile(filepath.Join(path, name))
		if err == nil {
			err = checkFile(filepath.Join(path, name), b, in.Files[name])
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	names, err := stFiles(path)
	if err != nil {
		return err
	}
	for _, name := range names {
		if _, ok := in.Files[name]; !ok {
			errs = append(errs, fmt.Errorf("checkpoint: %s: no digest recorded in %s for this file", filepath.Join(path, name), metaFile))
		}
	}
	return errors.Join(errs...)
}

// ErrNoDigests is wrapped by Verify's error for a checkpoint whose meta.json records no digests.
var ErrNoDigests = errors.New("no digests recorded (saved by an older spargo)")

// Digests returns the digests meta.json records for the checkpoint in path (or a run's latest),
// by file name; nil for a checkpoint saved before digests were recorded.
func Digests(path string) (map[string]FileDigest, error) {
	path, err := resolve(path)
	if err != nil {
		return nil, err
	}
	in, err := readInfo(path)
	if err != nil {
		return nil, err
	}
	return in.Files, nil
}

// corruptions lists, as differences, the files and tensors of the checkpoint in dir that do
// not match the digests its meta.json records; side ("first", "second") names it.
func corruptions(dir string, files map[string]FileDigest, side string) []Difference {
	var diffs []Difference
	what := fmt.Sprintf("does not match the digest %s records (the %s checkpoint is corrupt)", metaFile, side)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		want := files[name]
		path := filepath.Join(dir, name)
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // a missing file is a difference of the file lists (or both lack it: Verify's)
		}
		if err != nil {
			diffs = append(diffs, Difference{File: name, What: fmt.Sprintf("recorded in the %s checkpoint's %s but unreadable: %v", side, metaFile, err)})
			continue
		}
		if checkFile(path, b, want) == nil {
			continue
		}
		f, err := safetensors.Decode(b, path)
		if err != nil {
			diffs = append(diffs, Difference{File: name, What: what + ": header damaged"})
			continue
		}
		n := 0
		for _, t := range slices.Sorted(maps.Keys(want.Tensors)) {
			if x, ok := f.Tensors[t]; ok && tensorDigest(x) != want.Tensors[t] {
				diffs = append(diffs, Difference{File: name, Tensor: t, What: what})
				n++
			}
		}
		if n == 0 {
			diffs = append(diffs, Difference{File: name, What: what + ": header or metadata"})
		}
	}
	return diffs
}
