package comm

import "time"

// Clocked is implemented by a Group whose rank keeps its own time: comm/simnet's ranks carry
// a virtual clock that the simulated network advances. Code that times its own communication
// (COVAP's profiler) reads the time through Now, so that on a simulated network it measures
// the simulated cost rather than the machine that runs the simulation.
type Clocked interface {
	// Now is the rank's time since an origin of the group's choosing.
	Now() time.Duration
}

// processStart is the origin of Now for groups without a clock of their own.
var processStart = time.Now()

// Now returns rank g's time: its own clock when g is Clocked, otherwise the process's
// monotonic wall time. Only differences of two readings of the same group mean something.
func Now(g Group) time.Duration {
	if c, ok := g.(Clocked); ok {
		return c.Now()
	}
	return time.Since(processStart)
}
