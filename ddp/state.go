package ddp

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/spargo-dl/spargo/nn"
)

// DDP's own state in checkpoints. Besides the model, the optimizer and the hook (Stateful),
// an exact resume needs what DDP carries from one iteration to the next:
//
//   - the iteration counter (Bucket.Iteration; hooks' warm-ups and schedules may read it);
//   - the epoch counter and the losses Backward saw since the last EndEpoch (EpochInfo);
//   - the late results of the last Backward that the optimizer has not applied yet
//     (late.go): State waits for them and saves their values, LoadState hands them back as
//     completed results, so that a checkpoint taken between any two steps — not only after
//     Flush — resumes bit for bit;
//   - LGP's local estimates of those pending gradients.
//
// Keys: "ddp.meta" (iteration, epochs, Backward losses counted, their sum, the first loss,
// rank, world size), "ddp.late<k>.meta" (bucket, LGP flag, positions in the bucket) with
// "ddp.late<k>.values", and "ddp.lgp.<parameter name>". Integers and float64 values are
// stored bit-exactly as pairs of float32 bit patterns (never as float32 numbers).

const (
	stateMeta  = "ddp.meta"
	stateLate  = "ddp.late"
	stateLocal = "ddp.lgp."
	metaWords  = 7
)

func packU64(v uint64) []float32 {
	return []float32{math.Float32frombits(uint32(v)), math.Float32frombits(uint32(v >> 32))}
}

func unpackU64(f []float32) uint64 {
	return uint64(math.Float32bits(f[0])) | uint64(math.Float32bits(f[1]))<<32
}

// State returns DDP's per-rank state for a checkpoint (see the keys above). Call it between
// steps (after the optimizer's Step, before the next Forward), on every rank: the pending
// late results differ by rank only in LGP's estimates, but every rank needs its own. It waits
// for the late results still on the wire, under ctx.
func (d *DDP) State(ctx context.Context) (map[string][]float32, error) {
	l := d.late
	if l.applied {
		return nil, fmt.Errorf("ddp: State: called between a training Forward and its Backward (LGP offsets are in the parameters); save between steps")
	}
	st := map[string][]float32{}
	var meta []float32
	for _, v := range []uint64{uint64(d.reducer.iter), uint64(l.epochs), uint64(l.lossN), math.Float64bits(l.lossSum),
		math.Float64bits(l.firstLoss), uint64(d.group.Rank()), uint64(d.group.Size())} {
		meta = append(meta, packU64(v)...)
	}
	st[stateMeta] = meta
	res, err := l.waitPrev(ctx, d.cfg.hook.Name())
	if err != nil {
		return nil, fmt.Errorf("ddp: State: %w", err)
	}
	for k, lb := range l.prev {
		l.prev[k].result = Ready(res[k], nil) // waited once; the next Backward reads the values
		pos := make(map[*nn.Param]int, len(lb.b.params))
		for i, p := range lb.b.params {
			pos[p] = i
		}
		m := packU64(uint64(lb.b.index))
		flag := uint64(0)
		if lb.correct {
			flag = 1
		}
		m = append(m, packU64(flag)...)
		for _, p := range lb.params {
			m = append(m, packU64(uint64(pos[p]))...)
		}
		pre := stateLate + strconv.Itoa(k)
		st[pre+".meta"] = m
		st[pre+".values"] = append([]float32(nil), res[k]...)
	}
	for p, est := range l.local {
		st[stateLocal+p.Name] = append([]float32(nil), est...)
	}
	return st, nil
}

// LoadState restores State's output into a DDP built on the same model, world size and
// bucket plan (a fresh one, before its first Backward). A mismatch is an error naming it.
func (d *DDP) LoadState(st map[string][]float32) error {
	l := d.late
	meta, ok := st[stateMeta]
	if !ok || len(meta) != 2*metaWords {
		return fmt.Errorf("ddp: LoadState: no %s entry of %d values", stateMeta, 2*metaWords)
	}
	u := func(i int) uint64 { return unpackU64(meta[2*i:]) }
	if rank, size := int(u(5)), int(u(6)); size != d.group.Size() || rank != d.group.Rank() {
		return fmt.Errorf("ddp: LoadState: state saved by rank %d of %d, restoring on rank %d of %d", rank, size, d.group.Rank(), d.group.Size())
	}
	byName := make(map[string]*nn.Param, len(d.params))
	for _, p := range d.params {
		byName[p.Name] = p
	}
	type late struct {
		meta, values []float32
	}
	lates := map[int]*late{}
	local := map[*nn.Param][]float32{}
	keys := make([]string, 0, len(st))
	for k := range st {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := st[k]
		switch {
		case k == stateMeta:
		case strings.HasPrefix(k, stateLocal):
			name := strings.TrimPrefix(k, stateLocal)
			p, ok := byName[name]
			if !ok || p.Len() != len(v) {
				return fmt.Errorf("ddp: LoadState: LGP estimate %q (%d values) matches no parameter of the model", name, len(v))
			}
			local[p] = append([]float32(nil), v...)
		case strings.HasPrefix(k, stateLate):
			num, field, _ := strings.Cut(strings.TrimPrefix(k, stateLate), ".")
			i, err := strconv.Atoi(num)
			if err != nil || i < 0 || (field != "meta" && field != "values") {
				return fmt.Errorf("ddp: LoadState: malformed key %q", k)
			}
			if lates[i] == nil {
				lates[i] = &late{}
			}
			if field == "meta" {
				lates[i].meta = v
			} else {
				lates[i].values = v
			}
		default:
			return fmt.Errorf("ddp: LoadState: unknown key %q", k)
		}
	}
	prev := make([]lateBucket, len(lates))
	for k := range len(lates) {
		lt, ok := lates[k]
		if !ok || lt.meta == nil || lt.values == nil || len(lt.meta) < 4 || len(lt.meta)%2 != 0 {
			return fmt.Errorf("ddp: LoadState: late result %d is incomplete", k)
		}
		bi := int(unpackU64(lt.meta))
		if bi < 0 || bi >= len(d.reducer.buckets) {
			return fmt.Errorf("ddp: LoadState: late result %d is for bucket %d, the plan has %d buckets: state saved under a different bucket plan", k, bi, len(d.reducer.buckets))
		}
		b := d.reducer.buckets[bi]
		lb := lateBucket{b: b, correct: unpackU64(lt.meta[2:]) == 1}
		for o := 4; o < len(lt.meta); o += 2 {
			pi := int(unpackU64(lt.meta[o:]))
			if pi < 0 || pi >= len(b.params) {
				return fmt.Errorf("ddp: LoadState: late result %d names position %d of bucket %d, which has %d parameters: state saved under a different bucket plan", k, pi, bi, len(b.params))
			}
			lb.params = append(lb.params, b.params[pi])
			lb.elems += b.params[pi].Len()
		}
		if lb.elems != len(lt.values) {
			return fmt.Errorf("ddp: LoadState: late result %d has %d values for %d elements of bucket %d: state saved under a different bucket plan", k, len(lt.values), lb.elems, bi)
		}
		lb.result = Ready(append([]float32(nil), lt.values...), nil)
		prev[k] = lb
	}
	d.reducer.iter = int64(u(0))
	l.epochs, l.lossN = int(u(1)), int64(u(2))
	l.lossSum, l.firstLoss = math.Float64frombits(u(3)), math.Float64frombits(u(4))
	l.prev, l.cur = prev, l.cur[:0]
	l.local = local
	return nil
}

// Iteration returns how many synchronised Backward passes DDP has run (restored by
// LoadState).
func (d *DDP) Iteration() int64 { return d.reducer.iter }
