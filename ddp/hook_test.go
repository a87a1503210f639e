package ddp

import (
	"errors"
	"slices"
	"testing"
)

// countingFuture counts its Waits.
type countingFuture struct {
	v     []float32
	err   error
	waits *int
}

func (f countingFuture) Wait() ([]float32, error) { *f.waits++; return f.v, f.err }

func TestThen(t *testing.T) {
	t.Run("result", func(t *testing.T) {
		waits, calls := 0, 0
		f := Then(countingFuture{v: []float32{1, 2}, waits: &waits}, func(v []float32) ([]float32, error) {
			calls++
			for i := range v {
				v[i] *= 10
			}
			return v, nil
		})
		for range 2 {
			got, err := f.Wait()
			if err != nil || !slices.Equal(got, []float32{10, 20}) {
				t.Fatalf("Wait = %v, %v; want [10 20], nil", got, err)
			}
		}
		if waits != 1 || calls != 1 {
			t.Errorf("two Waits waited on the inner Future %d times and ran fn %d times, want 1 and 1", waits, calls)
		}
		if _, ok := f.(LateFuture); ok {
			t.Errorf("Then of a plain Future is a LateFuture")
		}
	})
	t.Run("error", func(t *testing.T) {
		waits := 0
		boom := errors.New("boom")
		f := Then(countingFuture{err: boom, waits: &waits}, func(v []float32) ([]float32, error) {
			t.Error("fn ran after the inner Future failed")
			return v, nil
		})
		if _, err := f.Wait(); !errors.Is(err, boom) {
			t.Errorf("Wait error = %v, want the inner Future's", err)
		}
	})
	t.Run("fn error", func(t *testing.T) {
		waits := 0
		bad := errors.New("bad")
		f := Then(countingFuture{v: []float32{1}, waits: &waits}, func([]float32) ([]float32, error) { return nil, bad })
		if _, err := f.Wait(); !errors.Is(err, bad) {
			t.Errorf("Wait error = %v, want fn's", err)
		}
	})
	t.Run("late", func(t *testing.T) {
		waits := 0
		late := Ready([]float32{7}, nil)
		f := Then(Defer(countingFuture{v: []float32{1, 2}, waits: &waits}, Deferred{Params: []int{1}, Result: late, Correct: true}),
			func(v []float32) ([]float32, error) { v[0] = -v[0]; return v, nil })
		lf, ok := f.(LateFuture)
		if !ok {
			t.Fatalf("Then of a LateFuture is not a LateFuture: DDP would lose the deferred parameters")
		}
		got, err := f.Wait()
		if err != nil || !slices.Equal(got, []float32{-1, 2}) {
			t.Errorf("Wait = %v, %v; want [-1 2], nil", got, err)
		}
		d := lf.Late()
		if !slices.Equal(d.Params, []int{1}) || !d.Correct {
			t.Errorf("Late = %+v, want the inner Future's", d)
		}
		if v, err := d.Result.Wait(); err != nil || !slices.Equal(v, []float32{7}) {
			t.Errorf("Late().Result.Wait = %v, %v; want the inner late result [7] untouched by fn", v, err)
		}
	})
}
