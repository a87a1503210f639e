package comm

import (
	"context"
	"fmt"
	"unsafe"
)

// AllocShared returns n zeroed elements of memory for a vector that AllReduce on g sums in
// place. On a shared-memory group (NewShm, NewShmLocal, or a view of one such as a job's group
// whose ranks all run on one host) the memory is mapped by every rank, and the shared all-reduce
// of a slice of it reads the peers' slices where they lie instead of copying every vector
// through the segment: about 40 % less memory traffic than a vector in ordinary memory
// (BENCHMARKS.md, "Dense all-reduce between processes on one host"). This needs every rank to
// pass a slice at the same offset of its allocation; otherwise the all-reduce copies, as for
// any other vector, with the same result bits either way. DDP allocates its buckets here.
//
// AllocShared is collective: every rank calls it with the same tag and n, in the same order.
// Where the memory cannot be shared (another transport, a single rank, a rank that cannot make
// or map its file, a full /dev/shm: logged through the group's Logf), every rank gets ordinary
// memory instead. The memory stays valid after the group is closed (it becomes private then)
// and lives as long as the process.
func AllocShared[T Element](ctx context.Context, g Group, tag uint32, n int) ([]T, error) {
	if err := checkGroup("AllocShared", g); err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, fmt.Errorf("comm: AllocShared: rank %d: negative length %d", g.Rank(), n)
	}
	if n == 0 || g.Size() == 1 {
		return make([]T, n), nil
	}
	b, err := allocSharedBytes(ctx, g, tag, n*elementSize[T]())
	if err != nil {
		return nil, err
	}
	if b == nil {
		return make([]T, n), nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n), nil
}
