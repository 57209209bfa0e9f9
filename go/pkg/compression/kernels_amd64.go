package compression

import "kvlib/pkg/cpu"

// haveSIMD reports AVX2 on the CPU and its registers enabled by the OS.
var haveSIMD = cpu.X86.AVX2

// haveF16C reports F16C beside AVX2: the kernels of ExLlama's emulated fp16
// arithmetic (exl2EncRotAVX2, exl2CodesAVX2, exl2DecAVX2, rn16sAVX2) need both.
var haveF16C = haveSIMD && cpu.X86.F16C

// haveFMA reports FMA beside AVX2: the kernels of single-rounding float32
// multiply-adds (nvfp4FourSixAVX2) need both.
var haveFMA = haveSIMD && cpu.X86.FMA

// The assembly kernels (kernels_amd64.s); see their Go versions in kernels.go.

//go:noescape
func absMaxBitsAVX2(x []float32) uint32

//go:noescape
func quantSymAVX2(codes []int8, x []float32, s float32, qmax int32)

//go:noescape
func dequantSymAVX2(dst []float32, codes []int8, s float32)

//go:noescape
func minMaxAVX2(x []float32) (lo, hi int32, abits uint32)

//go:noescape
func quantAsymAVX2(codes []int8, x []float32, m, s, qmax float32)

//go:noescape
func dequantAsymAVX2(dst []float32, codes []int8, mask int32, s, m float32)

//go:noescape
func addBlocksAVX2(x, y []float32, s *laneSums, h *histTables) uint32

//go:noescape
func pack4AVX2(dst []byte, codes []int8)

//go:noescape
func pack2AVX2(dst []byte, codes []int8)

//go:noescape
func hadamard8AVX2(x []float32)

//go:noescape
func hadamardStageAVX2(x []float32, h int)

//go:noescape
func scaleAVX2(x []float32, c float32)

//go:noescape
func clampAbsAVX2(x []float32, lim float32)

//go:noescape
func argAbsMax32AVX2(x []float32) (i int, abits uint32)

//go:noescape
func offsetCodes32AVX2(q []uint8, x []float32, lo, id, off, qmax float32)

//go:noescape
func roundCodes32AVX2(q []uint8, x []float32, id float32)

// int8HeadCodesAVX2 is int8_per_token_head's codes (perHeadQuantizer) of
// x, a multiple of 32 values.
//
//go:noescape
func int8HeadCodesAVX2(q []uint8, x []float32, inv float32)

//go:noescape
func transposeAVX2(dst, src []float32, r, c int)

//go:noescape
func lmErr8AVX2(x []float32, t *[15]float32, y *[16]float32, lanes *[8]float32)

//go:noescape
func lmErr16AVX2(x []float32, t *[15]float32, y *[16]float32, lanes *[8]float32)

//go:noescape
func lmCodes8AVX2(codes []int8, x []float32, t *[15]float32)

//go:noescape
func lmCodes16AVX2(codes []int8, x []float32, t *[15]float32)

//go:noescape
func lmDequantAVX2(dst []float32, codes []int8, y *[16]float32)

//go:noescape
func rneCodes32AVX2(q []uint8, x []float32, id float32)

//go:noescape
func exl2EncRotAVX2(w, x *[exl2Chunk]float32) (amax0, amax1 float32, top uint32)

//go:noescape
func exl2Codes8AVX2(q *[32]uint8, w *[32]float32, amax, m float32, qmax int32)

//go:noescape
func exl2Codes4AVX2(q *[16]uint8, w *[32]float32, amax, m float32, qmax int32)

//go:noescape
func exl2Dec8AVX2(dst *[exl2Chunk]float32, q *[exl2Chunk]uint8, s0, s1 float32, m int32)

//go:noescape
func exl2Dec4AVX2(dst *[exl2Chunk]float32, q *[exl2Chunk / 2]uint8, s0, s1 float32, m int32)

//go:noescape
func rn16sAVX2(x []float32)

