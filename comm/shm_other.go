//go:build !linux

package comm

import (
	"context"
	"fmt"
	"runtime"
)

// NewShm needs Linux (futexes and /proc); elsewhere it fails with an error that says so.
func NewShm(ctx context.Context, cfg ShmConfig) (Group, error) {
	return nil, fmt.Errorf("comm: NewShm: the shared-memory transport needs Linux (this is %s); use NewTCP", runtime.GOOS)
}

func newShmLocal(ctx context.Context, size int, configure func(*ShmConfig)) ([]Group, error) {
	return nil, fmt.Errorf("comm: NewShmLocal: the shared-memory transport needs Linux (this is %s)", runtime.GOOS)
}

func sharedAllReduce[T Element](ctx context.Context, g Group, tag uint32, buf []T, add func(dst, a, b []T), anyDst bool) (bool, error) {
	return false, nil
}

func isSharedMemory(g Group) bool { return false }

func allocSharedBytes(ctx context.Context, g Group, tag uint32, n int) ([]byte, error) {
	return nil, nil
}
