package nn

import (
	"math"
	"math/rand/v2"
)

// NewRand returns the deterministic generator layers use for initialisation and
// dropout masks: the same seed gives the same model and the same masks.
func NewRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 0x5ba5_90d1_c0de))
}

// Uniform fills x with values drawn from U(-bound, bound).
func Uniform(x []float32, bound float64, rng *rand.Rand) {
	for i := range x {
		x[i] = float32((2*rng.Float64() - 1) * bound)
	}
}

// KaimingUniformDefault fills a weight as PyTorch's Linear and Conv2d reset_parameters
// do: kaiming_uniform_ with a = sqrt(5), which is U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
func KaimingUniformDefault(w []float32, fanIn int, rng *rand.Rand) {
	Uniform(w, 1/math.Sqrt(float64(fanIn)), rng)
}

// Normal fills x with values drawn from N(0, std²) (PyTorch's normal_ with mean 0).
func Normal(x []float32, std float64, rng *rand.Rand) {
	for i := range x {
		x[i] = float32(rng.NormFloat64() * std)
	}
}

// KaimingNormal fills a weight as PyTorch's kaiming_normal_ with a = 0 and the ReLU gain
// does: N(0, 2/fan), where fan is fan_in (mode='fan_in', the default) or fan_out
// (mode='fan_out', torchvision's ResNet convolutions) as the caller chooses.
func KaimingNormal(w []float32, fan int, rng *rand.Rand) {
	Normal(w, math.Sqrt(2/float64(fan)), rng)
}
