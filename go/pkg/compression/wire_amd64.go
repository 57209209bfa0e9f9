package compression

import "kvlib/pkg/cpu"

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

// haveWireAVX512 reports AVX-512F on the CPU and its ZMM and opmask state
// enabled by the operating system (kvlib/pkg/cpu).
var haveWireAVX512 = haveSIMD && cpu.X86.AVX512F

// wireEncode32 codes groups of 16 symbols with 32 states in two 16-lane
// vectors, from the highest group down (wire_amd64.s; AVX-512F).
//
//go:noescape
func wireEncode32(a *wireEnc32Args)

// wireFill32 sets dst[l] = e | l<<20 (wire_amd64.s; AVX-512F).
//
//go:noescape
func wireFill32(dst []uint32, e uint32)

// wireUnpack4AVX2 unpacks len(dst)/64*64 4-bit codes from src (wire_amd64.s; AVX2).
//
//go:noescape
func wireUnpack4AVX2(dst []uint8, src []byte)

// wireUnpack2AVX2 unpacks len(dst)/32*32 2-bit codes from src (wire_amd64.s; AVX2).
//
//go:noescape
func wireUnpack2AVX2(dst []uint8, src []byte)

// wireUnpack3AVX2 unpacks len(dst)/32*32 3-bit codes from src, reading 2
// bytes past them (wire_amd64.s; AVX2).
//
//go:noescape
func wireUnpack3AVX2(dst []uint8, src []byte)
