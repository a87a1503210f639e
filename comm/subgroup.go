package comm

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Sub returns this rank's view of the sub-communicator made of members (ranks of g, distinct,
// listed in the order that numbers them 0..len(members)-1 in the view). g's own rank must be
// one of them. Every collective of this package runs on the view unchanged: sparse hooks use it
// for SparDL's teams. Messages travel through g under the caller's tags, and the view shares
// g's Counters, so traffic inside the view is counted on the parent rank. Two views that share
// a pair of ranks must not use the same tag at the same time. Closing the view does not close g.
func Sub(g Group, members []int) (Group, error) {
	if err := checkGroup("Sub", g); err != nil {
		return nil, err
	}
	p := g.Size()
	self := -1
	seen := make(map[int]bool, len(members))
	for i, m := range members {
		if m < 0 || m >= p {
			return nil, fmt.Errorf("comm: Sub: rank %d: member %d is rank %d, outside [0, %d)", g.Rank(), i, m, p)
		}
		if seen[m] {
			return nil, fmt.Errorf("comm: Sub: rank %d: rank %d listed twice in %v", g.Rank(), m, members)
		}
		seen[m] = true
		if m == g.Rank() {
			self = i
		}
	}
	if self < 0 {
		return nil, fmt.Errorf("comm: Sub: rank %d is not among the members %v", g.Rank(), members)
	}
	return &subGroup{parent: g, members: append([]int(nil), members...), rank: self}, nil
}

type subGroup struct {
	parent  Group
	members []int
	rank    int
	closed  atomic.Bool
}

var _ Group = (*subGroup)(nil)

func (s *subGroup) Rank() int           { return s.rank }
func (s *subGroup) Size() int           { return len(s.members) }
func (s *subGroup) Counters() *Counters { return s.parent.Counters() }

// peer maps a view rank to a parent rank, or reports why it cannot.
func (s *subGroup) peer(op string, r int, tag uint32) (int, error) {
	if err := checkPeer(op, s.rank, r, len(s.members), tag); err != nil {
		return 0, fmt.Errorf("sub-group of %v: %w", s.members, err)
	}
	if s.closed.Load() {
		return 0, fmt.Errorf("comm: sub-group rank %d: %s rank %d tag %d: %w", s.rank, op, r, tag, ErrClosed)
	}
	return s.members[r], nil
}

func (s *subGroup) Send(ctx context.Context, to int, tag uint32, payload []byte) error {
	p, err := s.peer("send to", to, tag)
	if err != nil {
		return err
	}
	return s.parent.Send(ctx, p, tag, payload)
}

func (s *subGroup) Recv(ctx context.Context, from int, tag uint32, buf []byte) (int, error) {
	p, err := s.peer("recv from", from, tag)
	if err != nil {
		return 0, err
	}
	return s.parent.Recv(ctx, p, tag, buf)
}

func (s *subGroup) Isend(ctx context.Context, to int, tag uint32, payload []byte) *Request {
	p, err := s.peer("send to", to, tag)
	if err != nil {
		return DoneRequest(0, err)
	}
	return s.parent.Isend(ctx, p, tag, payload)
}

func (s *subGroup) Irecv(ctx context.Context, from int, tag uint32, buf []byte) *Request {
	p, err := s.peer("recv from", from, tag)
	if err != nil {
		return DoneRequest(0, err)
	}
	return s.parent.Irecv(ctx, p, tag, buf)
}

// Close makes later operations through this view fail; the parent stays open.
func (s *subGroup) Close() error {
	s.closed.Store(true)
	return nil
}
