package comm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

func agreeOnEveryRank(t *testing.T, fields func(r int) []Field, p int) []error {
	t.Helper()
	groups, err := NewLocal(p)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, p)
	var wg sync.WaitGroup
	for r := range p {
		wg.Go(func() { errs[r] = AgreeConfig(ctx, groups[r], 7, fields(r)) })
	}
	wg.Wait()
	return errs
}

func TestAgreeConfig(t *testing.T) {
	base := func(r int) []Field {
		return []Field{{"model", "vgg11"}, {"lr", "0.1"}, {"batch", "32"}, {"seed", "1"}}
	}
	for r, err := range agreeOnEveryRank(t, base, 3) {
		if err != nil {
			t.Fatalf("rank %d: %v with the same settings", r, err)
		}
	}
	for _, tc := range []struct {
		name   string
		fields func(r int) []Field
		want   string
		field  string
	}{
		{"lr on rank 1", func(r int) []Field {
			f := base(r)
			if r == 1 {
				f[1].Value = "0.2"
			}
			f[3].Value = fmt.Sprint(r) // a later field differs too: the first one is named
			return f
		}, `lr is "0.1" on ranks 0, 2, "0.2" on rank 1`, "lr"},
		{"a field missing on rank 2", func(r int) []Field {
			f := base(r)
			if r == 2 {
				f = append(f[:2], f[3:]...)
			}
			return f
		}, `batch is "32" on ranks 0, 1, absent on rank 2`, "batch"},
		{"order", func(r int) []Field {
			f := base(r)
			if r == 0 {
				f[2], f[3] = f[3], f[2]
			}
			return f
		}, "(order of the fields)", "(order of the fields)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for r, err := range agreeOnEveryRank(t, tc.fields, 3) {
				var ce *ConfigError
				if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("rank %d: %v, want %q", r, err, tc.want)
				}
			}
		})
	}
}

// Over TCP too, with fields that are long and hold any bytes.
func TestAgreeConfigTCP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	groups, err := NewTCPLoopback(ctx, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(groups)
	plan := strings.Repeat("bucket\x00\n", 1000)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			errs[r] = AgreeConfig(ctx, groups[r], 3, []Field{{"buckets", plan + fmt.Sprint(r)}, {"lr", "0.1"}})
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "buckets is") || !strings.Contains(err.Error(), "on rank 1") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func ExampleAgreeConfig() {
	groups, _ := NewLocal(2)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r, g := range groups {
		lr := []string{"0.1", "0.05"}[r] // rank 1 was started with another -lr
		wg.Go(func() {
			errs[r] = AgreeConfig(context.Background(), g, 1, []Field{{"model", "vgg11"}, {"lr", lr}})
		})
	}
	wg.Wait()
	fmt.Println(errs[0])
	fmt.Println(errs[1])
	// Output:
	// comm: the ranks' settings differ: lr is "0.1" on rank 0, "0.05" on rank 1
	// comm: the ranks' settings differ: lr is "0.1" on rank 0, "0.05" on rank 1
}
