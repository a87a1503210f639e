package overlap_test

import (
	"context"
	"fmt"
	"os"

	"github.com/spargo-dl/spargo/cmd/spargo/internal/overlap"
	"github.com/spargo-dl/spargo/models"
)

// TopK-SGD's single group against OMGS's plan on ResNet-20, 2 in-process workers. The timings
// depend on the machine, so the example prints them without checking.
func ExampleRunLocal() {
	entry, err := models.Lookup("resnet20")
	if err != nil {
		fmt.Println(err)
		return
	}
	hs, err := overlap.ParseHooks("topka:density=0.01", "omgs:density=0.01")
	if err != nil {
		fmt.Println(err)
		return
	}
	cfg := overlap.Config{Model: entry, Hooks: hs, SingleBucket: true, Batch: 2, Warmup: 1, Iters: 3, Trace: true}
	rep, err := overlap.RunLocal(context.Background(), 2, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, h := range rep.Hooks {
		fmt.Printf("%s: %d groups, %.1f ms after backward\n", h.Hook, h.Groups, h.NonOverlappedMS)
	}
	rep.WriteText(os.Stdout) // the table and each hook's trace
}
