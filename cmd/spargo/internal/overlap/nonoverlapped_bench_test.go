package overlap_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/spargo-dl/spargo/cmd/spargo/internal/overlap"
	"github.com/spargo-dl/spargo/models"
)

// BenchmarkNonOverlapped measures what OMGS-SGD optimises: the communication left after
// backward (DDP's IterationStats.End - BackwardEnd, the median over the iterations), for
// TopK-SGD (topka with all tensors in one bucket), lags, mgs and omgs, on VGG-16 (or
// $SPARGO_BENCH_MODEL, any image classifier or LSTM language model of spargo models) with 4
// in-process workers of batch 16 on random images (random token windows of 35 × 20 for a
// language model). It also reports the backward time, the iteration time and how many groups
// finished before backward did; with SPARGO_BENCH_TRACE=1 it prints to stderr each group's
// trace (ready, hook called, selected, all-gathered, done) in rank 0's last iteration. It is
// this package's measurement, as `spargo bench overlap` runs it; here each hook runs
// alone, so only omgs plans on a measured profile (lags and mgs use reverse declaration
// order), and ns/op includes building the model and measuring omgs's profile.
//
//	SPARGO_BENCH_TRACE=1 go test ./cmd/spargo/internal/overlap -run '^$' -bench NonOverlapped -benchtime 8x
func BenchmarkNonOverlapped(b *testing.B) {
	const workers = 4
	name := os.Getenv("SPARGO_BENCH_MODEL")
	if name == "" {
		name = "vgg16"
	}
	entry, err := models.Lookup(name)
	if err != nil {
		b.Fatal(err)
	}
	batch := 16
	if entry.Input.Size == 0 {
		batch = 20
	}
	for _, spec := range []string{"topka:density=0.01", "lags:density=0.01", "mgs:density=0.01", "omgs:density=0.01"} {
		b.Run(fmt.Sprintf("%s/%s/P=%d", name, spec, workers), func(b *testing.B) {
			hs, err := overlap.ParseHooks(spec)
			if err != nil {
				b.Fatal(err)
			}
			cfg := overlap.Config{Model: entry, Hooks: hs, SingleBucket: true, Batch: batch, BPTT: 35,
				Warmup: 1, Iters: b.N, Seed: 1, Trace: os.Getenv("SPARGO_BENCH_TRACE") != ""}
			rep, err := overlap.RunLocal(context.Background(), workers, cfg)
			if err != nil {
				b.Fatal(err)
			}
			h := rep.Hooks[0]
			b.ReportMetric(h.NonOverlappedMS, "nonoverlap-ms")
			b.ReportMetric(h.BackwardMS, "backward-ms")
			b.ReportMetric(h.IterationMS, "iter-ms")
			b.ReportMetric(float64(h.Groups), "groups")
			b.ReportMetric(h.DoneInBackward, "groups-done-in-backward")
			if cfg.Trace { // to stderr: the benchmark log would be cut after a few lines
				rep.WriteText(os.Stderr)
			}
		})
	}
}
