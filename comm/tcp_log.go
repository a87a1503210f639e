package comm

import (
	"fmt"
	"sync"
	"time"
)

// LogLimiter passes on the first notes of each interval (a burst of them) and counts the rest,
// reporting how many it held back once the interval ends: a flood of rejected connections
// costs a few lines per interval, not one per connection. The TCP transport and cluster's store use it for
// rejections. It is safe for concurrent use.
type LogLimiter struct {
	logf     func(format string, args ...any)
	interval time.Duration
	what     string // "rejected connections", in the summary
	burst    int    // notes passed on per interval

	mu      sync.Mutex
	start   time.Time
	passed  int // notes passed on in this interval
	held    int
	flusher *time.Timer
	closed  bool
}

// NewLogLimiter returns a limiter that writes to logf at most burst notes (0 = 10) plus one
// summary per interval (0 = 10 s); what names the notes in the summary ("connections rejected").
func NewLogLimiter(logf func(format string, args ...any), interval time.Duration, burst int, what string) *LogLimiter {
	if interval <= 0 {
		interval = 10 * time.Second
	}
	if burst <= 0 {
		burst = 10
	}
	return &LogLimiter{logf: logf, interval: interval, burst: burst, what: what}
}

// Logf passes the note on or counts it.
func (l *LogLimiter) Logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.closed {
		return
	}
	if l.start.IsZero() || now.Sub(l.start) >= l.interval {
		l.flushLocked()
		l.start, l.passed = now, 0
	}
	if l.passed < l.burst {
		l.passed++
		l.logf(format, args...)
		return
	}
	l.held++
	if l.flusher == nil {
		l.flusher = time.AfterFunc(l.start.Add(l.interval).Sub(now), func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.flusher = nil
			l.flushLocked()
		})
	}
}

// flushLocked reports the notes held back, if any.
func (l *LogLimiter) flushLocked() {
	if l.held > 0 {
		l.logf("%s", fmt.Sprintf("%d more %s in %v, not logged one by one", l.held, l.what, l.interval))
		l.held = 0
	}
	if l.flusher != nil {
		l.flusher.Stop()
		l.flusher = nil
	}
}

// Close reports the notes held back and stops; later notes are dropped.
func (l *LogLimiter) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flushLocked()
	l.closed = true
}
