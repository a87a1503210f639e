package spec_test

import (
	"fmt"

	"github.com/spargo-dl/spargo/spec"
)

// Two spellings of the same hook give the same canonical spec; a repeated key is refused.
func Example() {
	options := []spec.Option{
		{Name: "density", Default: "0.01", Kind: spec.Float},
		{Name: "teams", Default: "1", Kind: spec.Int},
	}
	for _, s := range []string{"spardl", "spardl:teams=1,density=0.010", "spardl:density=0.05", "spardl:teams=2,teams=4"} {
		p, err := spec.Parse(s)
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		b, err := p.Bind(options)
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Println(b)
	}
	// Output:
	// spardl:density=0.01,teams=1
	// spardl:density=0.01,teams=1
	// spardl:density=0.05,teams=1
	// error: spardl: option teams given twice in "spardl:teams=2,teams=4"
}
