package parity_test

import (
	"fmt"

	"github.com/spargo-dl/spargo/models/internal/parity"
)

// Check runs a committed golden's case in spargo (the weights and inputs PyTorch was given,
// rebuilt from the case's seed) and compares loss and gradients with PyTorch's.
func Example() {
	g, err := parity.LoadGolden("../../../testdata/parity/resnet20.json")
	if err != nil {
		fmt.Println(err)
		return
	}
	lossRel, diffs, err := parity.Check(g)
	fmt.Println(g.Case.Model, "batch", g.Case.Batch, "loss within 1e-4:", lossRel < 1e-4, "tensors compared:", len(diffs) > 0, "error:", err)
	// Output: resnet20 batch 8 loss within 1e-4: true tensors compared: true error: <nil>
}
