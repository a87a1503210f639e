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
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// archive is a dataset file published at a URL with a known md5: a
// tarball extracted after the download, or (raw) a file used as it is.
type archive struct {
	name string // file name it is saved as in the destination
	url  string
	md5  string // lowercase hex
	raw  bool   // not a tarball: nothing to extract
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

// netTimeouts bound each stage of a download, so that an unreachable
// network or a silent server is reported within seconds rather than after
// the operating system's minutes-long TCP timeouts. Variables so that tests
// can shorten them.
var netTimeouts = struct {
	dial   time.Duration // connecting (TCP and TLS handshake)
	header time.Duration // from sending the request to the response headers
	idle   time.Duration // longest wait for the next bytes of the body
}{dial: 5 * time.Second, header: 10 * time.Second, idle: 10 * time.Second}

// dialContext opens connections for downloads; tests replace it to play a
// network that never answers.
var dialContext = (&net.Dialer{}).DialContext

// downloadClient is the HTTP client of downloads: proxies from the
// environment, netTimeouts.dial on each connection. The header and idle
// deadlines are a watchdog on the request (see download).
func downloadClient() *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		dctx, cancel := context.WithTimeout(ctx, netTimeouts.dial)
		defer cancel()
		c, err := dialContext(dctx, network, addr)
		if err != nil && ctx.Err() == nil && errors.Is(dctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("no connection to %s within %v (is the network reachable?)", addr, netTimeouts.dial)
		}
		return c, err
	}
	return &http.Client{Transport: &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         dial,
		TLSHandshakeTimeout: netTimeouts.dial,
		ForceAttemptHTTP2:   true,
	}}
}

// stalled is the cause with which the watchdog cancels a request.
type stalled struct {
	what  string // "response headers", "the next bytes"
	after time.Duration
	bytes int64 // body bytes read before
}

func (s *stalled) Error() string {
	if s.bytes > 0 {
		return fmt.Sprintf("the server sent no data for %v after %d bytes", s.after, s.bytes)
	}
	return fmt.Sprintf("the server accepted the connection but sent no %s within %v", s.what, s.after)
}

// watchdog cancels a request when no progress is reported for its current
// deadline: netTimeouts.header until the headers, then netTimeouts.idle
// between reads of the body.
type watchdog struct {
	cancel context.CancelCauseFunc
	timer  *time.Timer
	mu     sync.Mutex // guards cause: fire runs on the timer's goroutine
	cause  stalled
}

func newWatchdog(cancel context.CancelCauseFunc) *watchdog {
	w := &watchdog{cancel: cancel, cause: stalled{what: "response headers", after: netTimeouts.header}}
	w.timer = time.AfterFunc(netTimeouts.header, w.fire)
	return w
}

func (w *watchdog) fire() {
	w.mu.Lock()
	c := w.cause
	w.mu.Unlock()
	w.cancel(&c)
}

// progress moves the deadline on after n more body bytes.
func (w *watchdog) progress(n int) {
	w.timer.Stop()
	w.mu.Lock()
	w.cause = stalled{what: "bytes", after: netTimeouts.idle, bytes: w.cause.bytes + int64(n)}
	w.mu.Unlock()
	w.timer.Reset(netTimeouts.idle)
}

func (w *watchdog) stop() { w.timer.Stop() }

// watchedReader reports each read to its watchdog.
type watchedReader struct {
	r io.Reader
	w *watchdog
}

func (r watchedReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.w.progress(n)
	}
	return n, err
}

// DownloadCIFAR10 downloads the official cifar-10-binary.tar.gz into
// destDir, checks its md5 and extracts it there, giving
// destDir/cifar-10-batches-bin/ (which LoadCIFAR10(destDir) accepts). A
// byte progress bar is written to progress (nil: none). A tarball already
// in destDir with the right md5 is not downloaded again. Cancelling ctx
// stops the download; a failed or cancelled download leaves no partial file.
func DownloadCIFAR10(ctx context.Context, destDir string, progress io.Writer) error {
	return fetchArchive(ctx, cifar10Archive, destDir, progress)
}

