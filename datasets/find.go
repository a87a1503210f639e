package datasets

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// DataEnv is the environment variable naming a data root: a directory
// holding cifar10/, cifar100/, ptb/, aclImdb/ and text corpora, each the
// directory of one data set. For compatibility it may also name one data
// set's directory directly.
const DataEnv = "SPARGO_DATA"

// DataFlag is the command-line flag through which every spargo program
// takes a data set's directory; messages tell users to pass it.
const DataFlag = "-data"

// ErrNotFound is matched (errors.Is) by the error of [Find] and [Lookup]
// when a data set is not where it was looked for.
var ErrNotFound = errors.New("data set not found")

// Place is one place a data set was looked for, and why it was not used.
type Place struct {
	Origin string // "-data", "$SPARGO_DATA", "$SPARGO_DATA (the set's own directory)", "user cache"
	Dir    string // "" when the origin gave no directory
	Reason string // why the data was not there
}

func (p Place) String() string {
	if p.Dir == "" {
		return p.Origin + ": " + p.Reason
	}
	return p.Origin + ": " + p.Dir + ": " + p.Reason
}

// NotFoundError is the error of [Find] and [Lookup]: every place looked at,
// the download's failure (nil when none was tried) and what to do.
type NotFoundError struct {
	Set      *Dataset
	Tried    []Place
	Explicit bool   // the directory came from -data; nothing else was tried
	CacheDir string // where a download goes, "" when there is no cache
	Download error  // nil when no download was tried
}

func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

func (e *NotFoundError) Unwrap() error { return e.Download }

// Error is several lines: what was missing, where it was looked for, the
// download's failure, and the flag, variable and URLs that fix it.
func (e *NotFoundError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "datasets: %s not found", e.Set)
	if e.Download != nil {
		b.WriteString(" and the download failed")
	}
	fmt.Fprintf(&b, "\n  looked for %s in:", e.Set.holds)
	for _, p := range e.Tried {
		b.WriteString("\n    " + p.String())
	}
	if e.Download != nil {
		// The download's own errors start "datasets: download URL: ".
		fmt.Fprintf(&b, "\n  %s", strings.TrimPrefix(e.Download.Error(), "datasets: "))
	}
	b.WriteString("\n  to fix:")
	if e.Explicit {
		fmt.Fprintf(&b, " pass %s the %s directory, or leave %s out to search $%s and the user cache", DataFlag, e.Set, DataFlag, DataEnv)
	} else {
		fmt.Fprintf(&b, " pass %s DIR (the %s directory), or set %s=ROOT where ROOT/%s/ holds it", DataFlag, e.Set, DataEnv, e.Set.name)
	}
	if urls := e.Set.URLs(); len(urls) > 0 {
		where := "DIR"
		if e.CacheDir != "" && !e.Explicit {
			where = e.CacheDir
		}
		fmt.Fprintf(&b, ";\n    or fetch %s by hand and %s %s", strings.Join(urls, " "), e.Set.fetchHint, where)
	}
	return b.String()
}

// cacheDir is os.UserCacheDir()/spargo/<name>, where downloads go.
func (d *Dataset) cacheDir() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(cache, "spargo", d.name), nil
}

// Lookup is [Find] without the download: it returns the directory holding
// d's data, from explicit or the search path, or a [NotFoundError]. It
// never touches the network.
func Lookup(d *Dataset, explicit string) (string, error) {
	dir, nf, err := lookup(d, explicit)
	if err != nil {
		return "", err
	}
	if nf != nil {
		return "", nf
	}
	return dir, nil
}

