package optim

import (
	"math"

	"github.com/spargo-dl/spargo/internal/kernels"
	"github.com/spargo-dl/spargo/nn"
)

// ClipGradNorm scales the gradients of params so that their total L2 norm (over all of
// them, as one vector) is at most maxNorm, and returns the norm before clipping: PyTorch's
// torch.nn.utils.clip_grad_norm_(params, maxNorm) with norm_type 2, including its
// coefficient maxNorm/(norm + 1e-6) and leaving the gradients unchanged when that is ≥ 1.
// In a data-parallel run call it on the synchronised gradients (train.Loop's Clip does),
// so every rank scales by the same factor. A non-finite norm leaves the gradients as they
// are and is returned, for the caller to report.
func ClipGradNorm(params []*nn.Param, maxNorm float64) float64 {
	var sum float64
	for _, p := range params {
		g := p.Grad.Data
		sum += float64(kernels.Dot(g, g))
	}
	norm := math.Sqrt(sum)
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		return norm
	}
	if coef := maxNorm / (norm + 1e-6); coef < 1 {
		for _, p := range params {
			kernels.Scale(float32(coef), p.Grad.Data)
		}
	}
	return norm
}
