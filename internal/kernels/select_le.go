//go:build 386 || amd64 || amd64p32 || arm || arm64 || loong64 || mips64le || mips64p32le || mipsle || ppc64le || riscv || riscv64 || wasm

package kernels

// On little-endian machines the lower-addressed of the two float32 in a
// 64-bit word is its low half: laneLo / laneHi bring the sign-bit position
// (bit 31) of the first / second element down to bit 0.
const laneLo, laneHi = 31, 63
