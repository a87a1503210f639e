package cluster

import (
	"bytes"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// blameLine matches what a rank prints when it knows which rank failed: a comm.PeerError
// ("peer rank 2 failed: silent for 5s", "peer rank 1 reports that this rank (2) failed: …",
// "this rank (2) failed: out of step: …") or a collective checkpoint save that another rank could not write ("rank 0 failed to save
// its part").
var blameLine = regexp.MustCompile(`peer rank (\d+) failed: (.*)|peer rank \d+ reports that this rank \((\d+)\) failed: (.*)|this rank \((\d+)\) failed: (.*)|rank (\d+) (failed to save its part.*)`)

// reportedBy is the suffix a PeerError adds when a peer's goodbye told of the failure.
var reportedBy = regexp.MustCompile(` \(reported by rank \d+\)$`)

// blame collects, from the ranks' output, which rank each of them says failed.
type blame struct {
	mu     sync.Mutex
	by     map[int]map[int]bool // blamed rank → the ranks whose output blames it
	order  []int                // blamed ranks, first seen first
	causes map[int]string       // blamed rank → the first cause seen
}

func newBlame() *blame {
	return &blame{by: map[int]map[int]bool{}, causes: map[int]string{}}
}

// observe reads one line of rank's output.
func (b *blame) observe(rank int, line []byte) {
	if !bytes.Contains(line, []byte("failed")) {
		return
	}
	m := blameLine.FindSubmatch(line)
	if m == nil {
		return
	}
	var who, cause []byte
	for i := 1; i+1 < len(m); i += 2 {
		if m[i] != nil {
			who, cause = m[i], m[i+1]
			break
		}
	}
	r, err := strconv.Atoi(string(who))
	if err != nil || r < 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.by[r] == nil {
		b.by[r] = map[int]bool{}
		b.order = append(b.order, r)
		b.causes[r] = reportedBy.ReplaceAllString(strings.TrimSpace(string(cause)), "")
	}
	b.by[r][rank] = true
}

// verdict is the rank most ranks blame (the first blamed on a tie), the ranks that blame it
// and the cause; rank -1 when no rank printed a blame.
func (b *blame) verdict() (rank int, by []int, cause string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	rank = -1
	for _, r := range b.order {
		if rank < 0 || len(b.by[r]) > len(b.by[rank]) {
			rank = r
		}
	}
	if rank < 0 {
		return -1, nil, ""
	}
	return rank, slices.Sorted(maps.Keys(b.by[rank])), b.causes[rank]
}

// rankList words ranks as "rank 2" or "ranks 0, 1, 3".
func rankList(ranks []int) string {
	if len(ranks) == 1 {
		return "rank " + strconv.Itoa(ranks[0])
	}
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = strconv.Itoa(r)
	}
	return "ranks " + strings.Join(s, ", ")
}

func (e *RankError) Error() string {
	var b strings.Builder
	switch {
	case e.Blamed >= 0 && e.Blamed != e.Rank:
		fmt.Fprintf(&b, "rank %d failed: %s (reported by %s); the first to exit was rank %d: %v", e.Blamed, e.Cause, rankList(e.BlamedBy), e.Rank, e.Err)
	case e.Blamed == e.Rank:
		fmt.Fprintf(&b, "rank %d failed: %v (%s reported: %s)", e.Rank, e.Err, rankList(e.BlamedBy), e.Cause)
	default:
		fmt.Fprintf(&b, "rank %d failed: %v", e.Rank, e.Err)
	}
	if len(e.Also) > 0 {
		b.WriteString(" (first observed failure; then")
		for i, f := range e.Also {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, " rank %d: %v", f.Rank, f.Err)
		}
		b.WriteString(")")
	}
	if len(e.Stopped) > 0 {
		fmt.Fprintf(&b, "; stopped %s", rankList(e.Stopped))
	}
	return b.String()
}

// Ranks lists every rank named in the error: the blamed one, then the first observed to
// fail, then the others in the order observed.
func (e *RankError) Ranks() []int {
	var ranks []int
	if e.Blamed >= 0 && e.Blamed != e.Rank {
		ranks = append(ranks, e.Blamed)
	}
	ranks = append(ranks, e.Rank)
	for _, f := range e.Also {
		ranks = append(ranks, f.Rank)
	}
	return ranks
}
