package kernels

// The generator is its own module (see asmgen/go.mod), hence -C.
//go:generate go run -C asmgen . -out ../sgemm_amd64.s -stubs ../sgemm_stub_amd64.go -pkg kernels
