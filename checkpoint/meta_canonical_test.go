package checkpoint

import (
	"encoding/json"
	"strings"
	"testing"
)

// Meta.Check compares the saved Hook and Config in the resuming run's form when the run
// gives a Canonical: a spec saved as it was typed matches its canonical form, another one
// does not, and the error names both as compared. Canonical is not part of meta.json.
func TestMetaCheckCanonical(t *testing.T) {
	canon := func(field, value string) string {
		if field == "hook" && value == "spardl" || field == "optim" && value == "adam" {
			return value + ":full"
		}
		return value
	}
	saved := Meta{Model: "m", Hook: "spardl", World: 2, Config: map[string]string{"optim": "adam", "lr": "0.1"}}
	run := Meta{Model: "m", Hook: "spardl:full", World: 2, Config: map[string]string{"optim": "adam:full", "lr": "0.1"}, Canonical: canon}
	if err := saved.Check(run); err != nil {
		t.Fatalf("canonical forms match: %v", err)
	}
	if saved.Hook != "spardl" || saved.Config["optim"] != "adam" {
		t.Fatalf("Check changed the saved Meta: %+v", saved)
	}
	plain := run
	plain.Canonical = nil
	if err := saved.Check(plain); err == nil || !strings.Contains(err.Error(), `hook "spardl", this run "spardl:full"`) {
		t.Fatalf("without Canonical: %v", err)
	}
	run.Hook = "oktopk:full"
	if err := saved.Check(run); err == nil || !strings.Contains(err.Error(), `hook "spardl:full", this run "oktopk:full"`) {
		t.Fatalf("another hook: %v", err)
	}
	b, err := json.Marshal(run)
	if err != nil || strings.Contains(string(b), "anonical") {
		t.Fatalf("meta.json: %s (%v)", b, err)
	}
}
