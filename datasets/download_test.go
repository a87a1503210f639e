package datasets

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// These tests download only from an httptest server on loopback.

type tarEntry struct {
	name string
	data []byte
	typ  byte
}

func makeTarGz(t *testing.T, entries []tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), Typeflag: e.typ}
		switch e.typ {
		case tar.TypeDir:
			hdr.Mode, hdr.Size = 0o755, 0
		case tar.TypeSymlink:
			hdr.Linkname, hdr.Size = "/etc/passwd", 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write(e.data); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// fakeCIFAR10Tarball is a small tarball in the official layout.
func fakeCIFAR10Tarball(t *testing.T) []byte {
	rec := func(label byte) []byte { return append([]byte{label}, recordPixels(label)...) }
	return makeTarGz(t, []tarEntry{
		{name: "cifar-10-batches-bin/", typ: tar.TypeDir},
		{name: "cifar-10-batches-bin/data_batch_1.bin", data: append(rec(1), rec(2)...), typ: tar.TypeReg},
		{name: "cifar-10-batches-bin/data_batch_2.bin", data: rec(3), typ: tar.TypeReg},
		{name: "cifar-10-batches-bin/test_batch.bin", data: rec(4), typ: tar.TypeReg},
		{name: "cifar-10-batches-bin/batches.meta.txt", data: []byte(strings.Join(cifar10ClassNames, "\n") + "\n\n"), typ: tar.TypeReg},
	})
}

// serveArchive serves body at /file.tar.gz on loopback and points
// cifar10Archive at it with the given md5 (body's own when empty).
func serveArchive(t *testing.T, body []byte, sum string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	if sum == "" {
		s := md5.Sum(body)
		sum = hex.EncodeToString(s[:])
	}
	saved := cifar10Archive
	t.Cleanup(func() { cifar10Archive = saved })
	cifar10Archive = archive{name: saved.name, url: srv.URL + "/file.tar.gz", md5: sum}
	return srv
}

func TestDownloadCIFAR10(t *testing.T) {
	serveArchive(t, fakeCIFAR10Tarball(t), "")
	dest := t.TempDir()
	var progress bytes.Buffer
	if err := DownloadCIFAR10(context.Background(), dest, &progress); err != nil {
		t.Fatal(err)
	}
	// Not a terminal: plain lines, no carriage-return redraws.
	if got := progress.String(); !strings.HasSuffix(got, "cifar-10-binary.tar.gz: 0.0 MB done\n") || strings.Contains(got, "\r") {
		t.Errorf("progress output %q", got)
	}
	train, test, err := LoadCIFAR10(dest)
	if err != nil {
		t.Fatal(err)
	}
	if train.N != 3 || test.N != 1 || train.Labels[2] != 3 || test.Labels[0] != 4 {
		t.Errorf("train %v test %v", train.Labels, test.Labels)
	}
	if want := "CIFAR-10 train: 3 records from data_batch_1.bin, data_batch_2.bin (batches 3-5 not present)"; train.Summary != want {
		t.Errorf("Summary = %q, want %q", train.Summary, want)
	}
	// A second call finds the intact tarball and does not download again.
	cifar10Archive.url = "http://127.0.0.1:1/unreachable"
	if err := DownloadCIFAR10(context.Background(), dest, nil); err != nil {
		t.Errorf("second call with the tarball present: %v", err)
	}
}

func TestLineProgress(t *testing.T) {
	for _, c := range []struct {
		total  int64
		writes []int
		want   string
	}{
		{100, []int{5, 5, 25, 65}, "f: 10% of 0.0 MB\nf: 35% of 0.0 MB\nf: 0.0 MB done\n"},
		{-1, []int{lineProgressStep - 1, 1, 2 * lineProgressStep}, "f: 16.8 MB\nf: 50.3 MB\nf: 50.3 MB done\n"},
	} {
		var b bytes.Buffer
		p := newByteBar(c.total, "f", &b)
		for _, n := range c.writes {
			p.Write(make([]byte, n))
		}
		p.Finish()
		if b.String() != c.want {
			t.Errorf("total %d: %q, want %q", c.total, b.String(), c.want)
		}
	}
}

func TestDownloadMD5Mismatch(t *testing.T) {
	const wrong = "00000000000000000000000000000000"
	serveArchive(t, fakeCIFAR10Tarball(t), wrong)
	dest := t.TempDir()
	err := DownloadCIFAR10(context.Background(), dest, nil)
	if err == nil {
		t.Fatal("no error")
	}
	for _, w := range []string{"cifar-10-binary.tar.gz", "expected " + wrong, "got "} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
	if left, _ := os.ReadDir(dest); len(left) != 0 {
		t.Errorf("files left after a failed download: %v", left)
	}
}

func TestDownloadRefusesUnsafeEntries(t *testing.T) {
	for _, e := range []tarEntry{
		{name: "../escape.bin", data: []byte("x"), typ: tar.TypeReg},
		{name: "/abs.bin", data: []byte("x"), typ: tar.TypeReg},
		{name: "cifar-10-batches-bin/link", typ: tar.TypeSymlink},
	} {
		serveArchive(t, makeTarGz(t, []tarEntry{e}), "")
		root := t.TempDir()
		dest := filepath.Join(root, "dest")
		err := DownloadCIFAR10(context.Background(), dest, nil)
		if err == nil || !strings.Contains(err.Error(), e.name) {
			t.Errorf("entry %q: error %v", e.name, err)
		}
		if _, err := os.Stat(filepath.Join(root, "escape.bin")); err == nil {
			t.Errorf("entry %q escaped the destination", e.name)
		}
	}
}

func TestDownloadCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1000000")
		w.Write(make([]byte, 1000))
		w.(http.Flusher).Flush()
		cancel()             // the client gives up mid-body
		<-r.Context().Done() // and the server sees the connection go
	}))
	defer srv.Close()
	saved := cifar10Archive
	defer func() { cifar10Archive = saved }()
	cifar10Archive.url = srv.URL
	dest := t.TempDir()
	err := DownloadCIFAR10(ctx, dest, nil)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want context.Canceled", err)
	}
	if left, _ := os.ReadDir(dest); len(left) != 0 {
		t.Errorf("files left after a cancelled download: %v", left)
	}
}