// Find returns the directory holding d's data; it is the one way every
// spargo program finds its data. The search order:
//
//  1. explicit (a -data flag), when not empty: it must hold the data
//     (directly, in the official archive's layout, or in a subdirectory);
//     nothing else is tried, and nothing is downloaded;
//  2. $SPARGO_DATA/<name> (e.g. $SPARGO_DATA/cifar10, also its archive
//     layout and subdirectories such as cifar10/approx), then $SPARGO_DATA
//     itself as the set's own directory. A $SPARGO_DATA that does not
//     exist is an error at once, not passed over;
//  3. os.UserCacheDir()/spargo/<name> (~/.cache/spargo/cifar10 on Linux);
//  4. a download of the official files into that cache directory, with
//     a line saying so and a progress bar on progress (nil: silent), each
//     file's md5 checked. Connecting gives up after a few seconds and a
//     server that stops answering after about ten.
//
// When all fail the [NotFoundError] lists every place, the download's
// error, and the flag, variable and URLs to set or fetch.
func Find(ctx context.Context, d *Dataset, explicit string, progress io.Writer) (string, error) {
	dir, nf, err := lookup(d, explicit)
	if err != nil {
		return "", err
	}
	if nf == nil {
		return dir, nil
	}
	if nf.Explicit || len(d.archives) == 0 || nf.CacheDir == "" {
		return "", nf
	}
	if progress != nil {
		fmt.Fprintf(progress, "datasets: %s not found (%s); downloading it into %s\n", d, placeList(nf.Tried), nf.CacheDir)
	}
	for _, a := range d.archives {
		if err := fetchArchive(ctx, *a, nf.CacheDir, progress); err != nil {
			nf.Download = err
			return "", nf
		}
	}
	dir, err = d.resolve(nf.CacheDir, true)
	if err != nil {
		nf.Download = fmt.Errorf("after the download, %s: %v", nf.CacheDir, err)
		return "", nf
	}
	return dir, nil
}

// placeList is the places as one line, for the download notice.
func placeList(ps []Place) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.Origin + " " + p.Dir
		if p.Dir == "" {
			s[i] = p.Origin + " (" + p.Reason + ")"
		}
	}
	return "looked in " + strings.Join(s, ", ")
}

// lookup searches without downloading: the data's directory, or a
// NotFoundError (with CacheDir set when there is a cache), or an error
// that stops the search (a $SPARGO_DATA that does not exist).
func lookup(d *Dataset, explicit string) (string, *NotFoundError, error) {
	nf := &NotFoundError{Set: d}
	if explicit != "" {
		dir, err := d.resolve(explicit, true)
		if err == nil {
			return dir, nil, nil
		}
		nf.Explicit = true
		nf.Tried = []Place{{Origin: DataFlag, Dir: explicit, Reason: err.Error()}}
		return "", nf, nil
	}
	if root := os.Getenv(DataEnv); root == "" {
		nf.Tried = append(nf.Tried, Place{Origin: "$" + DataEnv, Reason: "not set"})
	} else {
		if _, err := os.Stat(root); err != nil {
			return "", nil, fmt.Errorf("datasets: $%s=%s: %w (it should name a data root holding %s/, or unset it to use the user cache)",
				DataEnv, root, err, d.name)
		}
		own := filepath.Join(root, d.name)
		dir, err := d.resolve(own, true)
		if err == nil {
			return dir, nil, nil
		}
		nf.Tried = append(nf.Tried, Place{Origin: "$" + DataEnv, Dir: own, Reason: err.Error()})
		if dir, err := d.resolve(root, false); err == nil {
			return dir, nil, nil
		}
		// That the root is not the set's own directory is not news: it
		// is not listed among the places.
	}
	cache, err := d.cacheDir()
	if err != nil {
		nf.Tried = append(nf.Tried, Place{Origin: "user cache", Reason: err.Error()})
		return "", nf, nil
	}
	dir, err := d.resolve(cache, true)
	if err == nil {
		return dir, nil, nil
	}
	nf.Tried = append(nf.Tried, Place{Origin: "user cache", Dir: cache, Reason: err.Error()})
	nf.CacheDir = cache
	return "", nf, nil
}

// FindCIFAR10 is Lookup(CIFAR10Set, explicit): the CIFAR-10 directory
// without a download. Kept for the callers written before [Find].
func FindCIFAR10(explicit string) (string, error) { return Lookup(CIFAR10Set, explicit) }

// EnsureCIFAR10 is Find(ctx, CIFAR10Set, explicit, progress). Kept for the
// callers written before [Find].
func EnsureCIFAR10(ctx context.Context, explicit string, progress io.Writer) (string, error) {
	return Find(ctx, CIFAR10Set, explicit, progress)
}

// FindPTB is Lookup(PTBSet, explicit): the PTB directory without a download.
// Kept for the callers written before [Find].
func FindPTB(explicit string) (string, error) { return Lookup(PTBSet, explicit) }
