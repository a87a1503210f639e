package kernels

// The binary16 conversion kernels (F16C) are the third avo output set of the same
// generator, selected with -half.
//go:generate go run -C asmgen . -half -out ../half_amd64.s -stubs ../half_stub_amd64.go -pkg kernels