func TestEnsureCIFAR10Downloads(t *testing.T) {
	serveArchive(t, fakeCIFAR10Tarball(t), "")
	t.Setenv(DataEnv, "")
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache) // os.UserCacheDir on Unix
	t.Setenv("HOME", cache)           // and on macOS
	dir, err := EnsureCIFAR10(context.Background(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(cache, "spargo", "cifar10", cifar10Subdir)
	if dir != want {
		t.Errorf("dir = %q, want %q", dir, want)
	}
	// Now FindCIFAR10 finds the cache without downloading.
	if got, err := FindCIFAR10(""); err != nil || got != want {
		t.Errorf("FindCIFAR10 after download: %q, %v", got, err)
	}
	// An explicit directory without data is an error, not a download.
	if _, err := EnsureCIFAR10(context.Background(), t.TempDir(), nil); err == nil {
		t.Error("explicit empty dir: no error")
	}
}

// setCIFAR10URL points the CIFAR-10 download at url for one test.
func setCIFAR10URL(t *testing.T, url string) {
	saved := cifar10Archive
	t.Cleanup(func() { cifar10Archive = saved })
	cifar10Archive.url = url
}

// downloadFails downloads CIFAR-10 and wants an error saying want, with
// nothing left in the destination.
func downloadFails(t *testing.T, want string) {
	t.Helper()
	dest := t.TempDir()
	err := DownloadCIFAR10(context.Background(), dest, nil)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error %v, want one saying %q", err, want)
	}
	if left, _ := os.ReadDir(dest); len(left) != 0 {
		t.Errorf("files left: %v", left)
	}
}

// shortTimeouts makes the network deadlines short for one test.
func shortTimeouts(t *testing.T) {
	saved := netTimeouts
	t.Cleanup(func() { netTimeouts = saved })
	netTimeouts.dial, netTimeouts.header, netTimeouts.idle = 100*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
}

// A network where connecting never completes (a dropped SYN): the dial
// deadline says so, instead of the system's minutes-long TCP timeout.
func TestDownloadDialTimeout(t *testing.T) {
	shortTimeouts(t)
	saved := dialContext
	t.Cleanup(func() { dialContext = saved })
	dialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		<-ctx.Done() // a connection attempt that is never answered
		return nil, ctx.Err()
	}
	setCIFAR10URL(t, "http://127.0.0.1:9/cifar-10-binary.tar.gz") // loopback: no proxy; the fake dialContext answers
	downloadFails(t, "no connection to 127.0.0.1:9 within 100ms")
}

// A server that accepts the connection and never answers.
func TestDownloadHeaderTimeout(t *testing.T) {
	shortTimeouts(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() }) // held open, never written to
		}
	}()
	setCIFAR10URL(t, "http://"+ln.Addr().String()+"/cifar-10-binary.tar.gz")
	downloadFails(t, "accepted the connection but sent no response headers within 200ms")
}

// A server that stops sending in the middle of the body.
func TestDownloadIdleTimeout(t *testing.T) {
	shortTimeouts(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1000000")
		w.Write(make([]byte, 1000))
		w.(http.Flusher).Flush()
		<-r.Context().Done() // silent until the client gives up
	}))
	t.Cleanup(srv.Close)
	setCIFAR10URL(t, srv.URL+"/cifar-10-binary.tar.gz")
	downloadFails(t, "the server sent no data for 200ms after 1000 bytes")
}