// exl3EncAVX2 writes a group's 4·bits bytes of bit planes at dst (the
// caller's block has them) and returns its scale.
//
//go:noescape
func exl3EncAVX2(dst *byte, x *[exl3Group]float32, m float32, qmax int32, bits int) (s float32, top uint32)

// exl3DecAVX2 reads a group's bit planes at src (4·bits bytes).
//
//go:noescape
func exl3DecAVX2(dst *[exl3Group]float32, src *byte, sm, c float32, bits int)

// nvfp4CodesAVX2 writes the block's E2M1 codes of x_i·os (nvfp4Code) two
// a byte and returns a bit per product past ±6; nvfp4DecAVX2 is
// nvfp4Dequantize's block.
//
//go:noescape
func nvfp4CodesAVX2(dst *[nvfp4Block / 2]byte, x *[nvfp4Block]float32, os float32) (past6 uint32)

// nvfp4FourSixAVX2 is nvfp4_4over6's choice for a block of finite values
// (fourSixError of both candidates, the /4 one where its error is smaller)
// and the chosen candidate's codes and past-6 bits, as nvfp4CodesAVX2
// writes them.
//
//go:noescape
func nvfp4FourSixAVX2(dst *[nvfp4Block / 2]byte, x *[nvfp4Block]float32, os4, dq4, os6, dq6 float32) (e4, e6 float32, past6 uint32, four bool)

// iq4nlQuantAVX2 is llamaQuantizeIQ4NL's codes (two a byte, element j
// low and j+16 high) and weighted sums of a block of finite values with
// id = 1/d0; iq4nlDecAVX2 is llamaDequantizeIQ4NL's block.
//
//go:noescape
func iq4nlQuantAVX2(dst *[GGMLBlock / 2]byte, x *[GGMLBlock]float32, id float32) (sumqx, sumq2 float32)

// iq4nlQuant2AVX2 is iq4nlQuantAVX2 of two consecutive blocks of 18 bytes
// (codes at dst and dst+18), the second one's values at x[32:]: their
// sums, A's sumqx and sumq2 then B's, are added in one register.
//
//go:noescape
func iq4nlQuant2AVX2(dst *byte, x *[2 * GGMLBlock]float32, ida, idb float32) (sums [4]float32)

//go:noescape
func iq4nlDecAVX2(dst *[GGMLBlock]float32, src *[GGMLBlock / 2]byte, d float32)

//go:noescape
func nvfp4DecAVX2(dst *[nvfp4Block]float32, src *[nvfp4Block / 2]byte, sf, k float32)

// kvfp4CodesAVX2 writes SGLang's FP4 codes of a block (kvfp4Code) two a byte.
//
//go:noescape
func kvfp4CodesAVX2(dst *[kvfp4Block / 2]byte, x *[kvfp4Block]float32, inv float32)

// fp8EncodeAVX2 is f.encode(x_i · mul) over whole blocks of 32, for the
// format whose constants k holds (f.kernel).
//
//go:noescape
func fp8EncodeAVX2(codes []uint8, x []float32, mul float32, k *fp8Kernel)

// divAVX2 divides x by d in place (len(x) a multiple of 8); tqCodesAVX2
// writes each y_i's count of the sorted midpoints mid <= y_i (len(y) a
// multiple of 32, 1 to 255 midpoints).
//
//go:noescape
func divAVX2(x []float32, d float32)

//go:noescape
func tqCodesAVX2(codes []int8, y []float32, mid []float32)

// int4CodesAVX2 is int4_per_token_head's codes of a rotated head vector
// (vllmNibble of the float64 product and sum), two a byte.
//
//go:noescape
func int4CodesAVX2(codes []byte, y []float32, inv, zp float32)

// xorBitsAVX2 and scaleXorBitsAVX2 are the RHT's signs (vllmRHT), XORed
// in before and after the butterfly; minMaxNumAVX2 is the least and the
// largest non-NaN value.
//
//go:noescape
func xorBitsAVX2(x []float32, m []uint32)

//go:noescape
func scaleXorBitsAVX2(x []float32, m []uint32, c float32)

//go:noescape
func minMaxNumAVX2(x []float32) (lo, hi float32)
