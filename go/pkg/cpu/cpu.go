// Package cpu reports the x86-64 instruction set extensions the codec's
// assembly kernels use, detected once at start (CPUID, and XGETBV for the
// operating system's support of the YMM and ZMM registers). On other architectures
// every feature is false and the portable Go code runs.
package cpu

// X86 holds the features; AVX2 implies the OS saves the YMM state, AVX512F
// the ZMM and opmask state too.
var X86 struct {
	AVX2    bool // 256-bit integer and float vectors (Haswell, 2013, and later)
	F16C    bool // VCVTPH2PS / VCVTPS2PH: eight halves per instruction (Ivy Bridge, 2012, and later)
	FMA     bool // VFMADD*PS/PD: a*b + c rounded once (Haswell, Piledriver, and later)
	AVX512F bool // 512-bit vectors, opmasks, gathers and VPEXPANDD (Skylake-SP, Zen 4, and later)
}
