package hooks

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// ospSaved is restored state waiting for the hook to learn the model.
type ospSaved struct {
	rank, size                  int
	calls, epochs, sElems, uMax int64
	lossL                       float64
	ghat                        map[string][]float32
	jobs                        []ospSavedJob
}

type ospSavedJob struct {
	iter   int64
	bucket int
	layers []int
	values []float32
}

// State keys: "osp.meta" (rank, world size, iterations, epochs, S(G^u), U_max, L), "osp.ghat.<param
// name>" (Ĝ), "osp.ics<k>.meta" (iteration, bucket, layer ids) and "osp.ics<k>.values". Integers
// and L are stored bit-exactly as pairs of float32 bit patterns.
const ospPrefix = "osp."

// State returns the hook's state (ddp.Stateful). It waits for the ICS on the wire.
func (h *OSP) State() (map[string][]float32, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.loaded != nil { // restored and not run since: save it again
		return h.loaded.state(), nil
	}
	sv := &ospSaved{rank: h.rank, size: h.size, calls: h.calls, epochs: int64(h.epochs), sElems: int64(h.sElems), uMax: int64(h.uMax), lossL: h.lossL, ghat: map[string][]float32{}}
	if !h.bound {
		sv.rank, sv.size = -1, -1
	}
	for l, v := range h.ghat {
		if v != nil {
			sv.ghat[h.layers[l].p.Name] = slices.Clone(v)
		}
	}
	for _, j := range h.jobs {
		<-j.done
		if j.err != nil {
			return nil, fmt.Errorf("hooks: osp: State: ICS of iteration %d failed: %w", j.iter, j.err)
		}
		sv.jobs = append(sv.jobs, ospSavedJob{iter: j.iter, bucket: j.bucket, layers: slices.Clone(j.layers), values: slices.Clone(j.buf)})
	}
	return sv.state(), nil
}

func (sv *ospSaved) state() map[string][]float32 {
	st := map[string][]float32{}
	var meta []float32
	for _, v := range []int64{int64(sv.rank), int64(sv.size), sv.calls, sv.epochs, sv.sElems, sv.uMax} {
		meta = append(meta, packU64(uint64(v))...)
	}
	meta = append(meta, packU64(math.Float64bits(sv.lossL))...)
	st[ospPrefix+"meta"] = meta
	for name, v := range sv.ghat {
		st[ospPrefix+"ghat."+name] = slices.Clone(v)
	}
	for k, j := range sv.jobs {
		m := append(packU64(uint64(j.iter)), packU64(uint64(j.bucket))...)
		for _, l := range j.layers {
			m = append(m, packU64(uint64(l))...)
		}
		st[fmt.Sprintf("%sics%d.meta", ospPrefix, k)] = m
		st[fmt.Sprintf("%sics%d.values", ospPrefix, k)] = slices.Clone(j.values)
	}
	return st
}

// LoadState restores State's output (ddp.Stateful); it is checked against the model when the
// hook first runs. Keys of other hooks are an error.
func (h *OSP) LoadState(st map[string][]float32) error {
	sv := &ospSaved{ghat: map[string][]float32{}}
	meta, ok := st[ospPrefix+"meta"]
	if !ok || len(meta) != 14 {
		return fmt.Errorf("hooks: osp: LoadState: no %smeta entry of 14 values", ospPrefix)
	}
	u := func(i int) int64 { return int64(unpackU64(meta[2*i:])) }
	sv.rank, sv.size, sv.calls, sv.epochs, sv.sElems, sv.uMax = int(u(0)), int(u(1)), u(2), u(3), u(4), u(5)
	sv.lossL = math.Float64frombits(unpackU64(meta[12:]))
	jobs := map[int]*ospSavedJob{}
	job := func(k int) *ospSavedJob {
		if jobs[k] == nil {
			jobs[k] = &ospSavedJob{bucket: -1}
		}
		return jobs[k]
	}
	for k, v := range st {
		rest, ok := strings.CutPrefix(k, ospPrefix)
		switch {
		case !ok:
			return fmt.Errorf("hooks: osp: LoadState: key %q is not osp state", k)
		case rest == "meta":
		case strings.HasPrefix(rest, "ghat."):
			sv.ghat[strings.TrimPrefix(rest, "ghat.")] = slices.Clone(v)
		case strings.HasPrefix(rest, "ics"):
			num, field, _ := strings.Cut(strings.TrimPrefix(rest, "ics"), ".")
			i, err := strconv.Atoi(num)
			if err != nil || i < 0 {
				return fmt.Errorf("hooks: osp: LoadState: malformed key %q", k)
			}
			switch field {
			case "meta":
				if len(v) < 4 || len(v)%2 != 0 {
					return fmt.Errorf("hooks: osp: LoadState: %q has %d values", k, len(v))
				}
				j := job(i)
				j.iter, j.bucket = int64(unpackU64(v)), int(unpackU64(v[2:]))
				for o := 4; o < len(v); o += 2 {
					j.layers = append(j.layers, int(unpackU64(v[o:])))
				}
			case "values":
				job(i).values = slices.Clone(v)
			default:
				return fmt.Errorf("hooks: osp: LoadState: unknown key %q", k)
			}
		default:
			return fmt.Errorf("hooks: osp: LoadState: unknown key %q", k)
		}
	}
	for k := range len(jobs) {
		j, ok := jobs[k]
		if !ok || j.bucket < 0 || j.values == nil {
			return fmt.Errorf("hooks: osp: LoadState: ICS entry %d is incomplete", k)
		}
		sv.jobs = append(sv.jobs, *j)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.bound, h.layers, h.bucketLayers, h.modelElems = false, nil, nil, 0
	h.ghat, h.jobs, h.queue, h.deferNow, h.chain = nil, nil, nil, nil, nil
	h.loaded = sv
	return nil
}

// restore applies saved state once the model is known.
func (h *OSP) restore(sv *ospSaved) error {
	if sv.rank >= 0 && (sv.rank != h.rank || sv.size != h.size) {
		return fmt.Errorf("restored state was saved by rank %d of %d, restoring on rank %d of %d", sv.rank, sv.size, h.rank, h.size)
	}
	byName := map[string]int{}
	for l, ly := range h.layers {
		byName[ly.p.Name] = l
	}
	h.calls, h.epochs, h.sElems, h.uMax, h.lossL = sv.calls, int(sv.epochs), int(sv.sElems), int(sv.uMax), sv.lossL
	if len(sv.ghat) > 0 {
		h.ghat = make([][]float32, len(h.layers))
		for name, v := range sv.ghat {
			l, ok := byName[name]
			if !ok || h.layers[l].p.Len() != len(v) {
				return fmt.Errorf("restored Ĝ of %q (%d values) matches no parameter of the model: state saved for another model", name, len(v))
			}
			h.ghat[l] = v
		}
	}
	for _, sj := range sv.jobs {
		j := &icsJob{iter: sj.iter, bucket: sj.bucket, layers: sj.layers, buf: sj.values, done: make(chan struct{})}
		n := 0
		for _, l := range sj.layers {
			if l < 0 || l >= len(h.layers) || h.layers[l].bucket != sj.bucket {
				return fmt.Errorf("restored ICS of iteration %d names layer %d outside bucket %d: state saved under a different bucket plan", sj.iter, l, sj.bucket)
			}
			n += h.layers[l].p.Len()
		}
		if n != len(sj.values) {
			return fmt.Errorf("restored ICS of iteration %d has %d values for %d elements: state saved under a different bucket plan", sj.iter, len(sj.values), n)
		}
		close(j.done)
		h.jobs = append(h.jobs, j)
	}
	return nil
}
