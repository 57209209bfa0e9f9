// AVX2 kernels of the Lloyd–Max quantizer (lloydmax.go), 8 values a step,
// bit-identical to its Go loops: a code is the count of thresholds below x
// (x > t, compared exactly), a level is looked up from the scaled
// codebook, and lane j of the error sums holds elements j, j+8, ... in
// order, as the spec says. len(x) is a multiple of 8. The "8" kernels are
// for codebooks of at most 8 levels: 7 thresholds, those past the
// codebook's own +Inf (never exceeded), held in Y9-Y15; the "16" kernels
// broadcast 15 thresholds from memory.

#include "textflag.h"

// gt adds to the codes in Y2 the lanes of Y0 above the threshold in R.
#define gt(R) \
	VCMPPS $14, R, Y0, Y4 \
	VPSUBD Y4, Y2, Y2

// gtMem does the same for the threshold at OFF(R8).
#define gtMem(OFF) \
	VBROADCASTSS OFF(R8), Y3 \
	gt(Y3)

// codes8 leaves in Y2 the codes of Y0 under the thresholds in Y9-Y15.
#define codes8 \
	VPXOR Y2, Y2, Y2 \
	gt(Y9) \
	gt(Y10) \
	gt(Y11) \
	gt(Y12) \
	gt(Y13) \
	gt(Y14) \
	gt(Y15)

// codes16 leaves in Y2 the codes of Y0 under the 15 thresholds at R8.
#define codes16 \
	VPXOR Y2, Y2, Y2 \
	gtMem(0) \
	gtMem(4) \
	gtMem(8) \
	gtMem(12) \
	gtMem(16) \
	gtMem(20) \
	gtMem(24) \
	gtMem(28) \
	gtMem(32) \
	gtMem(36) \
	gtMem(40) \
	gtMem(44) \
	gtMem(48) \
	gtMem(52) \
	gtMem(56)

// load7 puts the 7 thresholds at R8 into Y9-Y15.
#define load7 \
	VBROADCASTSS 0(R8), Y9 \
	VBROADCASTSS 4(R8), Y10 \
	VBROADCASTSS 8(R8), Y11 \
	VBROADCASTSS 12(R8), Y12 \
	VBROADCASTSS 16(R8), Y13 \
	VBROADCASTSS 20(R8), Y14 \
	VBROADCASTSS 24(R8), Y15

// sqerr adds (Y0 - Y5)^2 to the lane sums in Y1.
#define sqerr \
	VSUBPS Y5, Y0, Y5 \
	VMULPS Y5, Y5, Y5 \
	VADDPS Y5, Y1, Y1

// packCodes stores the 8 codes of Y2 as bytes at DI.
#define packCodes \
	VEXTRACTI128 $1, Y2, X5 \
	VPACKSSDW    X5, X2, X2 \
	VPACKSSWB    X2, X2, X2 \
	VMOVQ        X2, (DI)

// func lmErr8AVX2(x []float32, t *[15]float32, y *[16]float32, lanes *[8]float32)
TEXT ·lmErr8AVX2(SB), NOSPLIT, $0-48
	MOVQ    x_base+0(FP), SI
	MOVQ    x_len+8(FP), CX
	SHRQ    $3, CX
	MOVQ    t+24(FP), R8
	MOVQ    y+32(FP), R9
	MOVQ    lanes+40(FP), R11
	VMOVUPS (R11), Y1
	VMOVUPS (R9), Y8
	load7

lmerr8_loop:
	TESTQ   CX, CX
	JZ      lmerr8_done
	VMOVUPS (SI), Y0
	codes8
	VPERMPS Y8, Y2, Y5
	sqerr
	ADDQ    $32, SI
	DECQ    CX
	JMP     lmerr8_loop

lmerr8_done:
	VMOVUPS Y1, (R11)
	VZEROUPPER
	RET

// func lmErr16AVX2(x []float32, t *[15]float32, y *[16]float32, lanes *[8]float32)
TEXT ·lmErr16AVX2(SB), NOSPLIT, $0-48
	MOVQ    x_base+0(FP), SI
	MOVQ    x_len+8(FP), CX
	SHRQ    $3, CX
	MOVQ    t+24(FP), R8
	MOVQ    y+32(FP), R9
	MOVQ    lanes+40(FP), R11
	VMOVUPS (R11), Y1
	VMOVUPS (R9), Y8
	VMOVUPS 32(R9), Y9

lmerr16_loop:
	TESTQ     CX, CX
	JZ        lmerr16_done
	VMOVUPS   (SI), Y0
	codes16
	VPERMPS   Y8, Y2, Y5     // the level among the first 8 (code & 7)
	VPERMPS   Y9, Y2, Y6     // among the last 8
	VPSLLD    $28, Y2, Y7    // code bit 3 into the sign bit
	VBLENDVPS Y7, Y6, Y5, Y5 // code >= 8: the last 8
	sqerr
	ADDQ      $32, SI
	DECQ      CX
	JMP       lmerr16_loop

lmerr16_done:
	VMOVUPS Y1, (R11)
	VZEROUPPER
	RET

// func lmCodes8AVX2(codes []int8, x []float32, t *[15]float32)
TEXT ·lmCodes8AVX2(SB), NOSPLIT, $0-56
	MOVQ codes_base+0(FP), DI
	MOVQ x_base+24(FP), SI
	MOVQ x_len+32(FP), CX
	SHRQ $3, CX
	MOVQ t+48(FP), R8
	load7

lmcodes8_loop:
	TESTQ   CX, CX
	JZ      lmcodes8_done
	VMOVUPS (SI), Y0
	codes8
	packCodes
	ADDQ    $32, SI
	ADDQ    $8, DI
	DECQ    CX
	JMP     lmcodes8_loop

lmcodes8_done:
	VZEROUPPER
	RET

// func lmCodes16AVX2(codes []int8, x []float32, t *[15]float32)
TEXT ·lmCodes16AVX2(SB), NOSPLIT, $0-56
	MOVQ codes_base+0(FP), DI
	MOVQ x_base+24(FP), SI
	MOVQ x_len+32(FP), CX
	SHRQ $3, CX
	MOVQ t+48(FP), R8

lmcodes16_loop:
	TESTQ   CX, CX
	JZ      lmcodes16_done
	VMOVUPS (SI), Y0
	codes16
	packCodes
	ADDQ    $32, SI
	ADDQ    $8, DI
	DECQ    CX
	JMP     lmcodes16_loop

lmcodes16_done:
	VZEROUPPER
	RET

// func lmDequantAVX2(dst []float32, codes []int8, y *[16]float32)
// dst[i] = y[codes[i] & 15].
TEXT ·lmDequantAVX2(SB), NOSPLIT, $0-56
	MOVQ         dst_base+0(FP), DI
	MOVQ         dst_len+8(FP), CX
	SHRQ         $3, CX
	MOVQ         codes_base+24(FP), SI
	MOVQ         y+48(FP), R9
	VMOVUPS      (R9), Y8
	VMOVUPS      32(R9), Y9

lmdq_loop:
	TESTQ     CX, CX
	JZ        lmdq_done
	VPMOVSXBD (SI), Y2
	VPERMPS   Y8, Y2, Y5
	VPERMPS   Y9, Y2, Y6
	VPSLLD    $28, Y2, Y7
	VBLENDVPS Y7, Y6, Y5, Y5
	VMOVUPS   Y5, (DI)
	ADDQ      $8, SI
	ADDQ      $32, DI
	DECQ      CX
	JMP       lmdq_loop

lmdq_done:
	VZEROUPPER
	RET
