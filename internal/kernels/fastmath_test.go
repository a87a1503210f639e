package kernels

import (
	"math"
	"testing"
)

func TestExp32Accuracy(t *testing.T) {
	worst := 0.0
	for x := float32(-90); x < 88.7; x += 0.00731 {
		got, want := float64(exp32(x)), math.Exp(float64(x))
		if want == 0 || math.IsInf(want, 0) {
			continue
		}
		if e := math.Abs(got-want) / want; e > worst {
			worst = e
		}
	}
	if worst > 1e-6 {
		t.Fatalf("exp32 relative error %g, want < 1e-6", worst)
	}
	if !math.IsNaN(float64(exp32(float32(math.NaN())))) || exp32(-200) != 0 || !math.IsInf(float64(exp32(200)), 1) {
		t.Fatal("exp32: NaN or out-of-range inputs mishandled")
	}
}

func TestErfc32Accuracy(t *testing.T) {
	worst := 0.0
	for x := float32(-9); x < 9; x += 0.00173 {
		want := math.Erfc(float64(x))
		if e := math.Abs(float64(erfc32(x))-want) / want; e > worst {
			worst = e
		}
	}
	if worst > 1e-5 {
		t.Fatalf("erfc32 relative error %g, want < 1e-5", worst)
	}
	if !math.IsNaN(float64(erfc32(float32(math.NaN())))) || erfc32(20) != 0 || erfc32(-20) != 2 {
		t.Fatal("erfc32: NaN or out-of-range inputs mishandled")
	}
}
