package train

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"
)

// Printer is where a program prints its lines, in the -log-format the user chose: "text"
// passes every write through as it is; "json" makes every line one JSON object, the shape of
// slog's JSON handler (time, level, msg, then the record's fields), so that a log collector
// can read all of a run's output. Main hands a program Printers for its stdout and stderr.
//
// Lines written through Write (fmt.Fprintf(stdout, …)) become {"msg": line} in JSON; Record
// gives a line its fields too. A Printer is safe for concurrent use; in JSON it writes each
// line with one Write call, so that lines of concurrent writers do not interleave.
type Printer struct {
	mu   sync.Mutex
	w    io.Writer
	json bool
	part []byte // JSON: a line written in pieces, until its newline
	now  func() time.Time
}

// NewPrinter returns the Printer of -log-format format ("text" or "json") on w.
func NewPrinter(w io.Writer, format string) (*Printer, error) {
	switch format {
	case "text", "":
		return &Printer{w: w, now: time.Now}, nil
	case "json":
		return &Printer{w: w, json: true, now: time.Now}, nil
	}
	return nil, fmt.Errorf("-log-format %q: want text or json", format)
}

// Out is what a program prints on: p itself in JSON; in text the writer under it, so that a
// terminal is still seen as one (a progress bar, a download's bar).
func (p *Printer) Out() io.Writer {
	if p.json {
		return p
	}
	return p.w
}

// JSON reports whether p prints JSON lines.
func (p *Printer) JSON() bool { return p.json }

// Writer is the writer p prints on.
func (p *Printer) Writer() io.Writer { return p.w }

// Write prints b: as it is in text; in JSON each complete line as {"time", "level": "INFO",
// "msg": line} (a trailing piece without its newline waits for the rest, or Flush).
func (p *Printer) Write(b []byte) (int, error) {
	if !p.json {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.w.Write(b)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			p.part = append(p.part, b...)
			break
		}
		line := string(append(p.part, b[:i]...))
		p.part, b = p.part[:0], b[i+1:]
		if err := p.writeJSON(slog.LevelInfo, line, nil); err != nil {
			return n - len(b), err
		}
	}
	return n, nil
}

// Flush prints a line written without its final newline.
func (p *Printer) Flush() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.json || len(p.part) == 0 {
		return nil
	}
	line := string(p.part)
	p.part = p.part[:0]
	return p.writeJSON(slog.LevelInfo, line, nil)
}

// Record prints one line: text (without its newline) in text; in JSON the object {"time",
// "level": "INFO", "msg": msg} with fields's fields after them (a struct with JSON tags, a
// map, or nil).
func (p *Printer) Record(msg string, fields any, text string) error {
	return p.record(slog.LevelInfo, msg, fields, text)
}

// Error prints an error line: "text" in text; {"level": "ERROR", "msg": msg, "error": err} in
// JSON.
func (p *Printer) Error(msg string, err error, text string) error {
	return p.record(slog.LevelError, msg, map[string]string{"error": err.Error()}, text)
}

func (p *Printer) record(level slog.Level, msg string, fields any, text string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.json {
		_, err := io.WriteString(p.w, text+"\n")
		return err
	}
	return p.writeJSON(level, msg, fields)
}

// writeJSON writes one JSON line: time, level and msg, then fields's own fields. p.mu is
// held.
func (p *Printer) writeJSON(level slog.Level, msg string, fields any) error {
	head, err := json.Marshal(struct {
		Time  string `json:"time"`
		Level string `json:"level"`
		Msg   string `json:"msg"`
	}{p.now().Format(time.RFC3339Nano), level.String(), msg})
	if err != nil {
		return err
	}
	line := head
	if fields != nil {
		body, err := marshalFinite(fields)
		if err != nil {
			return fmt.Errorf("print %q: %w", msg, err)
		}
		if len(body) < 2 || body[0] != '{' {
			return fmt.Errorf("print %q: fields of type %T are not a JSON object", msg, fields)
		}
		if len(body) > 2 { // {"time",…,"msg":…} + , + the fields' members
			line = append(append(head[:len(head)-1:len(head)-1], ','), body[1:]...)
		}
	}
	_, err = p.w.Write(append(line, '\n'))
	return err
}

// Print prints one record on w: through Record when w is a *Printer, else text and a newline
// as they are. A program's printing goes through it, so that -log-format json gives every
// line, fields included: train.Print(stdout, "epoch", res, line).
func Print(w io.Writer, msg string, fields any, text string) error {
	if p, ok := w.(*Printer); ok {
		return p.Record(msg, fields, text)
	}
	_, err := io.WriteString(w, text+"\n")
	return err
}

// Outputs returns the Printers of a program's stdout and stderr for -log-format format.
func Outputs(format string) (stdout, stderr *Printer, err error) {
	if stdout, err = NewPrinter(os.Stdout, format); err != nil {
		return nil, nil, err
	}
	stderr, _ = NewPrinter(os.Stderr, format)
	return stdout, stderr, nil
}
