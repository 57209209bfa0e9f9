//go:build !amd64

package compression

// haveSIMD is false: the portable kernels run everywhere but amd64, and
// the assembly entry points below are never called.
const haveSIMD = false

// haveF16C and haveFMA are false likewise (see kernels_amd64.go).
const (
	haveF16C = false
	haveFMA  = false
)

func noSIMD() { panic("compression: no SIMD kernels on this architecture") }

func absMaxBitsAVX2([]float32) uint32                            { noSIMD(); return 0 }
func quantSymAVX2([]int8, []float32, float32, int32)             { noSIMD() }
func dequantSymAVX2([]float32, []int8, float32)                  { noSIMD() }
func minMaxAVX2([]float32) (int32, int32, uint32)                { noSIMD(); return 0, 0, 0 }
func quantAsymAVX2([]int8, []float32, float32, float32, float32) { noSIMD() }
func dequantAsymAVX2([]float32, []int8, int32, float32, float32) { noSIMD() }
func addBlocksAVX2([]float32, []float32, *laneSums, *histTables) uint32 {
	noSIMD()
	return 0
}
func pack4AVX2([]byte, []int8)                                                 { noSIMD() }
func pack2AVX2([]byte, []int8)                                                 { noSIMD() }
func hadamard8AVX2([]float32)                                                  { noSIMD() }
func hadamardStageAVX2([]float32, int)                                         { noSIMD() }
func scaleAVX2([]float32, float32)                                             { noSIMD() }
func argAbsMax32AVX2([]float32) (int, uint32)                                  { noSIMD(); return 0, 0 }
func offsetCodes32AVX2([]uint8, []float32, float32, float32, float32, float32) { noSIMD() }
func roundCodes32AVX2([]uint8, []float32, float32)                             { noSIMD() }
func int8HeadCodesAVX2([]uint8, []float32, float32)                            { noSIMD() }
func transposeAVX2([]float32, []float32, int, int)                             { noSIMD() }
func clampAbsAVX2([]float32, float32)                                          { noSIMD() }
func lmErr8AVX2([]float32, *[15]float32, *[16]float32, *[8]float32)            { noSIMD() }
func lmErr16AVX2([]float32, *[15]float32, *[16]float32, *[8]float32)           { noSIMD() }
func lmCodes8AVX2([]int8, []float32, *[15]float32)                             { noSIMD() }
func lmCodes16AVX2([]int8, []float32, *[15]float32)                            { noSIMD() }
func lmDequantAVX2([]float32, []int8, *[16]float32)                            { noSIMD() }
func rneCodes32AVX2([]uint8, []float32, float32)                               { noSIMD() }

func exl2EncRotAVX2(*[exl2Chunk]float32, *[exl2Chunk]float32) (float32, float32, uint32) {
	noSIMD()
	return 0, 0, 0
}
func exl2Codes8AVX2(*[32]uint8, *[32]float32, float32, float32, int32)                 { noSIMD() }
func exl2Codes4AVX2(*[16]uint8, *[32]float32, float32, float32, int32)                 { noSIMD() }
func exl2Dec8AVX2(*[exl2Chunk]float32, *[exl2Chunk]uint8, float32, float32, int32)     { noSIMD() }
func exl2Dec4AVX2(*[exl2Chunk]float32, *[exl2Chunk / 2]uint8, float32, float32, int32) { noSIMD() }
func rn16sAVX2([]float32)                                                              { noSIMD() }
func exl3EncAVX2(*byte, *[exl3Group]float32, float32, int32, int) (float32, uint32) {
	noSIMD()
	return 0, 0
}
func exl3DecAVX2(*[exl3Group]float32, *byte, float32, float32, int) { noSIMD() }
func nvfp4CodesAVX2(*[nvfp4Block / 2]byte, *[nvfp4Block]float32, float32) uint32 {
	noSIMD()
	return 0
}
func nvfp4FourSixAVX2(*[nvfp4Block / 2]byte, *[nvfp4Block]float32, float32, float32, float32, float32) (float32, float32, uint32, bool) {
	noSIMD()
	return 0, 0, 0, false
}
func iq4nlQuantAVX2(*[GGMLBlock / 2]byte, *[GGMLBlock]float32, float32) (float32, float32) {
	noSIMD()
	return 0, 0
}
func iq4nlQuant2AVX2(*byte, *[2 * GGMLBlock]float32, float32, float32) [4]float32 {
	noSIMD()
	return [4]float32{}
}
func iq4nlDecAVX2(*[GGMLBlock]float32, *[GGMLBlock / 2]byte, float32)            { noSIMD() }
func nvfp4DecAVX2(*[nvfp4Block]float32, *[nvfp4Block / 2]byte, float32, float32) { noSIMD() }
func kvfp4CodesAVX2(*[kvfp4Block / 2]byte, *[kvfp4Block]float32, float32)        { noSIMD() }
func fp8EncodeAVX2([]uint8, []float32, float32, *fp8Kernel)                      { noSIMD() }
func divAVX2([]float32, float32)                                                 { noSIMD() }
func tqCodesAVX2([]int8, []float32, []float32)                                   { noSIMD() }
func int4CodesAVX2([]byte, []float32, float32, float32)                          { noSIMD() }
func xorBitsAVX2([]float32, []uint32)                                            { noSIMD() }
func scaleXorBitsAVX2([]float32, []uint32, float32)                              { noSIMD() }
func minMaxNumAVX2([]float32) (float32, float32)                                 { noSIMD(); return 0, 0 }
