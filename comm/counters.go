package comm

import (
	"fmt"
	"sync/atomic"
)

// Counters are per-rank communication statistics, updated atomically. Transports count bytes
// and messages; collectives count rounds (see the package doc for what a round is).
// The zero value is ready to use.
type Counters struct {
	bytesSent, bytesRecv atomic.Int64
	msgsSent, msgsRecv   atomic.Int64
	rounds               atomic.Int64
	interSent, interRecv atomic.Int64 // payload bytes to and from ranks on other nodes
}

// Stats is a snapshot of Counters. Bytes are payload bytes (a word is 4 of them); transport
// framing is not counted.
type Stats struct {
	BytesSent, BytesRecv, MsgsSent, MsgsRecv, Rounds int64
	// InterBytesSent and InterBytesRecv are the part of BytesSent and BytesRecv exchanged with
	// ranks on other nodes (see Topology); they stay 0 on a group that does not know its topology.
	InterBytesSent, InterBytesRecv int64
}

// AddSent counts one message of n payload bytes sent. Transports call it.
func (c *Counters) AddSent(n int) {
	c.bytesSent.Add(int64(n))
	c.msgsSent.Add(1)
}

// AddRecv counts one message of n payload bytes received. Transports call it.
func (c *Counters) AddRecv(n int) {
	c.bytesRecv.Add(int64(n))
	c.msgsRecv.Add(1)
}

// AddInterSent counts n payload bytes, already counted by AddSent, as sent to a rank on another
// node. Topology-aware groups call it.
func (c *Counters) AddInterSent(n int) { c.interSent.Add(int64(n)) }

// AddInterRecv counts n payload bytes, already counted by AddRecv, as received from a rank on
// another node. Topology-aware groups call it.
func (c *Counters) AddInterRecv(n int) { c.interRecv.Add(int64(n)) }

// add counts the traffic of s (a collective run on another group's Counters, see sharedAllReduce).
func (c *Counters) add(s Stats) {
	c.bytesSent.Add(s.BytesSent)
	c.bytesRecv.Add(s.BytesRecv)
	c.msgsSent.Add(s.MsgsSent)
	c.msgsRecv.Add(s.MsgsRecv)
	c.rounds.Add(s.Rounds)
	c.interSent.Add(s.InterBytesSent)
	c.interRecv.Add(s.InterBytesRecv)
}

// AddRound counts n rounds. Collectives call it once per round: once per group of messages
// posted together and then awaited together.
func (c *Counters) AddRound(n int) { c.rounds.Add(int64(n)) }

// Snapshot returns the current values. Each field is read atomically; the set is consistent
// only when no operation is in flight.
func (c *Counters) Snapshot() Stats {
	return Stats{
		BytesSent: c.bytesSent.Load(),
		BytesRecv: c.bytesRecv.Load(),
		MsgsSent:  c.msgsSent.Load(),
		MsgsRecv:  c.msgsRecv.Load(),
		Rounds:    c.rounds.Load(),

		InterBytesSent: c.interSent.Load(),
		InterBytesRecv: c.interRecv.Load(),
	}
}

// Reset sets every counter to zero. To measure one operation while others may run, prefer
// the difference of two Snapshots (Stats.Sub).
func (c *Counters) Reset() {
	c.bytesSent.Store(0)
	c.bytesRecv.Store(0)
	c.msgsSent.Store(0)
	c.msgsRecv.Store(0)
	c.rounds.Store(0)
	c.interSent.Store(0)
	c.interRecv.Store(0)
}

// Sub returns s - o field by field: the traffic between two snapshots.
func (s Stats) Sub(o Stats) Stats {
	return Stats{
		BytesSent: s.BytesSent - o.BytesSent,
		BytesRecv: s.BytesRecv - o.BytesRecv,
		MsgsSent:  s.MsgsSent - o.MsgsSent,
		MsgsRecv:  s.MsgsRecv - o.MsgsRecv,
		Rounds:    s.Rounds - o.Rounds,

		InterBytesSent: s.InterBytesSent - o.InterBytesSent,
		InterBytesRecv: s.InterBytesRecv - o.InterBytesRecv,
	}
}

// Add returns s + o field by field, e.g. to total the stats of all ranks.
func (s Stats) Add(o Stats) Stats {
	return Stats{
		BytesSent: s.BytesSent + o.BytesSent,
		BytesRecv: s.BytesRecv + o.BytesRecv,
		MsgsSent:  s.MsgsSent + o.MsgsSent,
		MsgsRecv:  s.MsgsRecv + o.MsgsRecv,
		Rounds:    s.Rounds + o.Rounds,

		InterBytesSent: s.InterBytesSent + o.InterBytesSent,
		InterBytesRecv: s.InterBytesRecv + o.InterBytesRecv,
	}
}

// WordsRecv is BytesRecv in 4-byte words, the unit of the cost formulas in docs/ALGORITHMS.md.
func (s Stats) WordsRecv() float64 { return float64(s.BytesRecv) / 4 }

// InterWordsRecv is InterBytesRecv in 4-byte words: what crossed nodes into this rank.
func (s Stats) InterWordsRecv() float64 { return float64(s.InterBytesRecv) / 4 }

func (s Stats) String() string {
	return fmt.Sprintf("sent %d B in %d msgs, recv %d B in %d msgs, %d rounds",
		s.BytesSent, s.MsgsSent, s.BytesRecv, s.MsgsRecv, s.Rounds)
}
