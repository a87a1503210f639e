package plot_test

import (
	"fmt"
	"image/png"
	"os"
	"path/filepath"

	"github.com/spargo-dl/spargo/plot"
)

// A training program that wrote -metrics draws it for -plot.
func ExampleFile() {
	dir, _ := os.MkdirTemp("", "plot-example")
	defer os.RemoveAll(dir)
	metrics := filepath.Join(dir, "run.jsonl")
	os.WriteFile(metrics, []byte(`{"epoch":1,"steps":100,"train_loss":2.1,"train_acc":0.31,"test_loss":1.9,"test_acc":0.35,"total_s":40}
{"epoch":2,"steps":100,"train_loss":1.6,"train_acc":0.45,"test_loss":1.5,"test_acc":0.48,"total_s":80}
{"summary":true,"config":{"hook":"allreduce"},"epochs":[]}
`), 0o644)

	out := filepath.Join(dir, "run.png")
	if err := plot.File(metrics, out); err != nil {
		fmt.Println(err)
		return
	}
	f, _ := os.Open(out)
	defer f.Close()
	cfg, _ := png.DecodeConfig(f)
	fmt.Printf("%d×%d PNG: loss and accuracy against steps and wall time\n", cfg.Width, cfg.Height)
	// Output: 1120×760 PNG: loss and accuracy against steps and wall time
}

// Runs of different hooks overlaid against epochs; legends come from the runs' hooks.
func ExampleCompareWith() {
	dir, _ := os.MkdirTemp("", "plot-example")
	defer os.RemoveAll(dir)
	var files []string
	for i, hook := range []string{"allreduce", "spardl:density=0.01"} {
		path := filepath.Join(dir, fmt.Sprintf("run%d.jsonl", i))
		os.WriteFile(path, fmt.Appendf(nil, `{"hook":%q}
{"step":50,"loss":%g,"total_s":10}
{"step":100,"loss":%g,"total_s":20}
{"epoch":1,"steps":100,"val_ppl":%g}
`, hook, 5.0+float64(i), 4.5+float64(i), 120.0+10*float64(i)), 0o644)
		files = append(files, path)
	}
	axes, _ := plot.ParseAxes("epochs")
	err := plot.CompareWith(files, filepath.Join(dir, "cmp.png"), plot.Options{Axes: axes, Title: "PTB"})
	fmt.Println(err)
	// Output: <nil>
}
