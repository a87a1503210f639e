package train

import (
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/cluster"
)

func TestCheckWorkers(t *testing.T) {
	env := cluster.Env{Source: cluster.SourceTorchrun, WorldSize: 4}
	for _, tc := range []struct {
		workers int
		set     bool
		ok      bool
	}{{2, false, true}, {1, true, true}, {4, true, true}, {2, true, false}, {8, true, false}} {
		workers := tc.workers
		err := checkWorkers(&workers, tc.set, env)
		if tc.ok != (err == nil) || tc.ok && workers != 4 {
			t.Errorf("-workers %d (set %v): %v, workers now %d", tc.workers, tc.set, err, workers)
		}
		if err != nil && !strings.Contains(err.Error(), "-workers 2, but torchrun started 4 processes") && tc.workers == 2 {
			t.Errorf("error %q", err)
		}
	}
}
