package kernels

// Elementwise implementation hooks; amd64 assembly may replace them in init.
var (
	axpyImpl    = axpyGeneric
	scaleImpl   = scaleGeneric
	addImpl     = addGeneric
	mulImpl     = mulGeneric
	dotImpl     = dotGeneric
	sumImpl     = sumGeneric
	reluFwdImpl = reluFwdGeneric
	reluBwdImpl = reluBwdGeneric
)
