package datasets

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// DataEnv is the environment variable naming a data directory: CIFAR-10 is
// looked for in $SPARGO_DATA and $SPARGO_DATA/cifar10.
const DataEnv = "SPARGO_DATA"

// sharedCIFAR10 is the project's shared copy, relative to a directory that
// holds the shared/ folder.
var sharedCIFAR10 = filepath.Join("shared", "data", "cifar10", "approx")

// parentLevels is how many parents of the working directory are searched for
// shared/data/cifar10/approx: enough for `go test` from a package two or
// three levels below the project root.
const parentLevels = 3

// searchStep is one place FindCIFAR10 looks, with where the place came from.
type searchStep struct {
	origin string // e.g. "$SPARGO_DATA"
	dir    string // "" when the origin is not set
}

// cifar10SearchPath lists, in order, the places FindCIFAR10 looks when no
// explicit directory is given.
func cifar10SearchPath() []searchStep {
	var steps []searchStep
	if env := os.Getenv(DataEnv); env != "" {
		steps = append(steps,
			searchStep{"$" + DataEnv, env},
			searchStep{"$" + DataEnv, filepath.Join(env, "cifar10")})
	} else {
		steps = append(steps, searchStep{"$" + DataEnv + " (not set)", ""})
	}
	seen := map[string]bool{}
	addRelative := func(rel string) {
		abs, err := filepath.Abs(rel)
		if err != nil || seen[abs] {
			return
		}
		seen[abs] = true
		steps = append(steps, searchStep{"working directory", abs})
	}
	addRelative(filepath.Join("..", sharedCIFAR10))
	up := "."
	for range parentLevels + 1 {
		addRelative(filepath.Join(up, sharedCIFAR10))
		up = filepath.Join(up, "..")
	}
	if cache, err := cifar10CacheDir(); err == nil {
		steps = append(steps, searchStep{"user cache", cache})
	} else {
		steps = append(steps, searchStep{"user cache (" + err.Error() + ")", ""})
	}
	return steps
}

// cifar10CacheDir is os.UserCacheDir()/spargo/cifar10, where EnsureCIFAR10
// downloads to.
func cifar10CacheDir() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(cache, "spargo", "cifar10"), nil
}

// FindCIFAR10 returns a directory holding CIFAR-10 batch files, for
// LoadCIFAR10. A non-empty explicit directory (a -data flag) must hold
// them; otherwise it looks in $SPARGO_DATA, $SPARGO_DATA/cifar10,
// ../shared/data/cifar10/approx and shared/data/cifar10/approx in the
// working directory and its parents, and os.UserCacheDir()/spargo/cifar10,
// and returns the first that does. The error lists every place looked at.
func FindCIFAR10(explicit string) (string, error) {
	if explicit != "" {
		if _, err := findCIFAR10Layout(explicit); err != nil {
			return "", fmt.Errorf("datasets: -data %s: %w", explicit, err)
		}
		return explicit, nil
	}
	var tried []string
	for _, s := range cifar10SearchPath() {
		if s.dir == "" {
			tried = append(tried, s.origin)
			continue
		}
		if _, err := findCIFAR10Layout(s.dir); err == nil {
			return s.dir, nil
		}
		tried = append(tried, s.dir+" ("+s.origin+")")
	}
	return "", fmt.Errorf("datasets: CIFAR-10 not found (looked for data_batch_*.bin and test_batch.bin, also under %s/, in: %s); pass -data DIR, set $%s, or download with EnsureCIFAR10",
		cifar10Subdir, strings.Join(tried, "; "), DataEnv)
}

// EnsureCIFAR10 returns FindCIFAR10(explicit) and, when explicit is empty
// and CIFAR-10 is nowhere on the search path, downloads the official
// tarball into os.UserCacheDir()/spargo/cifar10 (progress to progress,
// which may be nil) and returns that directory. An explicit directory
// without the data is an error, never a download.
func EnsureCIFAR10(ctx context.Context, explicit string, progress io.Writer) (string, error) {
	dir, findErr := FindCIFAR10(explicit)
	if findErr == nil || explicit != "" {
		return dir, findErr
	}
	cache, err := cifar10CacheDir()
	if err != nil {
		return "", fmt.Errorf("%w; and no cache directory to download to: %v", findErr, err)
	}
	if err := DownloadCIFAR10(ctx, cache, progress); err != nil {
		return "", err
	}
	if _, err := findCIFAR10Layout(cache); err != nil {
		return "", fmt.Errorf("datasets: after download: %w", err)
	}
	return cache, nil
}
