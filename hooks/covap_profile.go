package hooks

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/spargo-dl/spargo/comm"
)

// COVAP's distributed profiler (the paper's §III-B and Fig. 3), for interval=auto.
//
// On each measured dense iteration every rank records its backward computation time (from the
// start of backward until the last bucket was ready: ddp.Timed) and, per bucket, how long its
// all-reduce took on this rank. A rank that reaches an all-reduce before the others spends the
// first part of it waiting for the last one to arrive; counting that as communication inflates
// the CCR (the paper measured 20 %). No rank can leave an all-reduce before the last one has
// contributed, and all leave it at nearly the same moment, so the profiler aligns the ranks'
// timelines at the end of each all-reduce: seen from that common end, the all-reduce itself
// began when the last rank arrived, and its true duration is the shortest of the ranks'
// durations — the latest arrival's, which did not wait. After the last measured iteration the
// ranks gather their records (one all-gather of a few hundred bytes) and every rank computes,
// from the same bits, the same result:
//
//	T_comm(k) = Σ_buckets min_ranks d(rank, k, bucket)   aligned communication of iteration k
//	T_comp(k) = max_ranks comp(rank, k)                  the slowest rank's backward sets the
//	                                                     window that communication can hide in
//	CCR = median_k T_comm(k) / median_k T_comp(k),  I = min(max(ceil(CCR), 1), max_interval)
//
// Medians, not means: one hiccup of a shared machine should not set the interval for a whole
// run. The all-reduce times are read from the group's clock (comm.Now): wall time on a real
// transport, the virtual clock on a simulated network (comm/simnet), where the profiler measures
// the simulated cost exactly.

// covapSample is one rank's measurement of one dense iteration.
type covapSample struct {
	comp time.Duration   // backward: start until the last bucket was ready
	comm []time.Duration // per bucket: this rank's all-reduce time
}

// CovapProfile is what COVAP's distributed profiler measured.
type CovapProfile struct {
	P          int
	Iterations int
	// Comp is the backward computation time per iteration (the slowest rank's).
	Comp time.Duration
	// Comm is the communication time per iteration, timelines aligned at the end of each
	// all-reduce (waiting for late ranks excluded).
	Comm time.Duration
	// CommUnaligned is what the ranks' own clocks say (the mean over ranks of the sum of their
	// all-reduce times): waiting for late ranks included. For the log and the tests.
	CommUnaligned time.Duration
	// CCR is Comm / Comp.
	CCR float64
	// Interval is ceil(CCR), at least 1 and at most the max_interval option.
	Interval int
	// Clamped reports that ceil(CCR) exceeded max_interval.
	Clamped bool
}

// covapMeasure gathers every rank's samples and computes the profile; every rank gets the
// same result.
func covapMeasure(ctx context.Context, g comm.Group, tag uint32, mine []covapSample, maxInterval int) (CovapProfile, error) {
	all, err := comm.AllGatherBytes(ctx, g, tag, encodeCovapSamples(mine))
	if err != nil {
		return CovapProfile{}, fmt.Errorf("gathering the profiles: %w", err)
	}
	samples := make([][]covapSample, len(all))
	for r, msg := range all {
		if samples[r], err = decodeCovapSamples(msg); err != nil {
			return CovapProfile{}, fmt.Errorf("rank %d's profile: %w", r, err)
		}
	}
	return covapAlign(samples, maxInterval)
}

// encodeCovapSamples: per sample, the computation time, the bucket count and the bucket times,
// little-endian int64 nanoseconds.
func encodeCovapSamples(ss []covapSample) []byte {
	var b []byte
	for _, s := range ss {
		b = binary.LittleEndian.AppendUint64(b, uint64(s.comp))
		b = binary.LittleEndian.AppendUint64(b, uint64(len(s.comm)))
		for _, d := range s.comm {
			b = binary.LittleEndian.AppendUint64(b, uint64(d))
		}
	}
	return b
}

func decodeCovapSamples(b []byte) ([]covapSample, error) {
	var ss []covapSample
	next := func() (int64, bool) {
		if len(b) < 8 {
			return 0, false
		}
		v := int64(binary.LittleEndian.Uint64(b))
		b = b[8:]
		return v, true
	}
	for len(b) > 0 {
		comp, ok1 := next()
		nb, ok2 := next()
		if !ok1 || !ok2 || nb < 0 || nb > int64(len(b)/8) {
			return nil, fmt.Errorf("malformed profile message")
		}
		s := covapSample{comp: time.Duration(comp), comm: make([]time.Duration, nb)}
		for i := range s.comm {
			d, _ := next()
			s.comm[i] = time.Duration(d)
		}
		ss = append(ss, s)
	}
	return ss, nil
}

// covapAlign computes the profile from all[rank][iteration] (see the top of this file).
func covapAlign(all [][]covapSample, maxInterval int) (CovapProfile, error) {
	if len(all) == 0 || len(all[0]) == 0 {
		return CovapProfile{}, fmt.Errorf("no measured iterations")
	}
	iters, buckets := len(all[0]), len(all[0][0].comm)
	for r, ss := range all {
		if len(ss) != iters {
			return CovapProfile{}, fmt.Errorf("rank %d measured %d iterations, rank 0 %d", r, len(ss), iters)
		}
		for k, s := range ss {
			if len(s.comm) != buckets {
				return CovapProfile{}, fmt.Errorf("rank %d measured %d buckets in iteration %d, rank 0 %d", r, len(s.comm), k, buckets)
			}
		}
	}
	comm, comp, unaligned := make([]time.Duration, iters), make([]time.Duration, iters), make([]time.Duration, iters)
	for k := range iters {
		for b := range buckets {
			shortest := all[0][k].comm[b]
			for r := range all {
				shortest = min(shortest, all[r][k].comm[b])
			}
			comm[k] += shortest
		}
		var own time.Duration
		for r := range all {
			comp[k] = max(comp[k], all[r][k].comp)
			for _, d := range all[r][k].comm {
				own += d
			}
		}
		unaligned[k] = own / time.Duration(len(all))
	}
	p := CovapProfile{P: len(all), Iterations: iters, Comp: medianDuration(comp), Comm: medianDuration(comm), CommUnaligned: medianDuration(unaligned)}
	switch {
	case p.Comp > 0:
		p.CCR = float64(p.Comm) / float64(p.Comp)
	case p.Comm > 0:
		p.CCR = math.Inf(1)
	}
	p.Interval = 1
	if c := math.Ceil(p.CCR); c > 1 {
		if c > float64(maxInterval) {
			p.Interval, p.Clamped = maxInterval, true
		} else {
			p.Interval = int(c)
		}
	}
	return p, nil
}

// medianDuration is the median (the mean of the two middle values for an even count).
func medianDuration(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
