package comm

import (
	"os"
	"testing"
)

// Local's Send, Recv, Irecv, Close and their errors are tested by the Group contract
// (contract_test.go), which runs on every transport: TestGroupContract/local/....

// newLocal returns the p ranks most tests run on: in-process ones (NewLocal), or, when
// SPARGO_TEST_TRANSPORT names another transport ("shm", "tcp"), ranks of that one, so that the
// collective tests run on every transport (comm/commtest does the same for other packages).
func newLocal(t testing.TB, p int) []Group {
	t.Helper()
	switch tr := os.Getenv("SPARGO_TEST_TRANSPORT"); tr {
	case "", "local":
	case "shm":
		return newShm(t, p)
	case "tcp":
		return newTCP(t, p)
	default:
		t.Fatalf("SPARGO_TEST_TRANSPORT=%q: want local, shm or tcp", tr)
	}
	groups, err := NewLocal(p)
	if err != nil {
		t.Fatal(err)
	}
	return groups
}

func TestNewLocalRejectsBadSize(t *testing.T) {
	for _, p := range []int{0, -1} {
		if _, err := NewLocal(p); err == nil {
			t.Errorf("NewLocal(%d): no error", p)
		}
	}
}

func TestCountersSubResetAdd(t *testing.T) {
	var c Counters
	c.AddSent(10)
	c.AddRecv(4)
	c.AddRound(2)
	before := c.Snapshot()
	c.AddSent(6)
	c.AddRound(1)
	d := c.Snapshot().Sub(before)
	if want := (Stats{BytesSent: 6, MsgsSent: 1, Rounds: 1}); d != want {
		t.Errorf("Sub = %+v, want %+v", d, want)
	}
	if s := before.Add(d); s != c.Snapshot() {
		t.Errorf("Add = %+v, want %+v", s, c.Snapshot())
	}
	c.Reset()
	if s := c.Snapshot(); s != (Stats{}) {
		t.Errorf("after Reset %+v", s)
	}
}

func TestScratchPoolKeepsCapacity(t *testing.T) {
	s := getScratch(1000)
	if len(s) != 1000 || cap(s) != 1024 {
		t.Fatalf("getScratch(1000): len %d cap %d, want 1000 and 1024", len(s), cap(s))
	}
	putScratch(s)
	s2 := getScratch(900)
	if &s2[0] != &s[0] {
		t.Error("a returned scratch buffer of the same class was not reused")
	}
	putScratch(s2)
}
