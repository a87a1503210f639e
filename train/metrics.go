package train

import (
	"fmt"
	"io"
	"os"

	"github.com/spargo-dl/spargo/checkpoint"
)

// OpenMetrics opens a -metrics JSON-lines file: truncated for a new run, appended to when
// resuming, so that a resumed run's file holds every epoch once.
func OpenMetrics(path string, resume bool) (*os.File, error) {
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if resume {
		flags = os.O_WRONLY | os.O_CREATE | os.O_APPEND
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("-metrics: %w", err)
	}
	return f, nil
}

// MetricsLog is rank 0's -metrics file: JSON lines of records (StepRecord and the
// program's epoch records), then the run's summary. A nil *MetricsLog (no -metrics, or
// another rank) writes nothing, so every rank may call its methods.
type MetricsLog struct {
	f *os.File
}

// OpenMetricsLog opens path (OpenMetrics: appended to when resuming); nil when path is
// empty.
func OpenMetricsLog(path string, resume bool) (*MetricsLog, error) {
	if path == "" {
		return nil, nil
	}
	f, err := OpenMetrics(path, resume)
	if err != nil {
		return nil, err
	}
	return &MetricsLog{f: f}, nil
}

// Write appends one record. A non-finite number (a diverged run's loss) is written as null.
func (m *MetricsLog) Write(v any) error {
	if m == nil {
		return nil
	}
	return m.encode(v)
}

func (m *MetricsLog) encode(v any) error {
	b, err := marshalFinite(v)
	if err != nil {
		return err
	}
	_, err = m.f.Write(append(b, '\n'))
	return err
}

// Close closes the file (after Finish, or on an error path).
func (m *MetricsLog) Close() {
	if m != nil {
		m.f.Close()
	}
}

// Finish writes the summary as the last line, closes the file and draws -plot from it.
func (m *MetricsLog) Finish(summary any, f *Flags, stdout io.Writer) error {
	if m == nil {
		return nil
	}
	if err := m.encode(summary); err != nil {
		return err
	}
	if err := m.f.Close(); err != nil {
		return fmt.Errorf("-metrics: %w", err)
	}
	if err := f.DrawPlot(); err != nil {
		return err
	}
	if f.Plot != "" {
		fmt.Fprintf(stdout, "plot: %s\n", f.Plot)
	}
	return nil
}

// Report makes the loop of rank rank report as a program's rank 0 does: step records into
// metrics, a progress bar on stderr when progress is set, and a line on stdout per saved
// checkpoint (describe says where in the run it is). Other ranks report nothing.
func (l *Loop[B]) Report(rank int, metrics *MetricsLog, progress bool, stdout, stderr io.Writer, describe func(checkpoint.Position) string) {
	if rank != 0 {
		return
	}
	if metrics != nil {
		l.LogStep = func(rec StepRecord) error { return metrics.Write(rec) }
	}
	if progress {
		l.Progress = stderr
	}
	if l.Checkpoints != nil {
		l.Checkpoints.Saved = func(path string, pos checkpoint.Position) {
			fmt.Fprintf(stdout, "checkpoint %s (%s)\n", path, describe(pos))
		}
	}
}
