package ddp

import (
	"fmt"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/spargo-dl/spargo/comm"
)

// One hook per rank. A comm hook keeps per-bucket state (residuals, thresholds, its rank,
// the ICS jobs of OSP) for the rank it runs on, so one hook instance shared by two ranks
// mixes their state: SparDL fails obscurely, a dense hook happens to work. New therefore
// binds the hook instance it is given to the new DDP and refuses an instance that another
// rank's open DDP holds. The binding ends with Close, when the DDP becomes garbage, or when
// the same rank of the same group builds a new DDP with the same hook (a rebuilt DDP takes
// the hook over; the old one then refuses Backward).
//
// The bindings are the one process-wide table of this package: ranks that share a hook
// share nothing else that could hold it, and a hook cannot be asked (it is the user's
// type). It holds the hooks it binds, so an address is never reused while it is a key.

// hookID is one reference inside a hook: the address of what a pointer, map or channel
// refers to, with its type (a struct and its first field share an address).
type hookID struct {
	typ  reflect.Type
	addr uintptr
}

type binding struct {
	ddp   uint64 // the serial of the DDP holding the hook
	hook  CommHook
	group comm.Group // nil when the group's dynamic type is not comparable
	rank  int
	size  int
}

var (
	bindMu   sync.Mutex
	bindings = map[hookID]binding{}
	ddpSeq   atomic.Uint64
)

var commHookType = reflect.TypeFor[CommHook]()

// hookIDs returns the identities of h: its own reference when it is a pointer (to a type of
// non-zero size: all zero-size values share one address), map or channel, and those of the
// hooks it wraps (struct fields holding a CommHook, OSP's or the 16-bit wrappers' inner
// hook). A hook value without references (AllReduceHook, hooks.Noop) is copied into each
// DDP, carries no state and has no identity: sharing it is harmless.
func hookIDs(h CommHook) []hookID {
	var ids []hookID
	collectHookIDs(reflect.ValueOf(h), 0, &ids)
	return ids
}

func collectHookIDs(v reflect.Value, depth int, ids *[]hookID) {
	if depth > 4 || !v.IsValid() {
		return
	}
	switch v.Kind() {
	case reflect.Interface:
		if !v.IsNil() {
			collectHookIDs(v.Elem(), depth, ids)
		}
	case reflect.Pointer:
		if v.IsNil() {
			return
		}
		if v.Type().Elem().Size() > 0 {
			*ids = append(*ids, hookID{v.Type(), v.Pointer()})
		}
		collectWrapped(v.Elem(), depth, ids)
	case reflect.Map, reflect.Chan:
		if !v.IsNil() {
			*ids = append(*ids, hookID{v.Type(), v.Pointer()})
		}
	case reflect.Struct:
		collectWrapped(v, depth, ids)
	}
}

// collectWrapped adds the identities of the hooks held in v's fields (v a struct).
func collectWrapped(v reflect.Value, depth int, ids *[]hookID) {
	if v.Kind() != reflect.Struct {
		return
	}
	for i := range v.NumField() {
		f := v.Field(i)
		switch {
		case f.Kind() == reflect.Interface && !f.IsNil() && f.Elem().Type().Implements(commHookType):
			collectHookIDs(f.Elem(), depth+1, ids)
		case f.Kind() != reflect.Interface && f.Type().Implements(commHookType):
			collectHookIDs(f, depth+1, ids)
		}
	}
}

// sameGroup reports whether a and b are the same comparable Group value.
func sameGroup(a, b comm.Group) bool {
	if a == nil || b == nil || reflect.TypeOf(a) != reflect.TypeOf(b) || !reflect.TypeOf(a).Comparable() {
		return false
	}
	return a == b
}

// bindHook binds d.cfg.hook to d, or says which rank's DDP holds it.
func (d *DDP) bindHook() error {
	ids := hookIDs(d.cfg.hook)
	d.serial = ddpSeq.Add(1)
	if len(ids) == 0 {
		return nil
	}
	g := d.group
	if !reflect.TypeOf(g).Comparable() {
		g = nil
	}
	bindMu.Lock()
	defer bindMu.Unlock()
	for _, id := range ids {
		b, ok := bindings[id]
		if !ok || b.ddp == d.serial {
			continue
		}
		if b.rank == d.group.Rank() && b.size == d.group.Size() && sameGroup(b.group, g) {
			continue // this rank rebuilds its DDP: the new one takes the hook over
		}
		what := "the hook"
		if id.typ != reflect.TypeOf(d.cfg.hook) {
			what = fmt.Sprintf("a hook it wraps (%v)", id.typ)
		}
		return fmt.Errorf("ddp: rank %d: hook %s (%T): %s is already bound to the open DDP of rank %d of %d: "+
			"build one hook per rank (hooks.Config.New / hooks.Parse on each rank), or Close that DDP first",
			d.group.Rank(), d.cfg.hook.Name(), d.cfg.hook, what, b.rank, b.size)
	}
	for _, id := range ids {
		bindings[id] = binding{ddp: d.serial, hook: d.cfg.hook, group: g, rank: d.group.Rank(), size: d.group.Size()}
	}
	d.hookIDs = ids
	// A DDP dropped without Close frees its hook when it is collected. The cleanup holds
	// the identities and the serial, not d.
	runtime.AddCleanup(d, releaseHook, release{ids, d.serial})
	return nil
}

type release struct {
	ids    []hookID
	serial uint64
}

// releaseHook ends the bindings that DDP r.serial still holds.
func releaseHook(r release) {
	bindMu.Lock()
	defer bindMu.Unlock()
	for _, id := range r.ids {
		if b, ok := bindings[id]; ok && b.ddp == r.serial {
			delete(bindings, id)
		}
	}
}

// holdsHook returns nil while d holds its hook, else why d may not run it any more.
func (d *DDP) holdsHook() error {
	if d.closed {
		return fmt.Errorf("ddp: rank %d: DDP is closed", d.group.Rank())
	}
	if len(d.hookIDs) == 0 {
		return nil
	}
	bindMu.Lock()
	defer bindMu.Unlock()
	if b, ok := bindings[d.hookIDs[0]]; !ok || b.ddp != d.serial {
		return fmt.Errorf("ddp: rank %d: hook %s was taken over by a newer DDP of this rank (ddp.New with the same hook): use that one",
			d.group.Rank(), d.cfg.hook.Name())
	}
	return nil
}

// Close ends d: it releases d's comm hook, so that a new DDP (of any rank) may use the
// instance, and makes later Backward calls fail. It does not close the group, which the
// caller owns and may still use (evaluation, a new DDP): a rank that stops early closes its
// group as well, so that the other ranks' collectives fail instead of waiting for it (see
// the package doc). Close is idempotent and returns nil; it must not run concurrently with
// Backward.
func (d *DDP) Close() error {
	if d.closed {
		return nil
	}
	d.closed = true
	releaseHook(release{d.hookIDs, d.serial})
	return nil
}
