package compression

// wireGroupsAMD64 is wireDecodeGroups's loop in assembly (wire_amd64.s).
//
//go:noescape
func wireGroupsAMD64(a *wireGroupArgs)

// wireEncodeAMD64 is encodeChunk's loop over groups of four in assembly
// (wire_amd64.s).
//
//go:noescape
func wireEncodeAMD64(a *wireEncArgs)

// wireDecode32 decodes groups of 16 symbols with 32 states in two 16-lane
// vectors (wire_amd64.s; AVX-512F).
//
//go:noescape
func wireDecode32(a *wireDecode32Args)

// wireEncodeWideAMD64 is encodeWide's loop over groups of four, the states
// in memory (wire_amd64.s).
//
//go:noescape
func wireEncodeWideAMD64(a *wireEncWideArgs)

// wireCPUID and wireXGETBV0 are the instructions, for haveWireAVX512.
func wireCPUID(leaf, sub uint32) (a, b, c, d uint32)
func wireXGETBV0() uint32

// haveWireAVX512 reports AVX-512F on the CPU and its ZMM and opmask state
// enabled by the operating system (XCR0 bits 1, 2, 5, 6, 7).
var haveWireAVX512 = func() bool {
	if !haveSIMD { // AVX2, the OS saving the YMM state
		return false
	}
	_, _, c, _ := wireCPUID(1, 0)
	if c&(1<<27) == 0 || wireXGETBV0()&0xe6 != 0xe6 {
		return false
	}
	_, b, _, _ := wireCPUID(7, 0)
	return b&(1<<16) != 0
}()

// wireEncode32 codes groups of 16 symbols with 32 states in two 16-lane
// vectors, from the highest group down (wire_amd64.s; AVX-512F).
//
//go:noescape
func wireEncode32(a *wireEnc32Args)

// wireFill32 sets dst[l] = e | l<<20 (wire_amd64.s; AVX-512F).
//
//go:noescape
func wireFill32(dst []uint32, e uint32)
