package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/optim"
)

// flipTensorByte flips one bit of the first byte of tensor name's data in the safetensors
// file at path, located through the file's own header.
func flipTensorByte(t *testing.T, path, name string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(b)
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &hdr); err != nil {
		t.Fatal(err)
	}
	var e struct {
		DataOffsets [2]int64 `json:"data_offsets"`
	}
	raw, ok := hdr[name]
	if !ok {
		t.Fatalf("%s has no tensor %q", path, name)
	}
	if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatal(err)
	}
	b[8+int64(n)+e.DataOffsets[0]] ^= 0x10
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func loadFresh(path string) error {
	model := net(2, 3)
	o2, _ := optim.NewSGD(nn.Parameters(model), optim.SGDConfig{LR: 0.1, Momentum: 0.9})
	_, err := Load(path, State{Model: model, Optimizer: o2, RNG: map[string]RandState{"loop": rand.NewPCG(0, 0)}}, Meta{Model: "net", Config: map[string]string{"lr": "0.1"}})
	return err
}

// One flipped bit in any file of a checkpoint makes Load refuse it, naming the file and the
// tensor; Verify and Diff find it too.
func TestCorruptCheckpointRefused(t *testing.T) {
	m, opt := filled(t, 3)
	intact := save(t, t.TempDir(), 0, m, opt, rand.NewPCG(1, 1), 1)
	if err := Verify(intact); err != nil {
		t.Fatalf("Verify of an intact checkpoint: %v", err)
	}
	files, err := Digests(intact)
	if err != nil || len(files) != 3 || len(files[modelFile].Tensors) != len(nn.Parameters(m))+len(nn.Buffers(m)) {
		t.Fatalf("recorded digests %v (%v)", files, err)
	}
	for _, tc := range []struct{ file, tensor string }{
		{modelFile, "3.weight"},
		{modelFile, "1.running_var"},
		{optimizerFile, "0.weight"},
		{rankFile(0), "rng/loop"},
	} {
		t.Run(tc.file+"/"+tc.tensor, func(t *testing.T) {
			path := save(t, t.TempDir(), 0, m, opt, rand.NewPCG(1, 1), 1)
			if names := tensorNames(t, filepath.Join(path, tc.file)); !strings.Contains(names, `"`+tc.tensor+`"`) {
				t.Fatalf("no tensor %q in %s: %s", tc.tensor, tc.file, names)
			}
			flipTensorByte(t, filepath.Join(path, tc.file), tc.tensor)
			err := loadFresh(path)
			if err == nil || !strings.Contains(err.Error(), filepath.Join(path, tc.file)+" is corrupt") || !strings.Contains(err.Error(), `tensor "`+tc.tensor+`"`) {
				t.Fatalf("Load: %v, want the file %s and tensor %q named", err, tc.file, tc.tensor)
			}
			if err := Verify(path); err == nil || !strings.Contains(err.Error(), tc.tensor) {
				t.Fatalf("Verify: %v", err)
			}
			d, err := Diff(intact, path)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, x := range d {
				if x.File == tc.file && x.Tensor == tc.tensor && strings.Contains(x.What, "second checkpoint is corrupt") {
					found = true
				}
			}
			if !found {
				t.Fatalf("Diff does not report the corruption: %v", d)
			}
		})
	}
	// A damaged header is named as such.
	path := save(t, t.TempDir(), 0, m, opt, rand.NewPCG(1, 1), 1)
	mf := filepath.Join(path, modelFile)
	b, _ := os.ReadFile(mf)
	b[9] = '['
	os.WriteFile(mf, b, 0o644)
	if err := loadFresh(path); err == nil || !strings.Contains(err.Error(), mf+" is corrupt") || !strings.Contains(err.Error(), "header is damaged") {
		t.Fatalf("damaged header: %v", err)
	}
}

func tensorNames(t *testing.T, path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b[8 : 8+binary.LittleEndian.Uint64(b)])
}

// A checkpoint saved before digests were recorded (no "files" in meta.json) still loads, with
// one warning; Verify says it cannot be verified.
func TestCheckpointWithoutDigestsLoads(t *testing.T) {
	m, opt := filled(t, 5)
	path := save(t, t.TempDir(), 0, m, opt, rand.NewPCG(1, 1), 1)
	mj := filepath.Join(path, metaFile)
	b, _ := os.ReadFile(mj)
	var in map[string]json.RawMessage
	if err := json.Unmarshal(b, &in); err != nil {
		t.Fatal(err)
	}
	delete(in, "files")
	b, _ = json.Marshal(in)
	os.WriteFile(mj, b, 0o644)

	var logged bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	defer slog.SetDefault(old)
	if err := loadFresh(path); err != nil {
		t.Fatalf("an old checkpoint does not load: %v", err)
	}
	if n := strings.Count(logged.String(), "has no digests"); n != 1 || !strings.Contains(logged.String(), path) {
		t.Fatalf("warned %d times: %q", n, logged.String())
	}
	if err := Verify(path); !errors.Is(err, ErrNoDigests) {
		t.Fatalf("Verify: %v", err)
	}
}

// With DDP every rank's file is recorded in meta.json (gathered by rank 0), and a flipped bit
// in rank 1's file is refused by rank 1, naming the file and tensor.
func TestDigestsOfEveryRank(t *testing.T) {
	dir := t.TempDir()
	groups, err := comm.NewLocal(2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	run := func(do func(r int, st State) error) error {
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for r := range 2 {
			wg.Go(func() {
				model := net(1, 3)
				dp, err := ddp.New(ctx, model, groups[r])
				if err == nil {
					err = do(r, State{Model: model, DDP: dp, RNG: map[string]RandState{"loop": rand.NewPCG(uint64(r), 1)}})
				}
				errs[r] = err
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	var path string
	if err := run(func(r int, st State) error {
		p, err := Saver{Dir: dir}.Save(ctx, st, Meta{Model: "net"}, Position{Iteration: 3})
		if r == 0 {
			path = p
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	files, err := Digests(path)
	if err != nil || len(files) != 3 || files[rankFile(1)].Tensors["rng/loop"] == "" {
		t.Fatalf("recorded %v (%v)", files, err)
	}
	if err := Verify(path); err != nil {
		t.Fatal(err)
	}
	flipTensorByte(t, filepath.Join(path, rankFile(1)), "rng/loop")
	err = run(func(r int, st State) error {
		_, err := Load(path, st, Meta{Model: "net"})
		if r == 0 && err != nil {
			return errors.New("rank 0 refused an intact rank-0 file: " + err.Error())
		}
		if r == 1 && (err == nil || !strings.Contains(err.Error(), rankFile(1)+" is corrupt") || !strings.Contains(err.Error(), `"rng/loop"`)) {
			return errors.New("rank 1: " + errString(err))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
