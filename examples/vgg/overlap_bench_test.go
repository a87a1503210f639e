package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
)

// BenchmarkNonOverlapped measures what OMGS-SGD optimises: the communication left after
// backward (DDP's IterationStats.End - BackwardEnd, the median over the iterations), for
// TopK-SGD (topka with all tensors in one bucket), lags, mgs and omgs, on VGG-16 (or
// $SPARGO_BENCH_MODEL) with 4 in-process workers of batch 16 on random images. It also
// reports the backward time, the iteration time and how many groups finished before
// backward did; with SPARGO_BENCH_TRACE=1 it prints to stderr each group's trace (ready, hook
// called, selected, all-gathered, done) in rank 0's last iteration.
//
//	SPARGO_BENCH_TRACE=1 go test ./examples/vgg -run '^$' -bench NonOverlapped -benchtime 8x
func BenchmarkNonOverlapped(b *testing.B) {
	const workers, batch = 4, 16
	model := os.Getenv("SPARGO_BENCH_MODEL")
	if model == "" {
		model = "vgg16"
	}
	for _, spec := range []string{"topka:density=0.01", "lags:density=0.01", "mgs:density=0.01", "omgs:density=0.01"} {
		b.Run(fmt.Sprintf("%s/%s/P=%d", model, spec, workers), func(b *testing.B) {
			groups, err := comm.NewLocal(workers)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var stats []ddp.IterationStats
			errs := make([]error, workers)
			var ready, wg sync.WaitGroup // ready: every rank set up and warmed up
			ready.Add(workers)
			start := make(chan struct{})
			for r, g := range groups {
				wg.Go(func() {
					var once sync.Once
					defer once.Do(ready.Done)
					errs[r] = func() error {
						m, err := models.NewVGG(model, models.CIFAR10, nn.NewRand(1))
						if err != nil {
							return err
						}
						hook, err := hooks.Parse(spec)
						if err != nil {
							return err
						}
						tape := nn.NewTape()
						rng := nn.NewRand(uint64(r))
						x := nn.NewTensor(batch, 3, 32, 32)
						y := make([]int, batch)
						next := func() {
							for i := range x.Data {
								x.Data[i] = float32(rng.NormFloat64())
							}
							for i := range y {
								y[i] = rng.IntN(10)
							}
							tape.Reset()
						}
						opts := []ddp.Option{ddp.WithCommHook(hook)}
						if spec == "topka:density=0.01" {
							opts = append(opts, ddp.WithBucketCap(1<<40, 1<<40)) // one group: TopK-SGD
						}
						if pp, ok := hook.(ddp.ProfiledPlanner); ok {
							po := pp.ProfileOptions()
							po.Warmup, po.Iterations = 1, 3
							prof, err := ddp.MeasureProfile(ctx, m, g, func(bw func(*nn.Var) error) error {
								next()
								return bw(nn.CrossEntropy(m.Forward(tape.Const(x)), y))
							}, po)
							if err != nil {
								return err
							}
							opts = append(opts, ddp.WithProfile(prof))
						}
						dp, err := ddp.New(ctx, m, g, opts...)
						if err != nil {
							return err
						}
						for it := -1; it < b.N; it++ { // it = -1: warm-up
							if it == 0 {
								once.Do(ready.Done)
								<-start
							}
							next()
							nn.ZeroGrad(dp.Parameters())
							if err := dp.Backward(ctx, nn.CrossEntropy(dp.Forward(tape.Const(x)), y)); err != nil {
								return err
							}
							if r == 0 && it >= 0 {
								stats = append(stats, dp.Stats())
							}
						}
						if tr, ok := hook.(interface {
							Trace(ddp.IterationStats) []hooks.GroupTrace
						}); ok && r == 0 && os.Getenv("SPARGO_BENCH_TRACE") != "" {
							st := dp.Stats() // to stderr: the benchmark log would be cut after a few lines
							fmt.Fprintf(os.Stderr, "%s: last iteration, rank 0: backward ended at %v, all groups done at %v\n", spec, st.BackwardEnd, st.End)
							for _, g := range tr.Trace(st) {
								fmt.Fprintf(os.Stderr, "  group %2d %9d elements: ready %8.2f  hook %8.2f  selected %8.2f  sent %8.2f  done %8.2f ms\n",
									g.Bucket, g.Elements, ms(g.Ready), ms(g.Start), ms(g.Sparsified), ms(g.Sent), ms(g.Done))
							}
						}
						return nil
					}()
					if errs[r] != nil {
						cancel() // unblock the other ranks
					}
				})
			}
			b.StopTimer()
			ready.Wait()
			b.ResetTimer() // the timer covers the measured iterations only
			b.StartTimer()
			close(start)
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				b.Fatal(err)
			}
			var nonOverlap, backward, end []time.Duration
			overlapped := 0
			for _, s := range stats {
				nonOverlap = append(nonOverlap, s.End-s.BackwardEnd)
				backward = append(backward, s.BackwardEnd)
				end = append(end, s.End)
				for _, bs := range s.Buckets {
					if bs.CommEnd < s.BackwardEnd {
						overlapped++
					}
				}
			}
			b.ReportMetric(ms(medianOf(nonOverlap)), "nonoverlap-ms")
			b.ReportMetric(ms(medianOf(backward)), "backward-ms")
			b.ReportMetric(ms(medianOf(end)), "iter-ms")
			b.ReportMetric(float64(len(stats[0].Buckets)), "groups")
			b.ReportMetric(float64(overlapped)/float64(len(stats)), "groups-done-in-backward")
		})
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func medianOf(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
