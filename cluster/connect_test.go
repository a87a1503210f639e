package cluster

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// A rank that publishes its address and dies before the mesh is complete is named by the
// others within SPARGO_CONNECT_TIMEOUT, not after the 5-minute rendezvous limit.
func TestInitNamesRankThatDiedAfterPublishing(t *testing.T) {
	const p = 3
	port, _ := freePort()
	logs := &logSink{}
	errs := make([]error, p)
	took := make([]time.Duration, p)
	start := time.Now()
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			g, _, err := Init(testCtx(t), Options{Lookup: rankEnv(r, p, port, "SPARGO_SECRET=s", "SPARGO_CONNECT_TIMEOUT=1s"), Logf: logs.logf})
			if g != nil {
				g.Close()
			}
			errs[r], took[r] = err, time.Since(start)
		})
	}
	// Rank 2 publishes the address of a listener, then dies (the listener closes).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	st, err := DialStore(testCtx(t), "127.0.0.1:"+strconv.Itoa(port), StoreOptions{Secret: []byte("s"), Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.WithPrefix("spargo/unit").Set(testCtx(t), "addr/2", []byte(addr)); err != nil {
		t.Fatal(err)
	}
	st.Close()
	wg.Wait()
	for r := range 2 {
		if errs[r] == nil || !strings.Contains(errs[r].Error(), "no connection with rank(s) [2]") || !strings.Contains(errs[r].Error(), "SPARGO_CONNECT_TIMEOUT") {
			t.Errorf("rank %d: %v, want rank 2 named", r, errs[r])
		}
		if took[r] > time.Minute { // generous: the limit is 1 s, the old one 5 minutes
			t.Errorf("rank %d took %v to fail", r, took[r])
		}
	}
}

// The timeouts read from the environment are checked: a bad value is named.
func TestInitTimeoutOptions(t *testing.T) {
	for _, kv := range []string{"SPARGO_CONNECT_TIMEOUT=soon", "SPARGO_OP_TIMEOUT=-3", "SPARGO_TIMEOUT=0s"} {
		_, _, err := Init(context.Background(), Options{Lookup: rankEnv(0, 2, 1, kv)})
		name, _, _ := strings.Cut(kv, "=")
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v, want an error naming it", kv, err)
		}
	}
	e := envReader{lookupMap(map[string]string{"SPARGO_OP_TIMEOUT": "90"})}
	if d, err := durationOption(e, 0, "SPARGO_OP_TIMEOUT"); err != nil || d != 90*time.Second {
		t.Errorf("SPARGO_OP_TIMEOUT=90: %v %v", d, err)
	}
	if d, err := durationOption(e, time.Second, "SPARGO_OP_TIMEOUT"); err != nil || d != time.Second {
		t.Errorf("an option beats the environment: %v %v", d, err)
	}
	if d, err := durationOption(envReader{lookupMap(nil)}, 0, "SPARGO_OP_TIMEOUT"); err != nil || d != 0 {
		t.Errorf("unset: %v %v", d, err)
	}
}
