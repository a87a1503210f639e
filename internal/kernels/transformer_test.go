package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// SgemmBatched over the heads of a [N, T, heads·d] layout equals one Sgemm per head,
// bit for bit, on both the serial-per-product and the per-product-parallel paths.
func TestSgemmBatchedMatchesSgemm(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, heads := range []int{1, 12} {
		const n, T, d = 3, 17, 8
		H := heads * d
		q, k := randSlice(rng, n*T*H), randSlice(rng, n*T*H)
		var aOff, bOff, cOff []int
		for s := range n {
			for h := range heads {
				aOff = append(aOff, s*T*H+h*d)
				bOff = append(bOff, s*T*H+h*d)
				cOff = append(cOff, (s*heads+h)*T*T)
			}
		}
		got := randSlice(rng, n*heads*T*T)
		want := append([]float32(nil), got...)
		SgemmBatched(false, true, T, T, d, 0.5, q, aOff, H, k, bOff, H, 0.25, got, cOff, T)
		for i := range aOff {
			Sgemm(false, true, T, T, d, 0.5, q[aOff[i]:], H, k[bOff[i]:], H, 0.25, want[cOff[i]:], T)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("heads=%d: element %d = %v, per-product Sgemm gives %v", heads, i, got[i], want[i])
			}
		}
	}
}

func TestSoftmaxRowsBias(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const rows, k, per = 6, 5, 3
	x := randSlice(rng, rows*k)
	x[0] = 80 // large logits must not overflow
	bias := []float32{0, -10000, 0, 0, -10000, 0, 0, 0, 0, -10000}
	y := make([]float32, rows*k)
	SoftmaxRows(y, x, bias, rows, k, per)
	for r := range rows {
		var z float64
		row := make([]float64, k)
		for j := range k {
			row[j] = float64(x[r*k+j]) + float64(bias[r/per*k+j])
		}
		mx := math.Inf(-1)
		for _, v := range row {
			mx = math.Max(mx, v)
		}
		for _, v := range row {
			z += math.Exp(v - mx)
		}
		for j := range k {
			want := math.Exp(row[j]-mx) / z
			if math.Abs(float64(y[r*k+j])-want) > 1e-6 {
				t.Fatalf("row %d col %d: %v, want %v", r, j, y[r*k+j], want)
			}
		}
	}
}

func TestLayerNormForwardStats(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const rows, d = 4, 33
	x := randSlice(rng, rows*d)
	for i := range x {
		x[i] = 3 + 5*x[i]
	}
	gamma, beta := make([]float32, d), make([]float32, d)
	Fill(gamma, 1)
	y := make([]float32, rows*d)
	mean, rstd := make([]float32, rows), make([]float32, rows)
	LayerNormForward(y, x, gamma, beta, mean, rstd, rows, d, 1e-12)
	for r := range rows {
		var s, ss float64
		for _, v := range y[r*d : (r+1)*d] {
			s += float64(v)
			ss += float64(v) * float64(v)
		}
		if math.Abs(s/d) > 1e-5 || math.Abs(ss/d-1) > 1e-4 {
			t.Fatalf("row %d: mean %g, variance %g after normalisation", r, s/d, ss/d)
		}
	}
}

// The GELU pair that keeps Φ(x) gives GeluForward's output and GeluBackward's gradient bit
// for bit, written and accumulated, over both tails and the middle.
func TestGeluCDFMatchesGelu(t *testing.T) {
	n := 3001
	x, dy := make([]float32, n), make([]float32, n)
	for i := range x {
		x[i] = -12 + 24*float32(i)/float32(n-1)
		dy[i] = float32(math.Sin(float64(i)))
	}
	y1, y2, cdf := make([]float32, n), make([]float32, n), make([]float32, n)
	GeluForward(y1, x)
	GeluForwardCDF(y2, cdf, x)
	for _, acc := range []bool{false, true} {
		d1, d2 := make([]float32, n), make([]float32, n)
		for i := range d1 {
			d1[i], d2[i] = 0.25, 0.25
		}
		GeluBackward(d1, x, dy, acc)
		GeluBackwardCDF(d2, x, cdf, dy, acc)
		for i := range x {
			if math.Float32bits(y1[i]) != math.Float32bits(y2[i]) || math.Float32bits(d1[i]) != math.Float32bits(d2[i]) {
				t.Fatalf("x = %v (accumulate %v): y %v vs %v, dx %v vs %v", x[i], acc, y1[i], y2[i], d1[i], d2[i])
			}
		}
	}
}
