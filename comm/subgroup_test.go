package comm

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestSendRecvVariableLength(t *testing.T) {
	const p = 4
	got := make([][]byte, p)
	groups := runRanks(t, p, func(ctx context.Context, g Group) error {
		r := g.Rank()
		msg := []byte(strings.Repeat(string(rune('a'+r)), r+1)) // rank r sends r+1 bytes
		buf := make([]byte, 16)
		n, err := SendRecv(ctx, g, 3, (r+1)%p, msg, (r-1+p)%p, buf)
		if err != nil {
			return err
		}
		got[r] = buf[:n]
		// Receive only, then send only: one round each.
		if r == 0 {
			_, err = SendRecv(ctx, g, 3, 1, []byte("x"), -1, nil)
		} else if r == 1 {
			_, err = SendRecv(ctx, g, 3, -1, nil, 0, make([]byte, 1))
		}
		return err
	})
	for r := range p {
		left := (r - 1 + p) % p
		if want := strings.Repeat(string(rune('a'+left)), left+1); string(got[r]) != want {
			t.Errorf("rank %d received %q, want %q", r, got[r], want)
		}
		wantRounds := int64(1)
		if r < 2 {
			wantRounds = 2
		}
		if s := groups[r].Counters().Snapshot(); s.Rounds != wantRounds {
			t.Errorf("rank %d: %v, want %d rounds", r, s, wantRounds)
		}
	}
}

func TestSendRecvTooLong(t *testing.T) {
	groups := newLocal(t, 2)
	ctx := context.Background()
	errs := make(chan error, 2)
	go func() { _, err := SendRecv(ctx, groups[0], 1, 1, make([]byte, 8), -1, nil); errs <- err }()
	go func() { _, err := SendRecv(ctx, groups[1], 1, -1, nil, 0, make([]byte, 4)); errs <- err }()
	var failed int
	for range 2 {
		if err := <-errs; err != nil {
			failed++
			if !strings.Contains(err.Error(), "does not fit") {
				t.Errorf("error %v does not say the message does not fit", err)
			}
		}
	}
	if failed != 1 {
		t.Errorf("%d ranks failed, want the receiver only", failed)
	}
}

func TestAllGatherBytesSized(t *testing.T) {
	for _, p := range testSizes {
		t.Run(fmt.Sprintf("P=%d", p), func(t *testing.T) {
			sizes := make([]int, p)
			var total int64
			for i := range sizes {
				sizes[i] = (3 * i) % 5 // some empty
				total += int64(sizes[i])
			}
			outs := make([][][]byte, p)
			groups := runRanks(t, p, func(ctx context.Context, g Group) error {
				r := g.Rank()
				var err error
				outs[r], err = AllGatherBytesSized(ctx, g, 2, []byte(strings.Repeat(string(rune('a'+r)), sizes[r])), sizes)
				return err
			})
			for r := range p {
				for i := range p {
					if want := strings.Repeat(string(rune('a'+i)), sizes[i]); string(outs[r][i]) != want {
						t.Fatalf("rank %d: block of rank %d = %q, want %q", r, i, outs[r][i], want)
					}
				}
				s := groups[r].Counters().Snapshot()
				wantRounds := int64(ceilLog2(p))
				if total == 0 {
					wantRounds = 0
				}
				if s.Rounds != wantRounds || s.BytesRecv != total-int64(sizes[r]) {
					t.Errorf("rank %d: %v; want %d rounds, %d bytes received", r, s, wantRounds, total-int64(sizes[r]))
				}
			}
		})
	}
}

func TestAllGatherBytesSizedBadInput(t *testing.T) {
	groups := newLocal(t, 2)
	if _, err := AllGatherBytesSized(context.Background(), groups[0], 1, []byte("ab"), []int{1, 1}); err == nil || !strings.Contains(err.Error(), "len(send) = 2") {
		t.Errorf("wrong own size: %v", err)
	}
	if _, err := AllGatherBytesSized(context.Background(), groups[0], 1, nil, []int{0}); err == nil || !strings.Contains(err.Error(), "1 sizes for 2 ranks") {
		t.Errorf("wrong number of sizes: %v", err)
	}
}

// Two disjoint sub-groups (even and odd ranks) all-reduce concurrently on the same tag;
// their traffic shows on the parent ranks' counters.
func TestSubGroupCollectives(t *testing.T) {
	const p, n = 6, 999
	inputs := make([][]float32, p)
	bufs := make([][]float32, p)
	for r := range p {
		inputs[r] = rankData(21, r, n)
		bufs[r] = slices.Clone(inputs[r])
	}
	groups := runRanks(t, p, func(ctx context.Context, g Group) error {
		members := []int{0, 2, 4}
		if g.Rank()%2 == 1 {
			members = []int{5, 3, 1} // numbered in the listed order
		}
		s, err := Sub(g, members)
		if err != nil {
			return err
		}
		if want := slices.Index(members, g.Rank()); s.Rank() != want || s.Size() != 3 {
			return fmt.Errorf("rank %d: view rank %d size %d, want %d and 3", g.Rank(), s.Rank(), s.Size(), want)
		}
		return AllReduce(ctx, s, 7, bufs[g.Rank()], Ring)
	})
	for _, members := range [][]int{{0, 2, 4}, {5, 3, 1}} {
		var in, out [][]float32
		for _, m := range members {
			in = append(in, inputs[m])
			out = append(out, bufs[m])
		}
		checkIdentical(t, fmt.Sprint(members), out)
		checkSum(t, fmt.Sprint(members), out[0], in)
	}
	for r, g := range groups {
		if s := g.Counters().Snapshot(); s.Rounds != 4 || s.BytesRecv != 4*2*n*2/3 {
			t.Errorf("rank %d: %v, want the ring's 2(3-1) rounds and 2n(3-1)/3 words on the parent", r, s)
		}
	}
}

func TestSubGroupBadInput(t *testing.T) {
	groups := newLocal(t, 3)
	for _, c := range []struct {
		members []int
		want    string
	}{
		{[]int{1, 2}, "rank 0 is not among the members"},
		{[]int{0, 0}, "listed twice"},
		{[]int{0, 3}, "outside [0, 3)"},
	} {
		if _, err := Sub(groups[0], c.members); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Sub(%v) = %v, want error containing %q", c.members, err, c.want)
		}
	}
	s, err := Sub(groups[0], []int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(context.Background(), 2, 1, nil); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("send outside the view: %v", err)
	}
	s.Close()
	if err := s.Send(context.Background(), 1, 1, nil); err == nil {
		t.Error("send on a closed view succeeded")
	}
	if err := groups[0].Send(context.Background(), 1, 1, nil); err != nil {
		t.Errorf("closing the view closed the parent: %v", err)
	}
}