// DownloadPTB downloads ptb.train.txt, ptb.valid.txt and ptb.test.txt
// into destDir and checks their md5s (which LoadPTB(destDir) then reads).
// Progress, caching and cancellation behave as in [DownloadCIFAR10].
func DownloadPTB(ctx context.Context, destDir string, progress io.Writer) error {
	for _, a := range PTBSet.archives {
		if err := fetchArchive(ctx, *a, destDir, progress); err != nil {
			return err
		}
	}
	return nil
}

// DownloadCIFAR100 is DownloadCIFAR10 for cifar-100-binary.tar.gz, giving
// destDir/cifar-100-binary/ (which LoadCIFAR100(destDir, …) accepts).
func DownloadCIFAR100(ctx context.Context, destDir string, progress io.Writer) error {
	return fetchArchive(ctx, cifar100Archive, destDir, progress)
}

// fetchArchive downloads a (unless already present and intact) and, for
// a tarball, extracts it into destDir.
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
	if a.raw {
		return nil
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

	reqCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	dog := newWatchdog(cancel)
	defer dog.stop()
	// failed prefers the caller's cancellation, then the watchdog's cause,
	// to the transport's wording of the same event.
	failed := func(err error) error {
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = ctxErr
		} else if cause := context.Cause(reqCtx); cause != nil && !errors.Is(cause, context.Canceled) {
			err = cause
		}
		return fmt.Errorf("datasets: download %s: %w", a.url, err)
	}
	req, err := http.NewRequestWithContext(reqCtx, http.MethodGet, a.url, nil)
	if err != nil {
		return fmt.Errorf("datasets: download %s: %w", a.url, err)
	}
	resp, err := downloadClient().Do(req)
	if err != nil {
		if uerr := (*url.Error)(nil); errors.As(err, &uerr) {
			err = uerr.Err // the URL is said once, by failed
		}
		return failed(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("datasets: download %s: %s", a.url, resp.Status)
	}
	dog.progress(0)

	bar := newByteBar(resp.ContentLength, a.name, progress)
	hash := md5.New()
	_, err = io.Copy(io.MultiWriter(tmp, hash, bar), watchedReader{resp.Body, dog})
	bar.Finish() //nolint:errcheck // a progress display failing is not a download failure
	if err != nil {
		return failed(err)
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

// byteProgress shows a download's progress as bytes are written to it.
type byteProgress interface {
	io.Writer
	Finish() error
}

// newByteBar is a byte-counting progress display on w (nil: none); total
// -1 means the server sent no Content-Length. A terminal gets a redrawn
// bar; anything else (a log file, a pipe, a buffer) plain lines.
func newByteBar(total int64, name string, w io.Writer) byteProgress {
	if w != nil && !isTerminal(w) {
		return &lineProgress{w: w, name: name, total: total}
	}
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

// isTerminal says whether w is a character device (a terminal), without
// a dependency: anything else gets no carriage-return redraws.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// lineProgress writes "name: 10% of 163.0 MB" at each tenth of a known
// size (each 16 MB of an unknown one) and a last line when finished.
type lineProgress struct {
	w           io.Writer
	name        string
	total, done int64
	next        int64 // bytes at which the next line is due
}

// lineProgressStep is the reporting step of a download of unknown size.
const lineProgressStep = 16 << 20

func (p *lineProgress) step() int64 {
	if p.total > 0 {
		return max(p.total/10, 1)
	}
	return lineProgressStep
}

func (p *lineProgress) Write(b []byte) (int, error) {
	if p.next == 0 {
		p.next = p.step()
	}
	p.done += int64(len(b))
	if p.done >= p.next && (p.total <= 0 || p.done < p.total) {
		p.line() // one line however many steps this write crossed
		for p.next <= p.done {
			p.next += p.step()
		}
	}
	return len(b), nil
}

func (p *lineProgress) line() {
	if p.total > 0 {
		fmt.Fprintf(p.w, "%s: %d%% of %s\n", p.name, p.done*100/p.total, megabytes(p.total))
	} else {
		fmt.Fprintf(p.w, "%s: %s\n", p.name, megabytes(p.done))
	}
}

func (p *lineProgress) Finish() error {
	fmt.Fprintf(p.w, "%s: %s done\n", p.name, megabytes(p.done))
	return nil
}

func megabytes(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

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
