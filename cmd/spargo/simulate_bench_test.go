package main

import (
	"fmt"
	"runtime"
	"testing"
)

// BenchmarkSimulateComputeVsLocal compares the simulator's compute charge with reality
// without asserting anything: for Ok-Topk and SparDL (the control) on P in-process workers
// (comm.NewLocal, no network: the time is computation and memory traffic), it reports the
// measured median time of a call (measured_ms) next to the local computation `spargo
// simulate -cores GOMAXPROCS` charges for the same call (charged_ms) and their ratio.
// charged/measured near 1 means the cost model accounts for the work; on a loaded machine
// measured_ms also holds the other load's share of the cores.
//
//	go test ./cmd/spargo -run '^$' -bench SimulateComputeVsLocal -benchtime 1x
func BenchmarkSimulateComputeVsLocal(b *testing.B) {
	const n, density = 1 << 22, 0.01
	for _, p := range []int{2, 4} {
		src := singleBucketSource(n, syntheticGradients(0, n, allWorkers(p)))
		for _, spec := range []string{"oktopk:density=0.01", "spardl:density=0.01"} {
			b.Run(fmt.Sprintf("%s/P=%d/n=%d", spec, p, n), func(b *testing.B) {
				o := simOptions{model: "bench", nModel: n, workers: p, alpha: 0, beta: 1e-12, bandwidthBits: 8e12,
					iters: 3, warmup: 1, compute: "measure", cores: runtime.GOMAXPROCS(0), mem: 1 << 32}
				var measured, charged float64
				for b.Loop() {
					meas, err := benchHook(testRow(b, spec), src, benchOptions{workers: p, warmup: 1, iters: 3})
					if err != nil {
						b.Fatal(err)
					}
					sim, err := simulateHook(o, scalePlan{nSim: n, scale: 1}, testRow(b, spec))
					if err != nil {
						b.Fatal(err)
					}
					measured, charged = meas.TimeMS, sim.ComputeMS
				}
				b.ReportMetric(measured, "measured_ms")
				b.ReportMetric(charged, "charged_ms")
				b.ReportMetric(charged/measured, "charged/measured")
			})
		}
	}
}
