package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/spargo-dl/spargo/datasets"
	"github.com/spargo-dl/spargo/models"
	"github.com/spargo-dl/spargo/nn"
	"github.com/spargo-dl/spargo/safetensors"
)

// batchDump writes a rank's first training batches for -dump-batches (nil: nothing to do).
type batchDump struct {
	f      *os.File
	w      *bufio.Writer
	left   int
	path   string
	closed bool
}

// openDump writes init.safetensors (rank 0) and opens this rank's batch file, for
// -dump-batches; it returns nil without that flag.
func (w *mlmWorker) openDump(model *models.BertForPreTraining) (*batchDump, error) {
	c, rank := w.cfg, w.group.Rank()
	if c.DumpBatches == "" {
		return nil, nil
	}
	if err := os.MkdirAll(c.DumpBatches, 0o755); err != nil {
		return nil, fmt.Errorf("-dump-batches: %w", err)
	}
	if rank == 0 {
		st := safetensors.New()
		for _, p := range nn.Parameters(model) {
			st.Tensors[p.Name] = safetensors.FromFloat32(slices.Clone(p.Value.Data), p.Value.Shape...)
		}
		for k, v := range map[string]string{"workers": strconv.Itoa(w.group.Size()), "batch": strconv.Itoa(c.Batch), "seq": strconv.Itoa(c.Seq),
			"steps": strconv.Itoa(c.Steps), "dump_steps": strconv.Itoa(c.DumpSteps), "seed": strconv.FormatUint(c.Seed, 10), "model": c.Model} {
			st.Metadata[k] = v
		}
		if err := st.WriteFile(filepath.Join(c.DumpBatches, "init.safetensors")); err != nil {
			return nil, fmt.Errorf("-dump-batches: %w", err)
		}
	}
	path := filepath.Join(c.DumpBatches, fmt.Sprintf("rank%d.bin", rank))
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("-dump-batches: %w", err)
	}
	return &batchDump{f: f, w: bufio.NewWriter(f), left: c.DumpSteps, path: path}, nil
}

// write appends b while steps are left to dump.
func (d *batchDump) write(b datasets.MLMBatch) error {
	if d == nil || d.left == 0 {
		return nil
	}
	d.left--
	for _, a := range [][]int32{b.InputIDs, b.TokenTypeIDs, b.AttentionMask, b.Labels, b.NextSentence} {
		if err := binary.Write(d.w, binary.LittleEndian, a); err != nil {
			return fmt.Errorf("-dump-batches: %s: %w", d.path, err)
		}
	}
	if d.left == 0 {
		return d.Close()
	}
	return nil
}

// Close flushes and closes the file (once).
func (d *batchDump) Close() error {
	if d == nil || d.closed {
		return nil
	}
	d.closed = true
	err := d.w.Flush()
	if cerr := d.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("-dump-batches: %s: %w", d.path, err)
	}
	return nil
}
