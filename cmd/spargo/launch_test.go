package main

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestLaunchCommand(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("needs sh")
	}
	var out, errb bytes.Buffer
	code := dispatch([]string{"launch", "-n", "2", "--", "sh", "-c", `echo "rank $RANK of $WORLD_SIZE"`}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"[rank 0] rank 0 of 2\n", "[rank 1] rank 1 of 2\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	// One rank fails: the other (sleeping) is stopped and launch exits non-zero naming the rank.
	out.Reset()
	errb.Reset()
	start := time.Now()
	code = dispatch([]string{"launch", "-n", "3", "-grace", "2s", "--", "sh", "-c",
		`if [ "$RANK" = 1 ]; then echo giving up; exit 3; fi; sleep 30`}, &out, &errb)
	if code == 0 || !strings.Contains(errb.String(), "spargo: rank 1 failed: exit status 3") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("launch took %v to stop the other ranks", d)
	}
	if !strings.Contains(out.String(), "[rank 1] giving up\n") {
		t.Errorf("output lacks the failing rank's line:\n%s", out.String())
	}
}

func TestLaunchCommandUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"launch", "--", "true"}, "-n must be at least 1"},
		{[]string{"launch", "-n", "2"}, "no program given"},
		{[]string{"launch", "-n", "1", "-bogus"}, "flag provided but not defined"},
	} {
		var out, errb bytes.Buffer
		if code := dispatch(tc.args, &out, &errb); code == 0 || !strings.Contains(errb.String()+out.String(), tc.want) {
			t.Errorf("%v: exit %d, output %q %q; want %q", tc.args, code, out.String(), errb.String(), tc.want)
		}
	}
	var out, errb bytes.Buffer
	if code := dispatch([]string{"launch", "-h"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "usage: spargo launch -n N") {
		t.Errorf("launch -h: exit %d, %q", code, out.String())
	}
}
