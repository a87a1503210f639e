package hooks

import (
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/comm"
	"github.com/spargo-dl/spargo/ddp"
)

func TestParse(t *testing.T) {
	h, err := Parse("allreduce")
	if err != nil || h.Name() != "allreduce" || h.(*ddp.AllReduceHook).Algorithm != comm.Auto {
		t.Fatalf("allreduce: %v %v", h, err)
	}
	h, err = Parse("allreduce:algorithm=ring")
	if err != nil || h.(*ddp.AllReduceHook).Algorithm != comm.Ring {
		t.Fatalf("allreduce:algorithm=ring: %v %v", h, err)
	}
	for spec, want := range map[string]string{
		"nope":                     `unknown hook "nope" in "nope" (registered: 8bit, allreduce`,
		"allreduce:algo=ring":      `allreduce has no option "algo" (options: algorithm)`,
		"allreduce:algorithm":      `option "algorithm" is not key=value`,
		"allreduce:algorithm=tree": `option algorithm="tree", want one of auto|ring|rabenseifner|recursive_doubling`,
	} {
		if _, err := Parse(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want error containing %q", spec, err, want)
		}
	}
}

func TestHelpListsOptionsAndDefaults(t *testing.T) {
	h := Help()
	for _, want := range []string{"allreduce", "algorithm", "default auto"} {
		if !strings.Contains(h, want) {
			t.Errorf("Help() lacks %q:\n%s", want, h)
		}
	}
}
