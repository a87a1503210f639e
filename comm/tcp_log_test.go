package comm

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// A flood of notes is cut to the burst per interval plus one count; nothing is lost from the
// count, and Close reports what it held back.
func TestLogLimiter(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	logf := func(format string, args ...any) {
		mu.Lock()
		lines = append(lines, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	l := NewLogLimiter(logf, time.Hour, 3, "connections rejected")
	for i := range 1000 {
		l.Logf("rejected connection %d", i)
	}
	l.Close()
	l.Logf("after close")
	mu.Lock()
	defer mu.Unlock()
	want := []string{"rejected connection 0", "rejected connection 1", "rejected connection 2", "997 more connections rejected in 1h0m0s, not logged one by one"}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("logged %q, want %q", lines, want)
	}
}

// The count of an interval is reported when it ends, without a later note to carry it.
func TestLogLimiterFlushesAtIntervalEnd(t *testing.T) {
	got := make(chan string, 10)
	l := NewLogLimiter(func(format string, args ...any) { got <- fmt.Sprintf(format, args...) }, 20*time.Millisecond, 1, "notes")
	defer l.Close()
	l.Logf("one")
	l.Logf("two")
	l.Logf("three")
	if s := <-got; s != "one" {
		t.Fatalf("first line %q", s)
	}
	select {
	case s := <-got:
		if s != "2 more notes in 20ms, not logged one by one" {
			t.Fatalf("summary %q", s)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no summary at the end of the interval")
	}
}
