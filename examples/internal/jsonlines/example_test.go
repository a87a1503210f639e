package jsonlines_test

import (
	"fmt"

	"github.com/spargo-dl/spargo/examples/internal/jsonlines"
	"github.com/spargo-dl/spargo/train"
)

func Example() {
	stdout, stderr := jsonlines.NewOutput(), jsonlines.NewOutput()
	fmt.Fprintln(stdout.Printer, "model tiny: 6 parameters")
	_ = train.Print(stdout.Printer, "epoch", struct {
		Epoch     int     `json:"epoch"`
		TrainLoss float64 `json:"train_loss"`
	}{1, 2.25}, "epoch 1 train_loss 2.2500")
	recs, err := jsonlines.Parse(stdout.String(), stderr.String())
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range recs {
		fmt.Println(r.Msg(), r["train_loss"])
	}
	// Output:
	// model tiny: 6 parameters <nil>
	// epoch 2.25
}
