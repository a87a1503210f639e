//go:build armbe || arm64be || m68k || mips || mips64 || mips64p32 || ppc || ppc64 || s390 || s390x || shbe || sparc || sparc64

package kernels

// On big-endian machines the lower-addressed of the two float32 in a
// 64-bit word is its high half: laneLo / laneHi bring the sign-bit position
// (bit 31) of the first / second element down to bit 0.
const laneLo, laneHi = 63, 31
