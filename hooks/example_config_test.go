package hooks_test

import (
	"fmt"

	"github.com/spargo-dl/spargo/ddp"
	"github.com/spargo-dl/spargo/hooks"
)

// A spec parses once into a Config: its String is canonical (the same hook written
// differently compares equal), and New builds a fresh hook for each rank. ddp.New refuses a
// hook that cannot run at the group's world size.
func ExampleParseConfig() {
	a, err := hooks.ParseConfig("spardl:teams=2,density=0.050")
	if err != nil {
		fmt.Println(err)
		return
	}
	b, _ := hooks.ParseConfig("spardl:density=5e-2,teams=2")
	fmt.Println(a.String() == b.String(), a.Option("density"), a.Given("residual"))

	h, _ := a.New()
	fmt.Println(ddp.CheckWorldSize(h, 8))
	fmt.Println(ddp.CheckWorldSize(h, 5))

	_, err = hooks.ParseConfig("spardl:teams=2,teams=4")
	fmt.Println(err)
	// Output:
	// true 0.05 false
	// <nil>
	// ddp: hook spardl cannot run at world size P=5: spardl option teams=2 does not divide the world size (divisors of 5: [1 5]; or teams=auto)
	// hooks: spardl: option teams given twice in "spardl:teams=2,teams=4"
}
