package datasets

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/schollz/progressbar/v3"
)

// archive is a dataset tarball published at a URL with a known md5.
type archive struct {
	name string // file name the tarball is saved as in the destination
	url  string
	md5  string // lowercase hex
}

// The official tarballs. Variables, not constants, so that tests can point
// them at a loopback server.
var (
	cifar10Archive = archive{
		name: "cifar-10-binary.tar.gz",
		url:  "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
		md5:  "c32a1d4ab5d03f1284b67883e8d87530",
	}
	cifar100Archive = archive{
		name: "cifar-100-binary.tar.gz",
		url:  "https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz",
		md5:  "03b5dce01913d631647c71ecec9e9cb8",
	}
)

// progressRefresh limits how often the progress bar redraws.
const progressRefresh = 100 * time.Millisecond

// DownloadCIFAR10 downloads the official cifar-10-binary.tar.gz into
// destDir, checks its md5 and extracts it there, giving
// destDir/cifar-10-batches-bin/ (which LoadCIFAR10(destDir) accepts). A
// byte progress bar is written to progress (nil: none). A tarball already
// in destDir with the right md5 is not downloaded again. Cancelling ctx
// stops the download; a failed or cancelled download leaves no partial file.
func DownloadCIFAR10(ctx context.Context, destDir string, progress io.Writer) error {
	return fetchArchive(ctx, cifar10Archive, destDir, progress)
}

// DownloadCIFAR100 is DownloadCIFAR10 for cifar-100-binary.tar.gz, giving
// destDir/cifar-100-binary/ (which LoadCIFAR100(destDir, …) accepts).
func DownloadCIFAR100(ctx context.Context, destDir string, progress io.Writer) error {
	return fetchArchive(ctx, cifar100Archive, destDir, progress)
}

// fetchArchive downloads a (unless already present and intact) and
// extracts it into destDir.
func fetchArchive(ctx context.Context, a archive, destDir string, progress io.Writer) error {
	if err := os.MkdirAll(destDir, 0o755); err != nil {
		return fmt.Errorf("datasets: download %s: %w", a.name, err)
	}
	path := filepath.Join(destDir, a.name)
	if sum, err := fileMD5(path); err != nil || sum != a.md5 {
		if err := download(ctx, a, path, progress); err != nil {
			return err
		}
	}
	if err := extractTarGz(ctx, path, destDir); err != nil {
		return fmt.Errorf("datasets: extract %s: %w", path, err)
	}
	return nil
}

// download saves a.url to path through a temporary file in the same
// directory, renamed into place only once the md5 matches.
func download(ctx context.Context, a archive, path string, progress io.Writer) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), a.name+".part-*")
	if err != nil {
		return fmt.Errorf("datasets: download %s: %w", a.name, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.url, nil)
	if err != nil {
		return fmt.Errorf("datasets: download %s: %w", a.url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("datasets: download %s: %w", a.url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("datasets: download %s: %s", a.url, resp.Status)
	}

	bar := newByteBar(resp.ContentLength, a.name, progress)
	hash := md5.New()
	_, err = io.Copy(io.MultiWriter(tmp, hash, bar), resp.Body)
	bar.Finish() //nolint:errcheck // a progress display failing is not a download failure
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = ctxErr
		}
		return fmt.Errorf("datasets: download %s: %w", a.url, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("datasets: download %s: %w", a.name, err)
	}
	if got := hex.EncodeToString(hash.Sum(nil)); got != a.md5 {
		return fmt.Errorf("datasets: download %s: md5 mismatch for %s: expected %s, got %s", a.url, a.name, a.md5, got)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("datasets: download %s: %w", a.name, err)
	}
	return nil
}

// newByteBar is a byte-counting progress bar on w (nil: invisible); total
// -1 means the server sent no Content-Length.
func newByteBar(total int64, name string, w io.Writer) *progressbar.ProgressBar {
	if w == nil {
		return progressbar.NewOptions64(total, progressbar.OptionSetVisibility(false),
			progressbar.OptionSetWriter(io.Discard), progressbar.OptionSetSpinnerChangeInterval(0))
	}
	return progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(name),
		progressbar.OptionShowBytes(true),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(progressRefresh),
		progressbar.OptionSetSpinnerChangeInterval(0), // no redraw goroutine
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
	)
}

func fileMD5(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := md5.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// extractTarGz extracts directories and regular files of a .tar.gz into
// destDir. Entries whose names would land outside destDir (absolute, or
// climbing with ..) and links are refused: the archive comes from the
// network.
func extractTarGz(ctx context.Context, archivePath, destDir string) error {
	f, err := os.Open(archivePath)
	if err != nil {
		return err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	defer gz.Close()
	tr := tar.NewReader(gz)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if !filepath.IsLocal(hdr.Name) {
			return fmt.Errorf("entry %q would be written outside %s", hdr.Name, destDir)
		}
		target := filepath.Join(destDir, hdr.Name)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			if err := writeFile(target, tr); err != nil {
				return fmt.Errorf("entry %q: %w", hdr.Name, err)
			}
		case tar.TypeSymlink, tar.TypeLink:
			return fmt.Errorf("entry %q is a link; refusing it", hdr.Name)
		default:
			// Other entry types (pax headers are consumed by archive/tar;
			// devices, fifos) have no place in a dataset: skip them.
		}
	}
}

func writeFile(path string, r io.Reader) error {
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, r); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
