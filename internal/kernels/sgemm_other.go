//go:build !amd64

package kernels

// archImpls: only the portable micro-kernel on non-amd64 architectures.
func archImpls() []*gemmImpl { return nil }
