package kernels

// The layer kernels (BatchNorm, ReLU backward, SGD, max-pool) are a second avo
// output set of the same generator, selected with -layers.
//go:generate go run -C asmgen . -layers -out ../layers_amd64.s -stubs ../layers_stub_amd64.go -pkg kernels
