package ddp

import "time"

// Timed is implemented by the buckets DDP hands to comm hooks: it places a bucket on its
// iteration's timeline, for hooks that weigh communication against backward computation
// (COVAP's CCR profiler). Hooks must not assume it: a Bucket built elsewhere (a test's)
// may lack it.
type Timed interface {
	// ReadyAfter is the time from the start of this iteration's backward until the
	// bucket's last gradient was final (BucketStats.Ready). For the last bucket it is the
	// backward computation time, up to the gradients of parameters the forward did not use.
	ReadyAfter() time.Duration
}

var _ Timed = (*bucket)(nil)

// ReadyAfter implements Timed. The Reducer sets stats.Ready before it launches the bucket,
// so the value is this iteration's when the hook's Run reads it.
func (b *bucket) ReadyAfter() time.Duration { return b.stats.Ready }
