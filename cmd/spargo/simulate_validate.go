package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"sync"
	"time"

	"github.com/spargo-dl/spargo/comm"
)

// validateResult is one line of `spargo simulate -validate -json`.
type validateResult struct {
	Hook        string  `json:"hook"`
	Workers     int     `json:"workers"`
	N           int     `json:"n"`
	AlphaUS     float64 `json:"alpha_us"`
	BetaNSB     float64 `json:"beta_ns_per_byte"`
	MeasuredMS  float64 `json:"measured_ms"`
	PredictedMS float64 `json:"predicted_ms"`
	ErrorPct    float64 `json:"error_pct"`
}

// calibrationBytes is the message of the bandwidth probe.
const calibrationBytes = 4 << 20

// Calibrate fits the α-β model of groups (one per rank, all in this process): α is half the
// round trip of an 8-byte ping-pong between ranks 0 and 1 (median of 200), β the time per
// byte when every rank sends calibrationBytes to its right neighbour and receives as many
// from its left at the same moment (median of 5, minus α) — the bandwidth a rank gets while
// all ranks communicate, as they do inside a collective.
func calibrate(ctx context.Context, groups []comm.Group) (alpha, beta float64, err error) {
	p := len(groups)
	if p < 2 {
		return 0, 0, fmt.Errorf("calibrate: need at least 2 ranks, have %d", p)
	}
	const pings = 200
	rtts := make([]float64, 0, pings)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			g, buf := groups[r], make([]byte, 8)
			for range pings {
				t := time.Now()
				if r == 0 {
					if errs[0] = g.Send(ctx, 1, 1, buf); errs[0] == nil {
						_, errs[0] = g.Recv(ctx, 1, 1, buf)
					}
					rtts = append(rtts, time.Since(t).Seconds())
				} else {
					if _, errs[1] = g.Recv(ctx, 0, 1, buf); errs[1] == nil {
						errs[1] = g.Send(ctx, 0, 1, buf)
					}
				}
				if errs[r] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, 0, fmt.Errorf("calibrate: ping-pong: %w", err)
	}
	alpha = median(rtts) / 2

	const reps = 5
	times := make([]float64, reps)
	errs = make([]error, p)
	for r := range p {
		wg.Go(func() {
			g := groups[r]
			send, recv := make([]byte, calibrationBytes), make([]byte, calibrationBytes)
			for i := range reps {
				if err := comm.Barrier(ctx, g, 2); err != nil {
					errs[r] = err
					return
				}
				t := time.Now()
				if _, err := comm.SendRecv(ctx, g, 3, (r+1)%p, send, (r-1+p)%p, recv); err != nil {
					errs[r] = err
					return
				}
				if r == 0 {
					times[i] = time.Since(t).Seconds()
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, 0, fmt.Errorf("calibrate: bandwidth probe: %w", err)
	}
	beta = max(0, median(times)-alpha) / calibrationBytes
	return alpha, beta, nil
}

// runValidate measures the hooks over TCP on loopback and compares with the simulator's
// prediction for the fitted α and β.
func runValidate(o simOptions, nGiven bool, stdout io.Writer, asJSON bool) error {
	p := o.workers
	if p < 2 {
		return fmt.Errorf("simulate -validate: -workers %d: want at least 2", p)
	}
	n := o.nModel
	if !nGiven {
		n = 1 << 20
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	groups, err := comm.NewTCPLoopback(ctx, p, nil)
	if err != nil {
		return fmt.Errorf("simulate -validate: %w", err)
	}
	defer func() {
		for _, g := range groups {
			g.Close()
		}
	}()
	alpha, beta, err := calibrate(ctx, groups)
	if err != nil {
		return fmt.Errorf("simulate -validate: %w", err)
	}
	cores := runtime.NumCPU()
	if !asJSON {
		fmt.Fprintf(stdout, "TCP loopback, P=%d in one process on %d cores, n=%d: fitted α = %.1f µs, β = %.3f ns/byte (%s per rank with all ranks sending)\n",
			p, cores, n, alpha*1e6, beta*1e9, formatBandwidth(8/beta))
		fmt.Fprintf(stdout, "%-28s %12s %13s %8s\n", "hook", "measured_ms", "predicted_ms", "error_%")
	}
	src := singleBucketSource(n, syntheticGradients(o.seed, n, allWorkers(p)))
	so := o
	so.model, so.nModel, so.alpha, so.beta, so.bandwidthBits = fmt.Sprintf("n=%d", n), n, alpha, beta, 8/beta
	// The kernels are timed on P goroutines at once: the rates then include the sharing of
	// this machine's cores (and whatever else runs on it), as the TCP run does.
	so.scale, so.mem, so.compute, so.cores, so.concurrent = 1, math.MaxInt64/4, "measure", 0, p
	for _, row := range o.rows {
		runtime.GC()
		spec := row.label
		meas, err := benchHook(row, src, benchOptions{workers: p, warmup: o.warmup, iters: o.iters, groups: groups})
		if err != nil {
			return fmt.Errorf("simulate -validate: %s over TCP: %w", spec, err)
		}
		pred, err := simulateHook(so, scalePlan{nSim: n, scale: 1}, row)
		if err != nil {
			return fmt.Errorf("simulate -validate: %s simulated: %w", spec, err)
		}
		res := validateResult{Hook: spec, Workers: p, N: n, AlphaUS: alpha * 1e6, BetaNSB: beta * 1e9,
			MeasuredMS: meas.TimeMS, PredictedMS: pred.TimeMS, ErrorPct: 100 * (pred.TimeMS - meas.TimeMS) / meas.TimeMS}
		if asJSON {
			if err := json.NewEncoder(stdout).Encode(res); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(stdout, "%-28s %12.2f %13.2f %+8.1f\n", spec, res.MeasuredMS, res.PredictedMS, res.ErrorPct)
	}
	return nil
}
