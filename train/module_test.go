package train

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// userProgram is a program of another module built on package train: a small perceptron of
// its own on a synthetic 3-class problem, 2 in-process ranks, the comm hook from -hook. It
// prints every epoch's training loss over both ranks.
const userProgram = `package main

import (
	"context"
	"flag"
	"fmt"
	"iter"
	"math/rand/v2"
	"os"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/train"
)

const epochs, steps = 3, 20

func batches(rank int) func(ctx context.Context, epoch, start int) iter.Seq2[datasets.Batch, error] {
	centres := [3][4]float32{{2, 0, 0, 1}, {0, 2, 1, 0}, {-1, -1, 0, -2}}
	return func(ctx context.Context, epoch, start int) iter.Seq2[datasets.Batch, error] {
		return func(yield func(datasets.Batch, error) bool) {
			for s := start; s < steps; s++ {
				rng := rand.New(rand.NewPCG(uint64(rank), uint64(epoch*steps+s)))
				b := datasets.Batch{X: make([]float32, 8*4), Y: make([]int, 8), N: 8}
				for i := range b.N {
					b.Y[i] = rng.IntN(3)
					for j := range 4 {
						b.X[i*4+j] = centres[b.Y[i]][j] + float32(rng.NormFloat64())*0.5
					}
				}
				if !yield(b, ctx.Err()) {
					return
				}
			}
		}
	}
}

func main() {
	hook := flag.String("hook", "allreduce", "comm hook spec")
	flag.Parse()
	hookConfig, err := train.ParseHook(*hook, 2)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	groups, err := comm.NewLocal(2)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	err = train.RunRanks(context.Background(), groups, func(ctx context.Context, g comm.Group) error {
		rng := nn.NewRand(1)
		model := nn.NewSequential(nn.NewLinear(4, 16, true, rng), nn.ReLU{}, nn.NewLinear(16, 3, true, rng))
		flags := train.Flags{LR: 0.1, Momentum: 0.9}
		rep, err := train.Setup{Hook: hookConfig, Flags: &flags}.New(ctx, g, model)
		if err != nil {
			return err
		}
		loop := &train.Loop[datasets.Batch]{
			Group: g, DDP: rep.DDP, Model: model, Optimizer: rep.Optimizer, Epochs: epochs, StepsPerEpoch: steps,
			Batches: batches(g.Rank()),
			Step:    train.ClassifierStep(rep.DDP, nn.NewTape(), 4),
			EndEpoch: func(_ context.Context, es train.EpochStats) error {
				if g.Rank() == 0 {
					fmt.Printf("epoch %d loss %.6f\n", es.Epoch, es.Loss)
				}
				return nil
			},
		}
		return loop.Run(ctx)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
`

// A program in a module of its own, which reaches this checkout through a replace
// directive, imports train, builds its own model and trains it with 2 in-process ranks and
// a hook from a spec string; its loss goes down. It builds offline, from the module cache.
func TestSeparateModuleTrains(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("the go command is not on PATH (%v): cannot build a separate module", err)
	}
	checkout, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	modText, err := os.ReadFile(filepath.Join(checkout, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(checkout, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// The checkout's requirements, so that the build list resolves from the module cache
	// without asking a proxy.
	var gomod strings.Builder
	gomod.WriteString("module example.com/spargouser\n\ngo 1.26\n\nrequire github.com/spargo-dl/spargo v0.0.0\n\n")
	for _, block := range requireBlocks(string(modText)) {
		gomod.WriteString(block + "\n")
	}
	gomod.WriteString("replace github.com/spargo-dl/spargo => " + checkout + "\n")
	for name, text := range map[string]string{"go.mod": gomod.String(), "go.sum": string(sum), "main.go": userProgram} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "user")
	build := exec.Command(goCmd, "build", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod -buildvcs=false", "GOPROXY=off", "GOWORK=off", "GOSUMDB=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build in a separate module (go.mod:\n%s): %v\n%s", gomod.String(), err, out)
	}
	for _, spec := range []string{"allreduce", "topka:density=0.5"} {
		out, err := exec.Command(bin, "-hook", spec).CombinedOutput()
		if err != nil {
			t.Fatalf("-hook %s: %v\n%s", spec, err, out)
		}
		var losses []float64
		sc := bufio.NewScanner(strings.NewReader(string(out)))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 4 && f[0] == "epoch" && f[2] == "loss" {
				l, err := strconv.ParseFloat(f[3], 64)
				if err != nil {
					t.Fatalf("-hook %s: line %q: %v", spec, sc.Text(), err)
				}
				losses = append(losses, l)
			}
		}
		if len(losses) != 3 || !(losses[2] < losses[0]/2) {
			t.Errorf("-hook %s: epoch losses %v, want 3 epochs with the last below half the first:\n%s", spec, losses, out)
		}
	}
	// A bad spec is the program's error, naming the hook.
	if out, err := exec.Command(bin, "-hook", "nosuch").CombinedOutput(); err == nil || !strings.Contains(string(out), "nosuch") {
		t.Errorf("-hook nosuch: %v\n%s", err, out)
	}
}

// requireBlocks returns go.mod's require directives (single lines and blocks), as written.
func requireBlocks(gomod string) []string {
	var out []string
	lines := strings.Split(gomod, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		switch {
		case l == "require (":
			j := i
			for j < len(lines) && strings.TrimSpace(lines[j]) != ")" {
				j++
			}
			out = append(out, strings.Join(lines[i:j+1], "\n"))
			i = j
		case strings.HasPrefix(l, "require "):
			out = append(out, l)
		}
	}
	return out
}
