package hooks

import (
	"fmt"
	"strings"

	"github.com/spargo-dl/spargo/ddp"
)

// Hier's state (ddp.Stateful) is its Inner hook's, every key prefixed with "hier.", and, once
// the hook knows the topology, "hier.layout": the nodes, ranks per node, node and local rank
// it ran on, each an integer stored bit-exactly as Memory stores its counters.
const (
	hierKeyPrefix = "hier."
	hierKeyLayout = "hier.layout"
)

var _ interface {
	Redistribute(sources []map[string][]float32, oldWorld, rank, world int) (string, error)
} = (*Hier)(nil)

// State returns Inner's state under "hier." and the layout it belongs to. A hook whose Inner
// keeps no state (allreduce) saves nothing.
func (h *Hier) State() (map[string][]float32, error) {
	st := map[string][]float32{}
	s, ok := h.Inner.(ddp.Stateful)
	if !ok {
		return st, nil
	}
	inner, err := s.State()
	if err != nil {
		return nil, err
	}
	for k, v := range inner {
		st[hierKeyPrefix+k] = v
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	lay := h.restored
	if h.g != nil {
		lay = &h.lay
	}
	if lay != nil {
		var meta []float32
		for _, v := range []int{lay.nodes, lay.perNode, lay.node, lay.local} {
			meta = append(meta, packU64(uint64(v))...)
		}
		st[hierKeyLayout] = meta
	}
	return st, nil
}

// LoadState restores Inner's state; the layout it was saved on is checked against the
// topology on the next call (another one is refused, naming both).
func (h *Hier) LoadState(st map[string][]float32) error {
	inner := map[string][]float32{}
	var lay *hierLayout
	for k, v := range st {
		switch {
		case k == hierKeyLayout:
			if len(v) != 8 {
				return fmt.Errorf("hooks: %s: LoadState: %q has %d values, want 8", h.Name(), k, len(v))
			}
			lay = &hierLayout{nodes: int(unpackU64(v)), perNode: int(unpackU64(v[2:])), node: int(unpackU64(v[4:])), local: int(unpackU64(v[6:]))}
		case strings.HasPrefix(k, hierKeyPrefix):
			inner[strings.TrimPrefix(k, hierKeyPrefix)] = v
		default:
			return fmt.Errorf("hooks: %s: LoadState: key %q is not hier state", h.Name(), k)
		}
	}
	s, ok := h.Inner.(ddp.Stateful)
	switch {
	case ok:
		if err := s.LoadState(inner); err != nil {
			return err
		}
	case len(inner) > 0:
		return fmt.Errorf("hooks: %s: LoadState: %s keeps no state, got %d keys", h.Name(), h.Inner.Name(), len(inner))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.restored, h.g = lay, nil // the next call checks the layout against its topology
	if lay != nil {
		h.lay, h.learnt = *lay, true
	}
	return nil
}

// Redistribute refuses to carry hier's state to another world size (checkpoint's
// Redistributor): Inner's residuals live on the shards of the node-local reduce-scatter, whose
// bounds and owners change with the topology. A hook whose Inner keeps no state has nothing to
// carry.
func (h *Hier) Redistribute(sources []map[string][]float32, oldWorld, rank, world int) (string, error) {
	if _, ok := h.Inner.(ddp.Stateful); !ok {
		return "", nil
	}
	for _, src := range sources {
		if len(src) > 0 {
			return "", fmt.Errorf("hooks: %s: cannot move its state from %d ranks to %d: %s's residuals live on the shards each local rank reduces across the nodes, which change with the topology; resume on %d ranks with the same nodes, or start without the checkpoint's hook state",
				h.Name(), oldWorld, world, h.Inner.Name(), oldWorld)
		}
	}
	return "", nil
}
