package cpu

func cpuid(leaf, sub uint32) (a, b, c, d uint32)
func xgetbv0() uint32

func init() {
	maxLeaf, _, _, _ := cpuid(0, 0)
	if maxLeaf < 7 {
		return
	}
	_, _, c, _ := cpuid(1, 0)
	const fma, osxsave, avx, f16c = 1 << 12, 1 << 27, 1 << 28, 1 << 29
	if c&osxsave == 0 || c&avx == 0 || xgetbv0()&6 != 6 { // XMM and YMM state
		return
	}
	_, b, _, _ := cpuid(7, 0)
	X86.AVX2 = b&(1<<5) != 0
	X86.F16C = c&f16c != 0
	X86.FMA = c&fma != 0
	// XCR0 bits 1, 2, 5, 6, 7: XMM, YMM, opmask, ZMM0-15 upper halves, ZMM16-31
	X86.AVX512F = X86.AVX2 && b&(1<<16) != 0 && xgetbv0()&0xe6 == 0xe6
}
