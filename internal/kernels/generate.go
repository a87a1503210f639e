package kernels

//go:generate go run ./asmgen -out sgemm_amd64.s -stubs sgemm_stub_amd64.go
