package golden_test

import (
	"fmt"

	"github.com/spargo-dl/spargo/internal/golden"
)

// A test loads a PyTorch golden file and checks its layer against each case: here ReLU
// computed in plain Go against PyTorch's output.
func Example() {
	f, err := golden.Load(golden.Path("activation"))
	if err != nil {
		fmt.Println(err)
		return
	}
	c := f.Cases[0]
	x, want := c.Inputs["x"], c.Outputs["y"]
	got := make([]float32, len(x.Data))
	for i, v := range x.Data {
		got[i] = max(v, 0)
	}
	fmt.Println(c.Name, want.Shape, golden.MaxAbsDiff(got, want.Data))
	// Output: relu [3 2 3 4] 0
}
