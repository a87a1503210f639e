package comm

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// newShm returns p ranks of one process over a shared segment in a temporary directory
// (closed when the test ends), with an optional change to every rank's configuration. It
// skips the test where the transport does not exist.
func newShm(t testing.TB, p int, configure ...func(*ShmConfig)) []Group {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the shared-memory transport needs Linux")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := t.TempDir()
	log := &testLog{t: t}
	groups, err := newShmLocal(ctx, p, func(c *ShmConfig) {
		c.Dir = dir
		c.Logf = log.logf
		for _, f := range configure {
			f(c)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll(groups) })
	return groups
}
