package datasets

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// isolate gives the test an empty environment: $SPARGO_DATA unset, the user
// cache in a fresh directory (returned), and every download of every set
// pointed at a loopback server that answers 404 and counts the requests.
func isolate(t *testing.T) (cache string, requests *atomic.Int32) {
	t.Helper()
	t.Setenv(DataEnv, "")
	cache = t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache) // os.UserCacheDir on Unix
	t.Setenv("HOME", cache)           // and on macOS
	requests = new(atomic.Int32)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	for _, d := range []*Dataset{CIFAR10Set, CIFAR100Set, PTBSet, IMDBSet} {
		for _, a := range d.archives {
			saved := *a
			t.Cleanup(func() { *a = saved })
			a.url = srv.URL + "/" + a.name
		}
	}
	return cache, requests
}

// serveSet makes d's downloads succeed: archive i is bodies[i], with its md5.
func serveSet(t *testing.T, d *Dataset, bodies ...[]byte) {
	t.Helper()
	byPath := map[string][]byte{}
	for i, a := range d.archives {
		sum := md5.Sum(bodies[i])
		a.md5 = hex.EncodeToString(sum[:])
		byPath["/"+a.name] = bodies[i]
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := byPath[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	for _, a := range d.archives {
		a.url = srv.URL + "/" + a.name
	}
}

// copyTree copies the fixture src to dst (created).
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if e.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// tarTree is a .tar.gz of the fixture src with every entry under prefix/.
func tarTree(t *testing.T, src, prefix string) []byte {
	t.Helper()
	entries := []tarEntry{{name: prefix + "/", typ: tar.TypeDir}}
	err := filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
		if err != nil || p == src {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		name := prefix + "/" + filepath.ToSlash(rel)
		if e.IsDir() {
			entries = append(entries, tarEntry{name: name + "/", typ: tar.TypeDir})
			return nil
		}
		b, err := os.ReadFile(p)
		entries = append(entries, tarEntry{name: name, data: b, typ: tar.TypeReg})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return makeTarGz(t, entries)
}

func TestFindSearchOrder(t *testing.T) {
	for _, c := range []struct {
		name string
		set  *Dataset
		// layout places the fixture under root and returns the directory
		// Find must return; env is what $SPARGO_DATA is set to ("": unset,
		// "ROOT": root).
		layout   func(root string) string
		env      string
		explicit func(root string) string
	}{
		{name: "explicit CIFAR-10 directory", set: CIFAR10Set,
			layout:   func(r string) string { return place(t, cifar10Fixture, r, "mine") },
			explicit: func(r string) string { return filepath.Join(r, "mine") }},
		{name: "explicit directory holding the tarball's layout", set: CIFAR10Set,
			layout:   func(r string) string { return place(t, cifar10Fixture, r, "mine", cifar10Subdir) },
			explicit: func(r string) string { return filepath.Join(r, "mine") }},
		{name: "explicit text file", set: TextCorpus("wiki"),
			layout:   func(r string) string { return place(t, ptbFixture, r, "wiki") + "/ptb.train.txt" },
			explicit: func(r string) string { return filepath.Join(r, "wiki", "ptb.train.txt") }},
		{name: "root/cifar10 holding the batches", set: CIFAR10Set, env: "ROOT",
			layout: func(r string) string { return place(t, cifar10Fixture, r, "cifar10") }},
		{name: "root/cifar10/cifar-10-batches-bin", set: CIFAR10Set, env: "ROOT",
			layout: func(r string) string { return place(t, cifar10Fixture, r, "cifar10", cifar10Subdir) }},
		{name: "root/cifar10/approx (a named copy)", set: CIFAR10Set, env: "ROOT",
			layout: func(r string) string {
				os.MkdirAll(filepath.Join(r, "cifar10", "exact-partial"), 0o755) // holds other names: passed over
				return place(t, cifar10Fixture, r, "cifar10", "approx")
			}},
		{name: "root/ptb", set: PTBSet, env: "ROOT",
			layout: func(r string) string { return place(t, ptbFixture, r, "ptb") }},
		{name: "root/ptb/simple-examples/data", set: PTBSet, env: "ROOT",
			layout: func(r string) string { return place(t, ptbFixture, r, "ptb", "simple-examples", "data") }},
		{name: "root/aclImdb", set: IMDBSet, env: "ROOT",
			layout: func(r string) string { return place(t, aclImdbFixture, r, "aclImdb") }},
		{name: "root/aclImdb/aclImdb (extracted in place)", set: IMDBSet, env: "ROOT",
			layout: func(r string) string { return place(t, aclImdbFixture, r, "aclImdb", "aclImdb") }},
		{name: "root/wiki text corpus", set: TextCorpus("wiki"), env: "ROOT",
			layout: func(r string) string { return place(t, ptbFixture, r, "wiki") }},
		{name: "$SPARGO_DATA naming the set's own directory", set: CIFAR10Set, env: "ROOT/mine",
			layout: func(r string) string { return place(t, cifar10Fixture, r, "mine", cifar10Subdir) }},
		{name: "$SPARGO_DATA root without the set: the cache", set: PTBSet, env: "ROOT/data",
			layout: func(r string) string {
				place(t, cifar10Fixture, r, "data", "cifar10")
				return place(t, ptbFixture, r, "cache", "spargo", "ptb")
			}},
		{name: "the user cache", set: CIFAR10Set,
			layout: func(r string) string { return place(t, cifar10Fixture, r, "cache", "spargo", "cifar10", cifar10Subdir) }},
		{name: "the user cache, CIFAR-100's layout", set: CIFAR100Set,
			layout: func(r string) string {
				return writeCIFAR100(t, filepath.Join(r, "cache", "spargo", "cifar100", cifar100Subdir))
			}},
		{name: "explicit wins over $SPARGO_DATA", set: CIFAR10Set, env: "ROOT",
			layout: func(r string) string {
				place(t, cifar10Fixture, r, "cifar10")
				return place(t, cifar10Fixture, r, "mine")
			},
			explicit: func(r string) string { return filepath.Join(r, "mine") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, requests := isolate(t)
			root := t.TempDir()
			t.Setenv("XDG_CACHE_HOME", filepath.Join(root, "cache"))
			want := c.layout(root)
			if c.env != "" {
				t.Setenv(DataEnv, strings.Replace(c.env, "ROOT", root, 1))
			}
			explicit := ""
			if c.explicit != nil {
				explicit = c.explicit(root)
			}
			got, err := Find(context.Background(), c.set, explicit, nil)
			if err != nil || got != want {
				t.Fatalf("Find = %q, %v; want %q", got, err, want)
			}
			if n := requests.Load(); n != 0 {
				t.Errorf("%d download requests", n)
			}
		})
	}
}

// place copies the fixture to root/elem… and returns that directory.
func place(t *testing.T, fixture, root string, elem ...string) string {
	dir := filepath.Join(append([]string{root}, elem...)...)
	copyTree(t, fixture, dir)
	return dir
}

// writeCIFAR100 writes a one-record train.bin and test.bin into dir.
func writeCIFAR100(t *testing.T, dir string) string {
	writeRecords(t, filepath.Join(dir, cifar100TrainFile), []record{{[]byte{1, 2}, 1}})
	writeRecords(t, filepath.Join(dir, cifar100TestFile), []record{{[]byte{3, 4}, 2}})
	return dir
}

// Every set downloads into the user cache when nothing else has it, and
// its loader then reads what Find returned.
func TestFindDownloads(t *testing.T) {
	ptbFile := func(i int) []byte {
		b, err := os.ReadFile(filepath.Join(ptbFixture, PTBFiles[i]))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cifar100 := t.TempDir()
	writeCIFAR100(t, filepath.Join(cifar100, "src"))
	for _, c := range []struct {
		set    *Dataset
		bodies [][]byte
		load   func(dir string) error
	}{
		{CIFAR10Set, [][]byte{tarTree(t, cifar10Fixture, cifar10Subdir)}, func(dir string) error {
			_, _, err := LoadCIFAR10(dir)
			return err
		}},
		{CIFAR100Set, [][]byte{tarTree(t, filepath.Join(cifar100, "src"), cifar100Subdir)}, func(dir string) error {
			_, _, err := LoadCIFAR100(dir, true)
			return err
		}},
		{PTBSet, [][]byte{ptbFile(0), ptbFile(1), ptbFile(2)}, func(dir string) error {
			_, err := LoadPTB(dir)
			return err
		}},
		{IMDBSet, [][]byte{tarTree(t, aclImdbFixture, "aclImdb")}, func(dir string) error {
			_, err := LoadIMDB(context.Background(), dir, IMDBOptions{})
			return err
		}},
	} {
		t.Run(c.set.String(), func(t *testing.T) {
			cache, _ := isolate(t)
			serveSet(t, c.set, c.bodies...)
			var progress bytes.Buffer
			dir, err := Find(context.Background(), c.set, "", &progress)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(dir, filepath.Join(cache, "spargo", c.set.Name())) {
				t.Errorf("dir %q is not in the cache %s", dir, cache)
			}
			if err := c.load(dir); err != nil {
				t.Error(err)
			}
			for _, w := range []string{"not found", "downloading it into", c.set.archives[0].name} {
				if !strings.Contains(progress.String(), w) {
					t.Errorf("progress %q does not say %q", progress.String(), w)
				}
			}
			// Found in the cache from now on, without the network.
			if got, err := Lookup(c.set, ""); err != nil || got != dir {
				t.Errorf("Lookup after the download: %q, %v", got, err)
			}
		})
	}
}

// Nothing found and the download failing: one error naming every place,
// the download's failure, the flag, the variable and the URL.
func TestFindNotFoundError(t *testing.T) {
	cache, requests := isolate(t)
	root := t.TempDir()
	t.Setenv(DataEnv, root)
	_, err := Find(context.Background(), CIFAR10Set, "", nil)
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("error %v is not ErrNotFound", err)
	}
	cacheDir := filepath.Join(cache, "spargo", "cifar10")
	for _, w := range []string{
		"CIFAR-10 not found and the download failed",
		"$SPARGO_DATA: " + filepath.Join(root, "cifar10") + ": does not exist",
		"user cache: " + cacheDir + ": does not exist",
		"\n  download " + CIFAR10Set.archives[0].url + ": 404 Not Found\n",
		"pass -data DIR", "set SPARGO_DATA=ROOT where ROOT/cifar10/ holds it",
		"fetch " + CIFAR10Set.archives[0].url + " by hand and extract it into " + cacheDir,
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not say %q:\n%v", w, err)
		}
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("%d download requests, want 1", n)
	}

	// Lookup and an explicit directory never download.
	t.Setenv(DataEnv, "")
	if _, err := Lookup(PTBSet, ""); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "$SPARGO_DATA: not set") {
		t.Errorf("Lookup: %v", err)
	}
	empty := t.TempDir()
	_, err = Find(context.Background(), PTBSet, empty, nil)
	for _, w := range []string{"-data: " + empty + ": no ptb.train.txt, ptb.valid.txt, ptb.test.txt", "leave -data out", ptbArchives[0].url} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("explicit empty dir: error does not say %q:\n%v", w, err)
		}
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("%d download requests after Lookup and -data, want still 1", n)
	}

	// A set without a download says so by giving no URL and no download error.
	_, err = Find(context.Background(), TextCorpus("wiki"), "", nil)
	if err == nil || strings.Contains(err.Error(), "download") || !strings.Contains(err.Error(), "ROOT/wiki/") {
		t.Errorf("text corpus: %v", err)
	}
}

// A $SPARGO_DATA that does not exist is an error at once: no fall-through
// to the cache or a download.
func TestFindDataEnvTypo(t *testing.T) {
	cache, requests := isolate(t)
	place(t, cifar10Fixture, cache, "spargo", "cifar10") // would be found next
	typo := filepath.Join(t.TempDir(), "dtaa")
	t.Setenv(DataEnv, typo)
	_, err := Find(context.Background(), CIFAR10Set, "", nil)
	if err == nil || errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "$SPARGO_DATA="+typo) || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("error %v", err)
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("%d download requests", n)
	}
}

func TestDatasetURLs(t *testing.T) {
	for _, d := range []*Dataset{CIFAR10Set, CIFAR100Set, PTBSet, IMDBSet} {
		if len(d.URLs()) == 0 {
			t.Errorf("%s has no download", d)
		}
		for _, a := range d.archives {
			if !strings.HasPrefix(a.url, "https://") || len(a.md5) != 32 {
				t.Errorf("%s: %s md5 %q", d, a.url, a.md5)
			}
		}
	}
	if len(TextCorpus("x").URLs()) != 0 {
		t.Error("a text corpus has a download")
	}
}
