package main

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spargo-dl/spargo/examples/internal/cifar"
	"github.com/spargo-dl/spargo/gradrec"
)

// -record-grads writes one file per rank of the scheduled iterations, with the model's
// parameters and DDP's buckets, readable by spargo bench comm -grads.
func TestRunRecordsGrads(t *testing.T) {
	dir := cifarMini
	rec := filepath.Join(t.TempDir(), "grads")
	var out, errb bytes.Buffer
	c := defaults()
	c.Data, c.Workers, c.Batch, c.Epochs, c.Steps, c.EvalLimit, c.Progress = dir, 2, 2, 1, 3, 8, false
	c.RecordGrads, c.RecordEvery, c.RecordSteps = rec, 2, 1
	_, err := cifar.Run(context.Background(), c, &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	r, err := gradrec.Open(rec)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Iterations, []int64{0, 2}) || r.World != 2 || r.Model != "vgg11" || r.Hook != "allreduce" ||
		len(r.Names) != 34 || r.Names[0] != "features.0.weight" || len(r.Buckets) != 3 || r.Elements() != 9231114 {
		t.Errorf("recording: iterations %v, P=%d, model %q, hook %q, %d parameters (%v…), %d buckets, %d elements",
			r.Iterations, r.World, r.Model, r.Hook, len(r.Names), r.Names[0], len(r.Buckets), r.Elements())
	}
}

func TestRunRejectsBadRecordFlags(t *testing.T) {
	var out bytes.Buffer
	c := defaults()
	c.Workers, c.Batch, c.Epochs, c.Progress = 1, 1, 1, false
	c.RecordGrads, c.RecordEvery, c.RecordSteps = t.TempDir(), 1, 2
	_, err := cifar.Run(context.Background(), c, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "-record-every 1") {
		t.Fatalf("-record-every 1 -record-steps 2: %v", err)
	}
}
