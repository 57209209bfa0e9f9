// AVX2 versions of the kernels in kernels.go, 8 float32 values a step.
// Each computes exactly what its Go version does: the same IEEE operations
// in the same order per element (vector lanes are independent), so the
// results are bit-identical. The callers pass whole blocks of 8 (32 codes
// for the packers).

#include "textflag.h"

// splat defines a 32-byte read-only constant of four copies of V.
#define splat(NAME, V) \
	DATA NAME<>+0(SB)/8, V \
	DATA NAME<>+8(SB)/8, V \
	DATA NAME<>+16(SB)/8, V \
	DATA NAME<>+24(SB)/8, V \
	GLOBL NAME<>(SB), RODATA|NOPTR, $32

// hreduce folds the 8 dwords of Y with OP (VPMAXUD, VPMINSD, VPMAXSD) into
// the lowest of X, its lower half; X1 is clobbered.
#define hreduce(OP, Y, X) \
	VEXTRACTI128 $1, Y, X1 \
	OP           X1, X, X \
	VPSHUFD      $0x4e, X, X1 \
	OP           X1, X, X \
	VPSHUFD      $0xb1, X, X1 \
	OP           X1, X, X

splat(absmask, $0x7fffffff7fffffff)

// The histogram bin of |e| is clamp((bits>>23) - 106, 0, 28): 106 is
// 127 + HistMinExp - 1, 28 is HistBins - 1. The subtraction saturates at
// 0 on the low 16 bits of each 32 (the high 16 are 0).
splat(histbias, $0x0000006a0000006a)

splat(histtop, $0x0000001c0000001c)

splat(nibble, $0x0f0f0f0f0f0f0f0f)

splat(crumb, $0x0303030303030303)

// Byte multipliers 1, 16 (pairs of nibbles into a byte).
splat(mul16, $0x1001100110011001)

// Byte multipliers 1, 4 and then word multipliers 1, 16 (four crumbs into a byte).
splat(mul4, $0x0401040104010401)

splat(wmul16, $0x0010000100100001)

// func absMaxBitsAVX2(x []float32) uint32
TEXT ·absMaxBitsAVX2(SB), NOSPLIT, $0-28
	MOVQ x_base+0(FP), SI
	MOVQ x_len+8(FP), CX
	SHRQ $3, CX
	VPXOR Y0, Y0, Y0
	VMOVDQU absmask<>(SB), Y7

absmax_loop:
	TESTQ CX, CX
	JZ    absmax_done
	VPAND   (SI), Y7, Y1
	VPMAXUD Y1, Y0, Y0
	ADDQ    $32, SI
	DECQ    CX
	JMP     absmax_loop

absmax_done:
	hreduce(VPMAXUD, Y0, X0)
	VMOVD        X0, AX
	MOVL        AX, ret+24(FP)
	VZEROUPPER
	RET

// func quantSymAVX2(codes []int8, x []float32, s float32, qmax int32)
TEXT ·quantSymAVX2(SB), NOSPLIT, $0-56
	MOVQ         codes_base+0(FP), DI
	MOVQ         x_base+24(FP), SI
	MOVQ         x_len+32(FP), CX
	SHRQ         $3, CX
	VBROADCASTSS s+48(FP), Y1
	MOVL qmax+52(FP), AX
	VMOVD AX, X2
	VPBROADCASTD X2, Y2
	VPCMPEQD     Y3, Y3, Y3
	VPXOR        Y2, Y3, Y3     // -qmax-1
	MOVL         $0x4b400000, AX // roundMagic, 1.5 * 2^23
	VMOVD        AX, X4
	VPBROADCASTD X4, Y4

qsym_loop:
	TESTQ CX, CX
	JZ    qsym_done
	VMOVUPS      (SI), Y0
	VDIVPS       Y1, Y0, Y0
	VADDPS       Y4, Y0, Y0
	VSUBPS       Y4, Y0, Y0
	VCVTTPS2DQ   Y0, Y0
	VPMAXSD      Y3, Y0, Y0
	VPMINSD      Y2, Y0, Y0
	VEXTRACTI128 $1, Y0, X5
	VPACKSSDW    X5, X0, X0
	VPACKSSWB    X0, X0, X0
	VMOVQ        X0, (DI)
	ADDQ         $32, SI
	ADDQ         $8, DI
	DECQ         CX
	JMP          qsym_loop

qsym_done:
	VZEROUPPER
	RET

// func dequantSymAVX2(dst []float32, codes []int8, s float32)
TEXT ·dequantSymAVX2(SB), NOSPLIT, $0-52
	MOVQ         dst_base+0(FP), DI
	MOVQ         dst_len+8(FP), CX
	MOVQ         codes_base+24(FP), SI
	SHRQ         $3, CX
	VBROADCASTSS s+48(FP), Y1

dqsym_loop:
	TESTQ CX, CX
	JZ    dqsym_done
	VPMOVSXBD (SI), Y0
	VCVTDQ2PS Y0, Y0
	VMULPS    Y1, Y0, Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $8, SI
	ADDQ      $32, DI
	DECQ      CX
	JMP       dqsym_loop

dqsym_done:
	VZEROUPPER
	RET

// Order keys (see orderKey): k = b ^ ((b >> 31, arithmetic) >> 1, logical).

// func minMaxAVX2(x []float32) (lo, hi int32, abits uint32)
TEXT ·minMaxAVX2(SB), NOSPLIT, $0-36
	MOVQ         x_base+0(FP), SI
	MOVQ         x_len+8(FP), CX
	SHRQ         $3, CX
	VMOVDQU      absmask<>(SB), Y7
	MOVL         $0x7f800000, AX // orderKey(+Inf)
	VMOVD        AX, X4
	VPBROADCASTD X4, Y4
	MOVL         $0x807fffff, AX // orderKey(-Inf)
	VMOVD        AX, X5
	VPBROADCASTD X5, Y5
	VPXOR        Y6, Y6, Y6

minmax_loop:
	TESTQ CX, CX
	JZ    minmax_done
	VMOVDQU (SI), Y0
	VPAND   Y7, Y0, Y1
	VPMAXUD Y1, Y6, Y6
	VPSRAD  $31, Y0, Y1
	VPSRLD  $1, Y1, Y1
	VPXOR   Y1, Y0, Y0
	VPMINSD Y0, Y4, Y4
	VPMAXSD Y0, Y5, Y5
	ADDQ    $32, SI
	DECQ    CX
	JMP     minmax_loop

minmax_done:
	hreduce(VPMINSD, Y4, X4)
	VMOVD        X4, AX
	MOVL        AX, lo+24(FP)
	hreduce(VPMAXSD, Y5, X5)
	VMOVD        X5, AX
	MOVL        AX, hi+28(FP)
	hreduce(VPMAXUD, Y6, X6)
	VMOVD        X6, AX
	MOVL        AX, abits+32(FP)
	VZEROUPPER
	RET

// func quantAsymAVX2(codes []int8, x []float32, m, s, qmax float32)
TEXT ·quantAsymAVX2(SB), NOSPLIT, $0-60
	MOVQ         codes_base+0(FP), DI
	MOVQ         x_base+24(FP), SI
	MOVQ         x_len+32(FP), CX
	SHRQ         $3, CX
	VBROADCASTSS m+48(FP), Y1
	VBROADCASTSS s+52(FP), Y2
	VBROADCASTSS qmax+56(FP), Y3
	MOVL         $0x4b400000, AX // roundMagic
	VMOVD        AX, X4
	VPBROADCASTD X4, Y4
	VXORPS       Y6, Y6, Y6

qasym_loop:
	TESTQ CX, CX
	JZ    qasym_done
	VMOVUPS      (SI), Y0
	VSUBPS       Y1, Y0, Y0
	VDIVPS       Y2, Y0, Y0
	VMAXPS       Y6, Y0, Y0
	VMINPS       Y3, Y0, Y0
	VADDPS       Y4, Y0, Y0
	VSUBPS       Y4, Y0, Y0
	VCVTTPS2DQ   Y0, Y0
	VEXTRACTI128 $1, Y0, X5
	VPACKSSDW    X5, X0, X0
	VPACKUSWB    X0, X0, X0
	VMOVQ        X0, (DI)
	ADDQ         $32, SI
	ADDQ         $8, DI
	DECQ         CX
	JMP          qasym_loop

qasym_done:
	VZEROUPPER
	RET

// func dequantAsymAVX2(dst []float32, codes []int8, mask int32, s, m float32)
TEXT ·dequantAsymAVX2(SB), NOSPLIT, $0-60
	MOVQ         dst_base+0(FP), DI
	MOVQ         dst_len+8(FP), CX
	MOVQ         codes_base+24(FP), SI
	SHRQ         $3, CX
	MOVL mask+48(FP), AX
	VMOVD AX, X3
	VPBROADCASTD X3, Y3
	VBROADCASTSS s+52(FP), Y1
	VBROADCASTSS m+56(FP), Y2

dqasym_loop:
	TESTQ CX, CX
	JZ    dqasym_done
	VPMOVZXBD (SI), Y0
	VPAND     Y3, Y0, Y0
	VCVTDQ2PS Y0, Y0
	VMULPS    Y1, Y0, Y0
	VADDPS    Y2, Y0, Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $8, SI
	ADDQ      $32, DI
	DECQ      CX
	JMP       dqasym_loop

dqasym_done:
	VZEROUPPER
	RET

// func addBlocksAVX2(x, y []float32, s *laneSums, h *histTables) uint32
//
// Lanes: Y8/Y9 Σx² for pairs 0-3/4-7 of each block, Y10/Y11 Σy², Y12/Y13
// Σxy, Y14/Y15 Σe²; Y6 the largest |e| bits. The 8 bins of a block are
// stored on the stack and counted one by one, pair k in table k%4.
TEXT ·addBlocksAVX2(SB), NOSPLIT, $32-68
	MOVQ   x_base+0(FP), SI
	MOVQ   x_len+8(FP), CX
	MOVQ   y_base+24(FP), DI
	MOVQ   s+48(FP), R8
	SHRQ   $3, CX
	VXORPD Y6, Y6, Y6
	VMOVUPD 0(R8), Y8
	VMOVUPD 32(R8), Y9
	VMOVUPD 64(R8), Y10
	VMOVUPD 96(R8), Y11
	VMOVUPD 128(R8), Y12
	VMOVUPD 160(R8), Y13
	VMOVUPD 192(R8), Y14
	VMOVUPD 224(R8), Y15
	MOVQ   h+56(FP), R8

add_loop:
	TESTQ CX, CX
	JZ    add_done
	VMOVUPS  (SI), Y0
	VMOVUPS  (DI), Y1
	VSUBPS   Y0, Y1, Y2          // e = y - x in float32
	VPAND    absmask<>(SB), Y2, Y2
	VPMAXUD  Y2, Y6, Y6
	VPSRLD   $23, Y2, Y2
	VPSUBUSW histbias<>(SB), Y2, Y2
	VPMINUD  histtop<>(SB), Y2, Y2
	VMOVDQU  Y2, 0(SP)

	VCVTPS2PD    X0, Y2 // pairs 0-3 in float64
	VCVTPS2PD    X1, Y3
	VMULPD       Y2, Y2, Y4
	VADDPD       Y4, Y8, Y8
	VMULPD       Y3, Y3, Y4
	VADDPD       Y4, Y10, Y10
	VMULPD       Y3, Y2, Y4
	VADDPD       Y4, Y12, Y12
	VSUBPD       Y2, Y3, Y4
	VMULPD       Y4, Y4, Y4
	VADDPD       Y4, Y14, Y14
	VEXTRACTF128 $1, Y0, X0
	VEXTRACTF128 $1, Y1, X1
	VCVTPS2PD    X0, Y2     // pairs 4-7
	VCVTPS2PD    X1, Y3
	VMULPD       Y2, Y2, Y4
	VADDPD       Y4, Y9, Y9
	VMULPD       Y3, Y3, Y4
	VADDPD       Y4, Y11, Y11
	VMULPD       Y3, Y2, Y4
	VADDPD       Y4, Y13, Y13
	VSUBPD       Y2, Y3, Y4
	VMULPD       Y4, Y4, Y4
	VADDPD       Y4, Y15, Y15

	MOVL 0(SP), AX
	MOVL 4(SP), BX
	MOVL 8(SP), DX
	MOVL 12(SP), R9
	INCQ (R8)(AX*8)
	INCQ 232(R8)(BX*8)
	INCQ 464(R8)(DX*8)
	INCQ 696(R8)(R9*8)
	MOVL 16(SP), AX
	MOVL 20(SP), BX
	MOVL 24(SP), DX
	MOVL 28(SP), R9
	INCQ (R8)(AX*8)
	INCQ 232(R8)(BX*8)
	INCQ 464(R8)(DX*8)
	INCQ 696(R8)(R9*8)

	ADDQ $32, SI
	ADDQ $32, DI
	DECQ CX
	JMP  add_loop

add_done:
	MOVQ s+48(FP), R8
	VMOVUPD Y8, 0(R8)
	VMOVUPD Y9, 32(R8)
	VMOVUPD Y10, 64(R8)
	VMOVUPD Y11, 96(R8)
	VMOVUPD Y12, 128(R8)
	VMOVUPD Y13, 160(R8)
	VMOVUPD Y14, 192(R8)
	VMOVUPD Y15, 224(R8)
	hreduce(VPMAXUD, Y6, X6)
	VMOVD        X6, AX
	MOVL        AX, ret+64(FP)
	VZEROUPPER
	RET

// func pack4AVX2(dst []byte, codes []int8)
TEXT ·pack4AVX2(SB), NOSPLIT, $0-48
	MOVQ    dst_base+0(FP), DI
	MOVQ    codes_base+24(FP), SI
	MOVQ    codes_len+32(FP), CX
	SHRQ    $5, CX
	VMOVDQU nibble<>(SB), Y6
	VMOVDQU mul16<>(SB), Y7

pack4_loop:
	TESTQ CX, CX
	JZ    pack4_done
	VPAND        (SI), Y6, Y0
	VPMADDUBSW   Y7, Y0, Y0 // c[2i] + 16 c[2i+1] as words
	VEXTRACTI128 $1, Y0, X1
	VPACKUSWB    X1, X0, X0
	VMOVDQU      X0, (DI)
	ADDQ         $32, SI
	ADDQ         $16, DI
	DECQ         CX
	JMP          pack4_loop

pack4_done:
	VZEROUPPER
	RET

// func pack2AVX2(dst []byte, codes []int8)
TEXT ·pack2AVX2(SB), NOSPLIT, $0-48
	MOVQ    dst_base+0(FP), DI
	MOVQ    codes_base+24(FP), SI
	MOVQ    codes_len+32(FP), CX
	SHRQ    $5, CX
	VMOVDQU crumb<>(SB), Y5
	VMOVDQU mul4<>(SB), Y6
	VMOVDQU wmul16<>(SB), Y7

pack2_loop:
	TESTQ CX, CX
	JZ    pack2_done
	VPAND        (SI), Y5, Y0
	VPMADDUBSW   Y6, Y0, Y0 // c[2i] + 4 c[2i+1] as words
	VPMADDWD     Y7, Y0, Y0 // w[2i] + 16 w[2i+1] as dwords
	VEXTRACTI128 $1, Y0, X1
	VPACKUSDW    X1, X0, X0
	VPACKUSWB    X0, X0, X0
	VMOVQ        X0, (DI)
	ADDQ         $32, SI
	ADDQ         $8, DI
	DECQ         CX
	JMP          pack2_loop

pack2_done:
	VZEROUPPER
	RET

// func hadamard8AVX2(x []float32)
//
// Stage h: lanes j with bit h clear take v[j] + v[j^h], the others
// v[j^h] - v[j], which is the pair's (a + b, a - b).
TEXT ·hadamard8AVX2(SB), NOSPLIT, $0-24
	MOVQ x_base+0(FP), SI
	MOVQ x_len+8(FP), CX
	SHRQ $3, CX

h8_loop:
	TESTQ CX, CX
	JZ    h8_done
	VMOVUPS    (SI), Y0
	VPERMILPS  $0xb1, Y0, Y1 // h = 1
	VADDPS     Y1, Y0, Y2
	VSUBPS     Y0, Y1, Y3
	VBLENDPS   $0xaa, Y3, Y2, Y0
	VPERMILPS  $0x4e, Y0, Y1 // h = 2
	VADDPS     Y1, Y0, Y2
	VSUBPS     Y0, Y1, Y3
	VBLENDPS   $0xcc, Y3, Y2, Y0
	VPERM2F128 $0x01, Y0, Y0, Y1 // h = 4
	VADDPS     Y1, Y0, Y2
	VSUBPS     Y0, Y1, Y3
	VBLENDPS   $0xf0, Y3, Y2, Y0
	VMOVUPS    Y0, (SI)
	ADDQ       $32, SI
	DECQ       CX
	JMP        h8_loop

h8_done:
	VZEROUPPER
	RET

// func hadamardStageAVX2(x []float32, h int)
TEXT ·hadamardStageAVX2(SB), NOSPLIT, $0-32
	MOVQ x_base+0(FP), SI
	MOVQ x_len+8(FP), CX
	MOVQ h+24(FP), DX
	SHLQ $2, DX          // h in bytes
	LEAQ (SI)(CX*4), R9  // end of x
	LEAQ (DX)(DX*1), R10 // 2h in bytes

hs_block:
	LEAQ (SI)(R10*1), R11 // end of this block of 2h
	CMPQ R11, R9
	JA   hs_done
	MOVQ SI, R12
	LEAQ (SI)(DX*1), R13 // end of the first half

hs_inner:
	CMPQ    R12, R13
	JAE     hs_next
	VMOVUPS (R12), Y0
	VMOVUPS (R12)(DX*1), Y1
	VADDPS  Y1, Y0, Y2
	VSUBPS  Y1, Y0, Y3
	VMOVUPS Y2, (R12)
	VMOVUPS Y3, (R12)(DX*1)
	ADDQ    $32, R12
	JMP     hs_inner

hs_next:
	MOVQ R11, SI
	JMP  hs_block

hs_done:
	VZEROUPPER
	RET

// func clampAbsAVX2(x []float32, lim float32)
// VMAXPS/VMINPS return their second source when either is NaN: with the
// value second, a NaN passes through unchanged, as Go's min(max(v, -lim), lim).
TEXT ·clampAbsAVX2(SB), NOSPLIT, $0-28
	MOVQ         x_base+0(FP), SI
	MOVQ         x_len+8(FP), CX
	SHRQ         $3, CX
	VBROADCASTSS lim+24(FP), Y1
	VPCMPEQD     Y2, Y2, Y2
	VPSLLD       $31, Y2, Y2
	VXORPS       Y1, Y2, Y2 // -lim

clamp_loop:
	TESTQ   CX, CX
	JZ      clamp_done
	VMOVUPS (SI), Y0
	VMAXPS  Y0, Y2, Y0
	VMINPS  Y0, Y1, Y0
	VMOVUPS Y0, (SI)
	ADDQ    $32, SI
	DECQ    CX
	JMP     clamp_loop

clamp_done:
	VZEROUPPER
	RET

// func scaleAVX2(x []float32, c float32)
TEXT ·scaleAVX2(SB), NOSPLIT, $0-28
	MOVQ         x_base+0(FP), SI
	MOVQ         x_len+8(FP), CX
	SHRQ         $3, CX
	VBROADCASTSS c+24(FP), Y1

scale_loop:
	TESTQ CX, CX
	JZ    scale_done
	VMULPS  (SI), Y1, Y0
	VMOVUPS Y0, (SI)
	ADDQ    $32, SI
	DECQ    CX
	JMP     scale_loop

scale_done:
	VZEROUPPER
	RET

// func argAbsMax32AVX2(x []float32) (i int, abits uint32)
//
// x holds 32 values: the largest |x| bits, and the first index holding them.
TEXT ·argAbsMax32AVX2(SB), NOSPLIT, $0-36
	MOVQ       x_base+0(FP), SI
	VMOVDQU    absmask<>(SB), Y7
	VPAND      0(SI), Y7, Y0
	VPAND      32(SI), Y7, Y1
	VPAND      64(SI), Y7, Y2
	VPAND      96(SI), Y7, Y3
	VPMAXUD    Y1, Y0, Y4
	VPMAXUD    Y3, Y2, Y5
	VPMAXUD    Y5, Y4, Y4
	VPERM2I128 $0x01, Y4, Y4, Y5
	VPMAXUD    Y5, Y4, Y4
	VPSHUFD    $0x4e, Y4, Y5
	VPMAXUD    Y5, Y4, Y4
	VPSHUFD    $0xb1, Y4, Y5
	VPMAXUD    Y5, Y4, Y4 // the maximum in every lane
	VPCMPEQD   Y4, Y0, Y0
	VPCMPEQD   Y4, Y1, Y1
	VPCMPEQD   Y4, Y2, Y2
	VPCMPEQD   Y4, Y3, Y3
	VMOVMSKPS  Y0, AX
	VMOVMSKPS  Y1, BX
	VMOVMSKPS  Y2, CX
	VMOVMSKPS  Y3, DX
	SHLL       $8, BX
	ORL        BX, AX
	SHLL       $16, CX
	ORL        CX, AX
	SHLL       $24, DX
	ORL        DX, AX
	BSFL       AX, AX
	MOVQ       AX, i+24(FP)
	VMOVD      X4, BX
	MOVL       BX, abits+32(FP)
	VZEROUPPER
	RET

// packCodes32 stores the int32 codes in Y0-Y3 (32 of them, each within
// a byte: unsigned 0..255 with PACK=VPACKUSWB, signed with VPACKSSWB) as
// 32 bytes at (DI), in order. Y5 holds the dword order 0,4,1,5,2,6,3,7.
#define packCodes32(PACK) \
	VPACKSSDW Y1, Y0, Y0 \
	VPACKSSDW Y3, Y2, Y2 \
	PACK      Y2, Y0, Y0 \
	VPERMD    Y0, Y5, Y0 \
	VMOVDQU   Y0, (DI)

DATA packorder<>+0(SB)/4, $0
DATA packorder<>+4(SB)/4, $4
DATA packorder<>+8(SB)/4, $1
DATA packorder<>+12(SB)/4, $5
DATA packorder<>+16(SB)/4, $2
DATA packorder<>+20(SB)/4, $6
DATA packorder<>+24(SB)/4, $3
DATA packorder<>+28(SB)/4, $7
GLOBL packorder<>(SB), RODATA|NOPTR, $32

// offsetCode is truncate(clamp(float32(float32(x - lo) * id) + off, 0, qmax))
// for the 8 values at off(SI), into R. VMAXPS returns its second source
// for a NaN in the first, so a NaN gives 0, as truncCode does.
#define offsetCode(OFF, R) \
	VMOVUPS    OFF(SI), R \
	VSUBPS     Y8, R, R \
	VMULPS     Y9, R, R \
	VADDPS     Y10, R, R \
	VMAXPS     Y12, R, R \
	VMINPS     Y11, R, R \
	VCVTTPS2DQ R, R

// func offsetCodes32AVX2(q []uint8, x []float32, lo, id, off, qmax float32)
TEXT ·offsetCodes32AVX2(SB), NOSPLIT, $0-64
	MOVQ         q_base+0(FP), DI
	MOVQ         x_base+24(FP), SI
	VBROADCASTSS lo+48(FP), Y8
	VBROADCASTSS id+52(FP), Y9
	VBROADCASTSS off+56(FP), Y10
	VBROADCASTSS qmax+60(FP), Y11
	VXORPS       Y12, Y12, Y12
	VMOVDQU      packorder<>(SB), Y5
	offsetCode(0, Y0)
	offsetCode(32, Y1)
	offsetCode(64, Y2)
	offsetCode(96, Y3)
	packCodes32(VPACKUSWB)
	VZEROUPPER
	RET

DATA half<>+0(SB)/4, $0x3f000000
GLOBL half<>(SB), RODATA|NOPTR, $4

DATA one<>+0(SB)/4, $0x3f800000
GLOBL one<>(SB), RODATA|NOPTR, $4

DATA inf<>+0(SB)/4, $0x7f800000
GLOBL inf<>(SB), RODATA|NOPTR, $4

// int8Bounds sets Y14 to 127 and Y15 to -128 (float32, 8 lanes), the
// int8 codes' clamps.
#define int8Bounds() \
	MOVL         $0x42fe0000, AX \
	VMOVD        AX, X14 \
	VPBROADCASTD X14, Y14 \
	MOVL         $0xc3000000, AX \
	VMOVD        AX, X15 \
	VPBROADCASTD X15, Y15

// roundCode is round-half-away-from-zero(float32(x * id)) for the 8 values
// at off(SI), into R: t's integer part, plus sign(t) where |t - trunc t| >= 0.5.
// Both steps are exact in float32. The result is clamped to [-128, 127]
// (Y14, Y15), and a non-finite t (Y13 false) gives 0.
#define roundCode(OFF, R) \
	VMULPS     OFF(SI), Y9, R \
	VANDPS     Y7, R, Y13 \
	VCMPPS     $0x01, Y12, Y13, Y13 \
	VROUNDPS   $3, R, Y4 \
	VSUBPS     Y4, R, Y6 \
	VANDPS     Y7, Y6, Y6 \
	VCMPPS     $0x1d, Y10, Y6, Y6 \
	VANDNPS    R, Y7, R \
	VORPS      Y11, R, R \
	VANDPS     Y6, R, R \
	VADDPS     R, Y4, R \
	VMINPS     R, Y14, R \
	VMAXPS     Y15, R, R \
	VANDPS     Y13, R, R \
	VCVTTPS2DQ R, R

// func roundCodes32AVX2(q []uint8, x []float32, id float32)
TEXT ·roundCodes32AVX2(SB), NOSPLIT, $0-52
	MOVQ         q_base+0(FP), DI
	MOVQ         x_base+24(FP), SI
	VBROADCASTSS id+48(FP), Y9
	VMOVDQU      absmask<>(SB), Y7
	VBROADCASTSS half<>(SB), Y10
	VBROADCASTSS one<>(SB), Y11
	VBROADCASTSS inf<>(SB), Y12
	int8Bounds()
	VMOVDQU      packorder<>(SB), Y5
	roundCode(0, Y0)
	roundCode(32, Y1)
	roundCode(64, Y2)
	roundCode(96, Y3)
	packCodes32(VPACKSSWB)
	VZEROUPPER
	RET

// func transposeAVX2(dst, src []float32, r, c int)
//
// Writes the [r, c] matrix src as [c, r] into dst, r and c multiples of 8,
// in tiles of 8x8 transposed in registers.
TEXT ·transposeAVX2(SB), NOSPLIT, $0-64
	MOVQ dst_base+0(FP), DI
	MOVQ src_base+24(FP), SI
	MOVQ r+48(FP), R8
	MOVQ c+56(FP), R9
	LEAQ (R9*4), R10     // source row stride, bytes
	LEAQ (R8*4), R11     // destination row stride, bytes
	LEAQ (R10)(R10*2), R12
	LEAQ (R11)(R11*2), R13
	XORQ AX, AX          // i0, the source row

tr_rows:
	CMPQ AX, R8
	JAE  tr_done
	XORQ BX, BX          // j0, the source column

tr_cols:
	CMPQ BX, R9
	JAE  tr_next_rows
	MOVQ AX, CX          // source tile: SI + 4 (i0 c + j0)
	IMULQ R9, CX
	ADDQ BX, CX
	LEAQ (SI)(CX*4), CX
	LEAQ (CX)(R10*4), DX
	VMOVUPS (CX), Y0
	VMOVUPS (CX)(R10*1), Y1
	VMOVUPS (CX)(R10*2), Y2
	VMOVUPS (CX)(R12*1), Y3
	VMOVUPS (DX), Y4
	VMOVUPS (DX)(R10*1), Y5
	VMOVUPS (DX)(R10*2), Y6
	VMOVUPS (DX)(R12*1), Y7
	VUNPCKLPS  Y1, Y0, Y8
	VUNPCKHPS  Y1, Y0, Y9
	VUNPCKLPS  Y3, Y2, Y10
	VUNPCKHPS  Y3, Y2, Y11
	VUNPCKLPS  Y5, Y4, Y12
	VUNPCKHPS  Y5, Y4, Y13
	VUNPCKLPS  Y7, Y6, Y14
	VUNPCKHPS  Y7, Y6, Y15
	VSHUFPS    $0x44, Y10, Y8, Y0
	VSHUFPS    $0xee, Y10, Y8, Y1
	VSHUFPS    $0x44, Y11, Y9, Y2
	VSHUFPS    $0xee, Y11, Y9, Y3
	VSHUFPS    $0x44, Y14, Y12, Y4
	VSHUFPS    $0xee, Y14, Y12, Y5
	VSHUFPS    $0x44, Y15, Y13, Y6
	VSHUFPS    $0xee, Y15, Y13, Y7
	VPERM2F128 $0x20, Y4, Y0, Y8
	VPERM2F128 $0x20, Y5, Y1, Y9
	VPERM2F128 $0x20, Y6, Y2, Y10
	VPERM2F128 $0x20, Y7, Y3, Y11
	VPERM2F128 $0x31, Y4, Y0, Y12
	VPERM2F128 $0x31, Y5, Y1, Y13
	VPERM2F128 $0x31, Y6, Y2, Y14
	VPERM2F128 $0x31, Y7, Y3, Y15
	MOVQ BX, CX          // destination tile: DI + 4 (j0 r + i0)
	IMULQ R8, CX
	ADDQ AX, CX
	LEAQ (DI)(CX*4), CX
	LEAQ (CX)(R11*4), DX
	VMOVUPS Y8, (CX)
	VMOVUPS Y9, (CX)(R11*1)
	VMOVUPS Y10, (CX)(R11*2)
	VMOVUPS Y11, (CX)(R13*1)
	VMOVUPS Y12, (DX)
	VMOVUPS Y13, (DX)(R11*1)
	VMOVUPS Y14, (DX)(R11*2)
	VMOVUPS Y15, (DX)(R13*1)
	ADDQ $8, BX
	JMP  tr_cols

tr_next_rows:
	ADDQ $8, AX
	JMP  tr_rows

tr_done:
	VZEROUPPER
	RET

// rneCode is the x86 build's q8_0 code of the 8 values at off(SI), into R,
// with the instructions ggml uses (ggml-cpu/arch/x86/quants.c:333-353):
// VMULPS by id, VROUNDPS to nearest even, VCVTPS2DQ (a NaN or a value
// beyond int32 gives 0x80000000); the packs saturate to int8.
#define rneCode(OFF, R) \
	VMULPS    OFF(SI), Y9, R \
	VROUNDPS  $0, R, R \
	VCVTPS2DQ R, R

// func rneCodes32AVX2(q []uint8, x []float32, id float32)
TEXT ·rneCodes32AVX2(SB), NOSPLIT, $0-52
	MOVQ         q_base+0(FP), DI
	MOVQ         x_base+24(FP), SI
	VBROADCASTSS id+48(FP), Y9
	VMOVDQU      packorder<>(SB), Y5
	rneCode(0, Y0)
	rneCode(32, Y1)
	rneCode(64, Y2)
	rneCode(96, Y3)
	packCodes32(VPACKSSWB)
	VZEROUPPER
	RET

// The fp16 round trip of ExLlama's emulated fp16 arithmetic (rn16 in
// exllamav2.go) on 8 lanes: VCVTPS2PH (round to nearest even, subnormals
// kept, overflow to Inf) and back is rn16 for every non-NaN; a NaN lane is
// sign | 0x7fc00000, as rn16 gives (F16C would keep the top of its payload).
// Y14 holds the sign mask, Y15 0x7fc00000; X8, Y9, Y10 are clobbered.
#define rn16(R) \
	VCVTPS2PH $0, R, X8 \
	VCVTPH2PS X8, Y9 \
	VCMPPS    $3, R, R, Y10 \
	VANDPS    Y14, R, R \
	VORPS     Y15, R, R \
	VBLENDVPS Y10, R, Y9, R

splat(signmask, $0x8000000080000000)

splat(qnan32, $0x7fc000007fc00000)

// exl2Intra runs butterfly stages h = 2 and 4 of exl2Hadamard on the 8
// values of R, each stage's results through rn16 (Y11-Y13 clobbered).
#define exl2Intra(R) \
	VPERMILPS  $0x4e, R, Y11 \
	VADDPS     Y11, R, Y12 \
	VSUBPS     R, Y11, Y13 \
	VBLENDPS   $0xcc, Y13, Y12, R \
	rn16(R) \
	VPERM2F128 $0x01, R, R, Y11 \
	VADDPS     Y11, R, Y12 \
	VSUBPS     R, Y11, Y13 \
	VBLENDPS   $0xf0, Y13, Y12, R \
	rn16(R)

// exl2Pair is one butterfly of two registers: A, B = rn16(A+B), rn16(A-B).
#define exl2Pair(A, B) \
	VADDPS  B, A, Y11 \
	VSUBPS  B, A, B \
	VMOVAPS Y11, A \
	rn16(A) \
	rn16(B)

// exl2Butterfly is exl2Hadamard on the chunk of 64 in Y0-Y7.
#define exl2Butterfly \
	exl2Intra(Y0) \
	exl2Intra(Y1) \
	exl2Intra(Y2) \
	exl2Intra(Y3) \
	exl2Intra(Y4) \
	exl2Intra(Y5) \
	exl2Intra(Y6) \
	exl2Intra(Y7) \
	exl2Pair(Y0, Y1) \
	exl2Pair(Y2, Y3) \
	exl2Pair(Y4, Y5) \
	exl2Pair(Y6, Y7) \
	exl2Pair(Y0, Y2) \
	exl2Pair(Y1, Y3) \
	exl2Pair(Y4, Y6) \
	exl2Pair(Y5, Y7) \
	exl2Pair(Y0, Y4) \
	exl2Pair(Y1, Y5) \
	exl2Pair(Y2, Y6) \
	exl2Pair(Y3, Y7)

// exl2AbsMax is the largest |v| of Y(A) .. Y(A+3) into X(ACC) (its lowest
// lane): VMAXPS returns its second source when the first is a NaN, so a NaN
// never wins, as in the Go loop. Y8-Y10 clobbered; Y13 holds the abs mask.
#define exl2AbsMax(R0, R1, R2, R3, ACC, XACC) \
	VXORPS       ACC, ACC, ACC \
	VANDPS       Y13, R0, Y8 \
	VMAXPS       ACC, Y8, ACC \
	VANDPS       Y13, R1, Y8 \
	VMAXPS       ACC, Y8, ACC \
	VANDPS       Y13, R2, Y8 \
	VMAXPS       ACC, Y8, ACC \
	VANDPS       Y13, R3, Y8 \
	VMAXPS       ACC, Y8, ACC \
	VEXTRACTF128 $1, ACC, X8 \
	VMAXPS       X8, XACC, XACC \
	VPERMILPS    $0x4e, XACC, X8 \
	VMAXPS       X8, XACC, XACC \
	VPERMILPS    $0xb1, XACC, X8 \
	VMAXPS       X8, XACC, XACC

// exl2Top ORs (bits & 0x7f800000) + 0x00800000 of R into Y11: the top
// bit is set where the exponent is all ones (a NaN or an Inf).
#define exl2Top(R) \
	VPAND  Y12, R, Y8 \
	VPADDD Y13, Y8, Y8 \
	VPOR   Y8, Y11, Y11

splat(expmask, $0x7f8000007f800000)

splat(expone, $0x0080000000800000)

// func exl2EncRotAVX2(w, x *[64]float32) (amax0, amax1 float32, top uint32)
TEXT ·exl2EncRotAVX2(SB), NOSPLIT, $0-28
	MOVQ    w+0(FP), DI
	MOVQ    x+8(FP), SI
	VMOVDQU signmask<>(SB), Y14
	VMOVDQU qnan32<>(SB), Y15
	VMOVDQU expmask<>(SB), Y12
	VMOVDQU expone<>(SB), Y13
	VPXOR   Y11, Y11, Y11
	VMOVUPS 0(SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VMOVUPS 128(SI), Y4
	VMOVUPS 160(SI), Y5
	VMOVUPS 192(SI), Y6
	VMOVUPS 224(SI), Y7
	exl2Top(Y0)
	exl2Top(Y1)
	exl2Top(Y2)
	exl2Top(Y3)
	exl2Top(Y4)
	exl2Top(Y5)
	exl2Top(Y6)
	exl2Top(Y7)
	VMOVMSKPS Y11, AX
	MOVL      AX, top+24(FP)
	rn16(Y0)
	rn16(Y1)
	rn16(Y2)
	rn16(Y3)
	rn16(Y4)
	rn16(Y5)
	rn16(Y6)
	rn16(Y7)
	exl2Butterfly
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	VMOVUPS Y4, 128(DI)
	VMOVUPS Y5, 160(DI)
	VMOVUPS Y6, 192(DI)
	VMOVUPS Y7, 224(DI)
	VMOVDQU absmask<>(SB), Y13
	exl2AbsMax(Y0, Y1, Y2, Y3, Y11, X11)
	exl2AbsMax(Y4, Y5, Y6, Y7, Y12, X12)
	VMOVSS  X11, amax0+16(FP)
	VMOVSS  X12, amax1+20(FP)
	VZEROUPPER
	RET

// exl2Code is clamp(rint(rn16(rn16(w/amax)·m + m)), 0, qmax) for the 8
// values at OFF(SI), into R (an int32 each; a NaN converts to 0x80000000,
// which the clamp takes to 0). Y11 amax, Y12 m, Y13 qmax (int32), Y4 zero.
#define exl2Code(OFF, R) \
	VMOVUPS   OFF(SI), R \
	VDIVPS    Y11, R, R \
	rn16(R) \
	VMULPS    Y12, R, R \
	VADDPS    Y12, R, R \
	rn16(R) \
	VCVTPS2DQ R, R \
	VPMAXSD   Y4, R, R \
	VPMINSD   Y13, R, R

// exl2Codes32 leaves the 32 codes of (SI) in order as bytes in Y0; Y11
// holds amax, Y12 m, Y13 qmax (int32).
#define exl2Codes32 \
	VPXOR        Y4, Y4, Y4 \
	VMOVDQU      signmask<>(SB), Y14 \
	VMOVDQU      qnan32<>(SB), Y15 \
	VMOVDQU      packorder<>(SB), Y5 \
	exl2Code(0, Y0) \
	exl2Code(32, Y1) \
	exl2Code(64, Y2) \
	exl2Code(96, Y3) \
	VPACKSSDW    Y1, Y0, Y0 \
	VPACKSSDW    Y3, Y2, Y2 \
	VPACKUSWB    Y2, Y0, Y0 \
	VPERMD       Y0, Y5, Y0

// func exl2Codes8AVX2(q *[32]uint8, w *[32]float32, amax, m float32, qmax int32)
TEXT ·exl2Codes8AVX2(SB), NOSPLIT, $0-28
	MOVQ    q+0(FP), DI
	MOVQ         w+8(FP), SI
	VBROADCASTSS amax+16(FP), Y11
	VBROADCASTSS m+20(FP), Y12
	VBROADCASTSS qmax+24(FP), Y13
	exl2Codes32
	VMOVDQU Y0, (DI)
	VZEROUPPER
	RET

// func exl2Codes4AVX2(q *[16]uint8, w *[32]float32, amax, m float32, qmax int32)
// stores the codes two a byte, element 2k in the low nibble.
TEXT ·exl2Codes4AVX2(SB), NOSPLIT, $0-28
	MOVQ         q+0(FP), DI
	MOVQ         w+8(FP), SI
	VBROADCASTSS amax+16(FP), Y11
	VBROADCASTSS m+20(FP), Y12
	VBROADCASTSS qmax+24(FP), Y13
	exl2Codes32
	VMOVDQU      mul16<>(SB), Y7
	VPMADDUBSW   Y7, Y0, Y0
	VEXTRACTI128 $1, Y0, X1
	VPACKUSWB    X1, X0, X0
	VMOVDQU      X0, (DI)
	VZEROUPPER
	RET

// exl2Value is rn16(float32(q - m) · S) for the 8 codes (int32) in R; Y12
// holds m (int32).
#define exl2Value(S, R) \
	VPSUBD    Y12, R, R \
	VCVTDQ2PS R, R \
	VMULPS    S, R, R \
	rn16(R)

// exl2Out is rn16(R · 2^-5) stored at OFF(DI); Y13 holds 2^-5.
#define exl2Out(R, OFF) \
	VMULPS  Y13, R, R \
	rn16(R) \
	VMOVUPS R, OFF(DI)

// exl2Dec is exl2Dequantizer's chunk from the codes (int32) in Y0-Y7.
#define exl2Dec \
	exl2Value(Y11, Y0) \
	exl2Value(Y11, Y1) \
	exl2Value(Y11, Y2) \
	exl2Value(Y11, Y3) \
	exl2Value(Y13, Y4) \
	exl2Value(Y13, Y5) \
	exl2Value(Y13, Y6) \
	exl2Value(Y13, Y7) \
	exl2Butterfly \
	VBROADCASTSS exl2inv32<>(SB), Y13 \
	exl2Out(Y0, 0) \
	exl2Out(Y1, 32) \
	exl2Out(Y2, 64) \
	exl2Out(Y3, 96) \
	exl2Out(Y4, 128) \
	exl2Out(Y5, 160) \
	exl2Out(Y6, 192) \
	exl2Out(Y7, 224)

// func exl2Dec8AVX2(dst *[64]float32, q *[64]uint8, s0, s1 float32, m int32)
TEXT ·exl2Dec8AVX2(SB), NOSPLIT, $0-28
	MOVQ         dst+0(FP), DI
	MOVQ         q+8(FP), SI
	VBROADCASTSS s0+16(FP), Y11
	VBROADCASTSS s1+20(FP), Y13
	VBROADCASTSS m+24(FP), Y12
	VMOVDQU      signmask<>(SB), Y14
	VMOVDQU      qnan32<>(SB), Y15
	VPMOVZXBD 0(SI), Y0
	VPMOVZXBD 8(SI), Y1
	VPMOVZXBD 16(SI), Y2
	VPMOVZXBD 24(SI), Y3
	VPMOVZXBD 32(SI), Y4
	VPMOVZXBD 40(SI), Y5
	VPMOVZXBD 48(SI), Y6
	VPMOVZXBD 56(SI), Y7
	exl2Dec
	VZEROUPPER
	RET

// func exl2Dec4AVX2(dst *[64]float32, q *[32]uint8, s0, s1 float32, m int32)
// reads the codes two a byte, element 2k in the low nibble.
TEXT ·exl2Dec4AVX2(SB), NOSPLIT, $0-28
	MOVQ         dst+0(FP), DI
	MOVQ         q+8(FP), SI
	VBROADCASTSS s0+16(FP), Y11
	VBROADCASTSS s1+20(FP), Y13
	VBROADCASTSS m+24(FP), Y12
	VMOVDQU      signmask<>(SB), Y14
	VMOVDQU      qnan32<>(SB), Y15
	VMOVDQU    nibble<>(SB), X6
	VMOVDQU    0(SI), X4
	VMOVDQU    16(SI), X5
	VPAND      X6, X4, X0
	VPSRLW     $4, X4, X1
	VPAND      X6, X1, X1
	VPUNPCKLBW X1, X0, X2 // codes 0-15
	VPUNPCKHBW X1, X0, X3 // codes 16-31
	VPAND      X6, X5, X0
	VPSRLW     $4, X5, X1
	VPAND      X6, X1, X1
	VPUNPCKLBW X1, X0, X4 // codes 32-47
	VPUNPCKHBW X1, X0, X5 // codes 48-63
	VPSRLDQ    $8, X5, X7
	VPMOVZXBD  X7, Y7
	VPMOVZXBD  X5, Y6
	VPSRLDQ    $8, X4, X5
	VPMOVZXBD  X5, Y5
	VPMOVZXBD  X4, Y4
	VPSRLDQ    $8, X2, X8
	VPSRLDQ    $8, X3, X9
	VMOVDQA    X3, X10
	VPMOVZXBD  X2, Y0
	VPMOVZXBD  X8, Y1
	VPMOVZXBD  X10, Y2
	VPMOVZXBD  X9, Y3
	exl2Dec
	VZEROUPPER
	RET

DATA exl2inv32<>+0(SB)/4, $0x3d000000
GLOBL exl2inv32<>(SB), RODATA|NOPTR, $4

// func rn16sAVX2(x []float32)
TEXT ·rn16sAVX2(SB), NOSPLIT, $0-24
	MOVQ    x_base+0(FP), SI
	MOVQ    x_len+8(FP), CX
	SHRQ    $3, CX
	JZ      rn16s_done
	VMOVDQU signmask<>(SB), Y14
	VMOVDQU qnan32<>(SB), Y15

rn16s_loop:
	VMOVUPS (SI), Y0
	rn16(Y0)
	VMOVUPS Y0, (SI)
	ADDQ    $32, SI
	DECQ    CX
	JNZ     rn16s_loop

rn16s_done:
	VZEROUPPER
	RET

// exl3Intra runs stages h = 1, 2 and 4 of exl3Hadamard (float32, no
// rounding between stages) on the 8 values of R; Y11-Y13 clobbered.
#define exl3Intra(R) \
	VPERMILPS  $0xb1, R, Y11 \
	VADDPS     Y11, R, Y12 \
	VSUBPS     R, Y11, Y13 \
	VBLENDPS   $0xaa, Y13, Y12, R \
	VPERMILPS  $0x4e, R, Y11 \
	VADDPS     Y11, R, Y12 \
	VSUBPS     R, Y11, Y13 \
	VBLENDPS   $0xcc, Y13, Y12, R \
	VPERM2F128 $0x01, R, R, Y11 \
	VADDPS     Y11, R, Y12 \
	VSUBPS     R, Y11, Y13 \
	VBLENDPS   $0xf0, Y13, Y12, R

// exl3Pair is one butterfly of two registers: A, B = A+B, A-B.
#define exl3Pair(A, B) \
	VADDPS  B, A, Y11 \
	VSUBPS  B, A, B \
	VMOVAPS Y11, A

// exl3Butterfly is exl3Hadamard on the group of 32 in Y0-Y3.
#define exl3Butterfly \
	exl3Intra(Y0) \
	exl3Intra(Y1) \
	exl3Intra(Y2) \
	exl3Intra(Y3) \
	exl3Pair(Y0, Y1) \
	exl3Pair(Y2, Y3) \
	exl3Pair(Y0, Y2) \
	exl3Pair(Y1, Y3)

// exl3Code is clamp(floor(float32(float32(v·inv)·m + m)), 0, qmax) of R in
// place (an int32 each; a NaN truncates to 0x80000000, which the clamp
// takes to 0). Y12 inv, Y13 m, Y10 qmax (int32), Y9 zero.
#define exl3Code(R) \
	VMULPS     Y12, R, R \
	VMULPS     Y13, R, R \
	VADDPS     Y13, R, R \
	VROUNDPS   $1, R, R \
	VCVTTPS2DQ R, R \
	VPMAXSD    Y9, R, R \
	VPMINSD    Y10, R, R

DATA exl3r32<>+0(SB)/4, $0x3e3504f3
GLOBL exl3r32<>(SB), RODATA|NOPTR, $4

DATA exl3eps<>+0(SB)/4, $0x2edbe6ff
GLOBL exl3eps<>(SB), RODATA|NOPTR, $4

// exl3Planes stores the codes in Y0 (32 bytes in order) as the bit planes
// of a BITS-bit code (CX) at (DI): all 32 bytes at 8 bits; else a plane of
// 4, 2 and 1 bits for each set in BITS, the first holding the top bits,
// each the fields in order from the lowest bit (exl3Quantizer's words are
// little-endian). DX, X1-X3 clobbered.
// func exl3EncAVX2(dst *byte, x *[32]float32, m float32, qmax int32, bits int) (s float32, top uint32)
TEXT ·exl3EncAVX2(SB), NOSPLIT, $0-40
	MOVQ    dst+0(FP), DI
	MOVQ    x+8(FP), SI
	VMOVDQU signmask<>(SB), Y14
	VMOVDQU qnan32<>(SB), Y15
	VMOVDQU expmask<>(SB), Y12
	VMOVDQU expone<>(SB), Y13
	VPXOR   Y11, Y11, Y11
	VMOVUPS 0(SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	exl2Top(Y0)
	exl2Top(Y1)
	exl2Top(Y2)
	exl2Top(Y3)
	VMOVMSKPS Y11, AX
	MOVL      AX, top+36(FP)
	rn16(Y0)
	rn16(Y1)
	rn16(Y2)
	rn16(Y3)
	exl3Butterfly
	VBROADCASTSS exl3r32<>(SB), Y11
	VMULPS       Y11, Y0, Y0
	VMULPS       Y11, Y1, Y1
	VMULPS       Y11, Y2, Y2
	VMULPS       Y11, Y3, Y3
	VMOVDQU      absmask<>(SB), Y13
	exl2AbsMax(Y0, Y1, Y2, Y3, Y11, X11)
	VADDSS       exl3eps<>(SB), X11, X11 // s = max|v| + 1e-10
	VMOVSS       X11, s+32(FP)
	VMOVSS       one<>(SB), X12
	VDIVSS       X11, X12, X12           // 1/s
	VBROADCASTSS X12, Y12
	VBROADCASTSS m+16(FP), Y13
	VBROADCASTSS qmax+20(FP), Y10
	VPXOR        Y9, Y9, Y9
	exl3Code(Y0)
	exl3Code(Y1)
	exl3Code(Y2)
	exl3Code(Y3)
	VMOVDQU      packorder<>(SB), Y5
	VPACKSSDW    Y1, Y0, Y0
	VPACKSSDW    Y3, Y2, Y2
	VPACKUSWB    Y2, Y0, Y0
	VPERMD       Y0, Y5, Y0
	MOVQ         bits+24(FP), CX
	CMPQ         CX, $8
	JNE          exl3enc_planes
	VMOVDQU      Y0, (DI)
	JMP          exl3enc_done

exl3enc_planes:
	MOVQ  CX, DX // the bits below the plane
	TESTQ $4, CX
	JZ    exl3enc_p2
	SUBQ         $4, DX
	VMOVQ        DX, X1
	VPSRLW       X1, Y0, Y2
	VPAND        nibble<>(SB), Y2, Y2
	VPMADDUBSW   mul16<>(SB), Y2, Y2 // c[2i] + 16 c[2i+1] as words
	VEXTRACTI128 $1, Y2, X3
	VPACKUSWB    X3, X2, X2
	VMOVDQU      X2, (DI)
	ADDQ         $16, DI

exl3enc_p2:
	TESTQ $2, CX
	JZ    exl3enc_p1
	SUBQ         $2, DX
	VMOVQ        DX, X1
	VPSRLW       X1, Y0, Y2
	VPAND        crumb<>(SB), Y2, Y2
	VPMADDUBSW   mul4<>(SB), Y2, Y2  // c[2i] + 4 c[2i+1] as words
	VPMADDWD     wmul16<>(SB), Y2, Y2 // w[2i] + 16 w[2i+1] as dwords
	VEXTRACTI128 $1, Y2, X3
	VPACKUSDW    X3, X2, X2
	VPACKUSWB    X2, X2, X2
	VMOVQ        X2, (DI)
	ADDQ         $8, DI

exl3enc_p1:
	TESTQ $1, CX
	JZ    exl3enc_done
	VPSLLW    $7, Y0, Y2 // bit 0 of each byte to its top
	VPMOVMSKB Y2, AX
	MOVL      AX, (DI)

exl3enc_done:
	VZEROUPPER
	RET

// Byte indices and bit masks to spread a plane's bytes over its codes:
// crumb j (of 32) is in byte j/4 at bits 2(j%4); bit j in byte j/8.
DATA exl3idx2<>+0(SB)/8, $0x0101010100000000
DATA exl3idx2<>+8(SB)/8, $0x0303030302020202
DATA exl3idx2<>+16(SB)/8, $0x0505050504040404
DATA exl3idx2<>+24(SB)/8, $0x0707070706060606
GLOBL exl3idx2<>(SB), RODATA|NOPTR, $32

DATA exl3idx1<>+0(SB)/8, $0x0000000000000000
DATA exl3idx1<>+8(SB)/8, $0x0101010101010101
DATA exl3idx1<>+16(SB)/8, $0x0202020202020202
DATA exl3idx1<>+24(SB)/8, $0x0303030303030303
GLOBL exl3idx1<>(SB), RODATA|NOPTR, $32

splat(exl3lo2, $0x4010040140100401)

splat(exl3hi2, $0x8020080280200802)

splat(exl3bit, $0x8040201008040201)

splat(bytes1, $0x0101010101010101)

splat(bytes2, $0x0202020202020202)

// exl3Bit is 1 in each byte of R where R & M is M (M in Y13), else 0, as
// bytes AND'd with Y9 (1 or 2); R = that. Y10 clobbered.
#define exl3Bit(R, OUT, ONE) \
	VPAND   Y13, R, Y10 \
	VPCMPEQB Y13, Y10, Y10 \
	VPAND   ONE, Y10, OUT

// func exl3DecAVX2(dst *[32]float32, src *byte, sm, c float32, bits int)
// is rn16 of the butterfly of (float32(q) - c) · sm, the codes q read from
// the bit planes exl3EncAVX2 writes.
TEXT ·exl3DecAVX2(SB), NOSPLIT, $0-32
	MOVQ    dst+0(FP), DI
	MOVQ    src+8(FP), SI
	MOVQ    bits+24(FP), CX
	CMPQ    CX, $8
	JNE     exl3dec_planes
	VMOVDQU (SI), Y6
	JMP     exl3dec_codes

exl3dec_planes:
	VPXOR Y6, Y6, Y6 // the codes, a byte each
	TESTQ $4, CX
	JZ    exl3dec_p2
	VMOVDQU     nibble<>(SB), X5
	VMOVDQU     (SI), X4
	VPAND       X5, X4, X0
	VPSRLW      $4, X4, X1
	VPAND       X5, X1, X1
	VPUNPCKLBW  X1, X0, X2 // codes 0-15
	VPUNPCKHBW  X1, X0, X3 // codes 16-31
	VINSERTI128 $1, X3, Y2, Y6
	ADDQ        $16, SI

exl3dec_p2:
	TESTQ $2, CX
	JZ    exl3dec_p1
	VPSLLW       $2, Y6, Y6
	VPBROADCASTQ (SI), Y4
	VPSHUFB      exl3idx2<>(SB), Y4, Y4
	VMOVDQU      bytes1<>(SB), Y8
	VMOVDQU      bytes2<>(SB), Y9
	VMOVDQU      exl3lo2<>(SB), Y13
	exl3Bit(Y4, Y0, Y8)
	VMOVDQU      exl3hi2<>(SB), Y13
	exl3Bit(Y4, Y1, Y9)
	VPOR         Y0, Y6, Y6
	VPOR         Y1, Y6, Y6
	ADDQ         $8, SI

exl3dec_p1:
	TESTQ $1, CX
	JZ    exl3dec_codes
	VPADDB       Y6, Y6, Y6
	VPBROADCASTD (SI), Y4
	VPSHUFB      exl3idx1<>(SB), Y4, Y4
	VMOVDQU      bytes1<>(SB), Y8
	VMOVDQU      exl3bit<>(SB), Y13
	exl3Bit(Y4, Y0, Y8)
	VPOR         Y0, Y6, Y6

exl3dec_codes:
	VEXTRACTI128 $1, Y6, X7
	VPSRLDQ      $8, X6, X1
	VPMOVZXBD    X1, Y1
	VPMOVZXBD    X6, Y0
	VPSRLDQ      $8, X7, X3
	VPMOVZXBD    X3, Y3
	VPMOVZXBD    X7, Y2
	VBROADCASTSS sm+16(FP), Y4
	VBROADCASTSS c+20(FP), Y5
	VMOVDQU      signmask<>(SB), Y14
	VMOVDQU      qnan32<>(SB), Y15
	VCVTDQ2PS    Y0, Y0
	VCVTDQ2PS    Y1, Y1
	VCVTDQ2PS    Y2, Y2
	VCVTDQ2PS    Y3, Y3
	VSUBPS       Y5, Y0, Y0
	VSUBPS       Y5, Y1, Y1
	VSUBPS       Y5, Y2, Y2
	VSUBPS       Y5, Y3, Y3
	VMULPS       Y4, Y0, Y0
	VMULPS       Y4, Y1, Y1
	VMULPS       Y4, Y2, Y2
	VMULPS       Y4, Y3, Y3
	exl3Butterfly
	rn16(Y0)
	rn16(Y1)
	rn16(Y2)
	rn16(Y3)
	VMOVUPS      Y0, 0(DI)
	VMOVUPS      Y1, 32(DI)
	VMOVUPS      Y2, 64(DI)
	VMOVUPS      Y3, 96(DI)
	VZEROUPPER
	RET

// The E2M1 conversion of NVFP4 (e2m1RNE and nvfp4Code in nvfp4.go): the
// code of |a| counts the bounds of e2m1RNEBounds it reaches (a signed
// compare of the magnitude's bits with bound - 1: both are below 2^31),
// the sign bit adds 8, and a NaN is 0x7.
splat(e2m1b0, $0x3e8000003e800000)

splat(e2m1b1, $0x3f3fffff3f3fffff)

splat(e2m1b2, $0x3fa000003fa00000)

splat(e2m1b3, $0x3fdfffff3fdfffff)

splat(e2m1b4, $0x4020000040200000)

splat(e2m1b5, $0x405fffff405fffff)

splat(e2m1b6, $0x40a0000040a00000)

splat(six32, $0x40c0000040c00000)

splat(inf32, $0x7f8000007f800000)

// nvfp4Code8 turns the 8 products in R into their codes (int32) in place,
// and ORs the lanes past ±6 (not NaN) into Y12. Y13 abs mask, Y14 sign
// mask; Y8-Y11 clobbered.
#define nvfp4Code8(R) \
	VANDPS   Y13, R, Y8 \
	VPXOR    Y9, Y9, Y9 \
	VPCMPGTD e2m1b0<>(SB), Y8, Y10 \
	VPSUBD   Y10, Y9, Y9 \
	VPCMPGTD e2m1b1<>(SB), Y8, Y10 \
	VPSUBD   Y10, Y9, Y9 \
	VPCMPGTD e2m1b2<>(SB), Y8, Y10 \
	VPSUBD   Y10, Y9, Y9 \
	VPCMPGTD e2m1b3<>(SB), Y8, Y10 \
	VPSUBD   Y10, Y9, Y9 \
	VPCMPGTD e2m1b4<>(SB), Y8, Y10 \
	VPSUBD   Y10, Y9, Y9 \
	VPCMPGTD e2m1b5<>(SB), Y8, Y10 \
	VPSUBD   Y10, Y9, Y9 \
	VPCMPGTD e2m1b6<>(SB), Y8, Y10 \
	VPSUBD   Y10, Y9, Y9 \
	VPCMPGTD six32<>(SB), Y8, Y10 \
	VMOVDQU  inf32<>(SB), Y11 \
	VPCMPGTD Y11, Y8, Y11 \
	VPANDN   Y10, Y11, Y10 \
	VPOR     Y10, Y12, Y12 \
	VPANDN   R, Y11, R \
	VPAND    Y14, R, R \
	VPSRLD   $28, R, R \
	VPOR     Y9, R, R

// func nvfp4CodesAVX2(dst *[8]byte, x *[16]float32, os float32) (past6 uint32)
// writes E2M1(x_i * os) two a byte, element 2i low, and returns a bit per
// product past ±6.
TEXT ·nvfp4CodesAVX2(SB), NOSPLIT, $0-28
	MOVQ         dst+0(FP), DI
	MOVQ         x+8(FP), SI
	VBROADCASTSS os+16(FP), Y0
	VMULPS       0(SI), Y0, Y1
	VMULPS       32(SI), Y0, Y0
	VMOVDQU      absmask<>(SB), Y13
	VMOVDQU      signmask<>(SB), Y14
	VPXOR        Y12, Y12, Y12
	nvfp4Code8(Y1)
	VMOVMSKPS    Y12, AX
	VPXOR        Y12, Y12, Y12
	nvfp4Code8(Y0)
	VMOVMSKPS    Y12, BX
	SHLL         $8, BX
	ORL          BX, AX
	MOVL         AX, past6+24(FP)
	VPSRLQ       $28, Y1, Y2 // the odd code of each pair 4 bits up into the even one's dword
	VPOR         Y2, Y1, Y1
	VPSRLQ       $28, Y0, Y2
	VPOR         Y2, Y0, Y0
	VMOVDQU      nvfp4pick<>(SB), Y3
	VPSHUFB      Y3, Y1, Y1 // each lane's two bytes into its low word
	VPSHUFB      Y3, Y0, Y0
	VEXTRACTI128 $1, Y1, X2
	VPUNPCKLWD   X2, X1, X1
	VEXTRACTI128 $1, Y0, X2
	VPUNPCKLWD   X2, X0, X0
	VPUNPCKLDQ   X0, X1, X1
	VMOVQ        X1, (DI)
	VZEROUPPER
	RET

// Bytes 0 and 8 of each 128-bit lane into its bytes 0 and 1.
DATA nvfp4pick<>+0(SB)/8, $0x8080808080800800
DATA nvfp4pick<>+8(SB)/8, $0x8080808080808080
DATA nvfp4pick<>+16(SB)/8, $0x8080808080800800
DATA nvfp4pick<>+24(SB)/8, $0x8080808080808080
GLOBL nvfp4pick<>(SB), RODATA|NOPTR, $32

// The E2M1 magnitudes of codes 0-7.
DATA e2m1mag<>+0(SB)/4, $0x00000000
DATA e2m1mag<>+4(SB)/4, $0x3f000000
DATA e2m1mag<>+8(SB)/4, $0x3f800000
DATA e2m1mag<>+12(SB)/4, $0x3fc00000
DATA e2m1mag<>+16(SB)/4, $0x40000000
DATA e2m1mag<>+20(SB)/4, $0x40400000
DATA e2m1mag<>+24(SB)/4, $0x40800000
DATA e2m1mag<>+28(SB)/4, $0x40c00000
GLOBL e2m1mag<>(SB), RODATA|NOPTR, $32

// nvfp4Value is ±E2M1(code) · sf · k for the 8 codes (int32) in R.
// Y5 magnitudes, Y14 sign mask, Y6 sf, Y7 k; Y8 clobbered.
#define nvfp4Value(R) \
	VPERMPS Y5, R, Y8 \
	VPSLLD  $28, R, R \
	VPAND   Y14, R, R \
	VXORPS  R, Y8, R \
	VMULPS  Y6, R, R \
	VMULPS  Y7, R, R

// func nvfp4DecAVX2(dst *[16]float32, src *[8]byte, sf, k float32)
TEXT ·nvfp4DecAVX2(SB), NOSPLIT, $0-24
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	VBROADCASTSS sf+16(FP), Y6
	VBROADCASTSS k+20(FP), Y7
	VMOVDQU      e2m1mag<>(SB), Y5
	VMOVDQU      signmask<>(SB), Y14
	VMOVQ        (SI), X4
	VMOVDQU      nibble<>(SB), X3
	VPAND        X3, X4, X0
	VPSRLW       $4, X4, X1
	VPAND        X3, X1, X1
	VPUNPCKLBW   X1, X0, X2 // the 16 codes in order
	VPMOVZXBD    X2, Y0
	VPSRLDQ      $8, X2, X2
	VPMOVZXBD    X2, Y1
	nvfp4Value(Y0)
	nvfp4Value(Y1)
	VMOVUPS      Y0, 0(DI)
	VMOVUPS      Y1, 32(DI)
	VZEROUPPER
	RET

// SGLang's E2M1 bounds (kvfp4Bounds, a value on a bound rounds up), less 1.
splat(kvfp4b0, $0x3e7fffff3e7fffff)

splat(kvfp4b1, $0x3f3fffff3f3fffff)

splat(kvfp4b2, $0x3f9fffff3f9fffff)

splat(kvfp4b3, $0x3fdfffff3fdfffff)

splat(kvfp4b4, $0x401fffff401fffff)

splat(kvfp4b5, $0x405fffff405fffff)

splat(kvfp4b6, $0x409fffff409fffff)

// kvfp4Code8 is kvfp4Code of the 8 quotients in R, in place: the bounds
// reached, plus 8 for a sign bit on a nonzero magnitude. Y13 abs mask,
// Y14 sign mask, Y12 zero; Y8-Y10 clobbered.
#define kvfp4Code8(R) \
	VANDPS   Y13, R, Y8 \
	VPXOR    Y9, Y9, Y9 \
	VPCMPGTD kvfp4b0<>(SB), Y8, Y10 \
	VPSUBD   Y10, Y9, Y9 \
	VPCMPGTD kvfp4b1<>(SB), Y8, Y10 \
	VPSUBD   Y10, Y9, Y9 \
	VPCMPGTD kvfp4b2<>(SB), Y8, Y10 \
	VPSUBD   Y10, Y9, Y9 \
	VPCMPGTD kvfp4b3<>(SB), Y8, Y10 \
	VPSUBD   Y10, Y9, Y9 \
	VPCMPGTD kvfp4b4<>(SB), Y8, Y10 \
	VPSUBD   Y10, Y9, Y9 \
	VPCMPGTD kvfp4b5<>(SB), Y8, Y10 \
	VPSUBD   Y10, Y9, Y9 \
	VPCMPGTD kvfp4b6<>(SB), Y8, Y10 \
	VPSUBD   Y10, Y9, Y9 \
	VPCMPEQD Y12, Y8, Y10 \
	VPANDN   R, Y10, R \
	VPAND    Y14, R, R \
	VPSRLD   $28, R, R \
	VPOR     Y9, R, R

// func kvfp4CodesAVX2(dst *[8]byte, x *[16]float32, inv float32)
// writes kvfp4Code(x_i, inv) two a byte, element 2i low.
TEXT ·kvfp4CodesAVX2(SB), NOSPLIT, $0-20
	MOVQ         dst+0(FP), DI
	MOVQ         x+8(FP), SI
	VBROADCASTSS inv+16(FP), Y0
	VMULPS       0(SI), Y0, Y1
	VMULPS       32(SI), Y0, Y0
	VMOVDQU      absmask<>(SB), Y13
	VMOVDQU      signmask<>(SB), Y14
	VPXOR        Y12, Y12, Y12
	kvfp4Code8(Y1)
	kvfp4Code8(Y0)
	VPSRLQ       $28, Y1, Y2
	VPOR         Y2, Y1, Y1
	VPSRLQ       $28, Y0, Y2
	VPOR         Y2, Y0, Y0
	VMOVDQU      nvfp4pick<>(SB), Y3
	VPSHUFB      Y3, Y1, Y1
	VPSHUFB      Y3, Y0, Y0
	VEXTRACTI128 $1, Y1, X2
	VPUNPCKLWD   X2, X1, X1
	VEXTRACTI128 $1, Y0, X2
	VPUNPCKLWD   X2, X0, X0
	VPUNPCKLDQ   X0, X1, X1
	VMOVQ        X1, (DI)
	VZEROUPPER
	RET

// FP8 encode (fp8Format.encode, vllm.go), 8 lanes: both rounding paths of
// rounded and a select, the clamp to the largest finite code, the sign,
// and the NaN code for a NaN. The format's constants (fp8Kernel, made
// from its rounded constants by newFP8Format) are at R8, the shift in X9.
splat(one32, $0x0000000100000001)

splat(two23, $0x4b0000004b000000)

splat(mant23, $0x007fffff007fffff)

splat(b80, $0x0000008000000080)

// fp8Code8 is the FP8 code (int32) of OFF(SI) · Y11 into R. Y12 abs mask,
// Y13 the NaN code; Y4, Y6-Y8 clobbered.
#define fp8Code8(OFF, R) \
	VMULPS    OFF(SI), Y11, R \
	VPAND     Y12, R, Y4 \
	VPSRLD    X9, Y4, Y6 \
	VPAND     one32<>(SB), Y6, Y6 \
	VPADDD    0(R8), Y6, Y6 \
	VPADDD    Y4, Y6, Y6 \
	VPSRLD    X9, Y6, Y6 \
	VPSUBD    32(R8), Y6, Y6 \
	VMULPS    64(R8), Y4, Y7 \
	VADDPS    two23<>(SB), Y7, Y7 \
	VPAND     mant23<>(SB), Y7, Y7 \
	VPCMPGTD  96(R8), Y4, Y8 \
	VPBLENDVB Y8, Y6, Y7, Y6 \
	VPMINUD   128(R8), Y6, Y6 \
	VPSRLD    $24, R, Y7 \
	VPAND     b80<>(SB), Y7, Y7 \
	VPOR      Y7, Y6, Y6 \
	VPCMPGTD  inf32<>(SB), Y4, Y8 \
	VPBLENDVB Y8, Y13, Y6, R

// func fp8EncodeAVX2(codes []uint8, x []float32, mul float32, k *fp8Kernel)
// writes f.encode(x_i · mul) for the format whose constants k holds, len(x)
// a multiple of 32.
TEXT ·fp8EncodeAVX2(SB), NOSPLIT, $0-64
	MOVQ         codes_base+0(FP), DI
	MOVQ         x_base+24(FP), SI
	MOVQ         x_len+32(FP), CX
	SHRQ         $5, CX
	JZ           fp8_done
	MOVQ         k+56(FP), R8
	VBROADCASTSS mul+48(FP), Y11
	VMOVDQU      absmask<>(SB), Y12
	VMOVDQU      160(R8), Y13
	VMOVQ        192(R8), X9
	VMOVDQU      packorder<>(SB), Y5

fp8_loop:
	fp8Code8(0, Y0)
	fp8Code8(32, Y1)
	fp8Code8(64, Y2)
	fp8Code8(96, Y3)
	packCodes32(VPACKUSWB)
	ADDQ $128, SI
	ADDQ $32, DI
	DECQ CX
	JNZ  fp8_loop

fp8_done:
	VZEROUPPER
	RET

// func divAVX2(x []float32, d float32)
// divides each element of x by d in place (IEEE: VDIVPS), len(x) a
// multiple of 8.
TEXT ·divAVX2(SB), NOSPLIT, $0-28
	MOVQ         x_base+0(FP), SI
	MOVQ         x_len+8(FP), CX
	SHRQ         $3, CX
	JZ           div_done
	VBROADCASTSS d+24(FP), Y1

div_loop:
	VMOVUPS (SI), Y0
	VDIVPS  Y1, Y0, Y0
	VMOVUPS Y0, (SI)
	ADDQ    $32, SI
	DECQ    CX
	JNZ     div_loop

div_done:
	VZEROUPPER
	RET

// func tqCodesAVX2(codes []int8, y []float32, mid []float32)
// writes the count of mid's values <= y_i (1 to 255 of them; a NaN counts
// none: the ordered compare is false), len(y) a multiple of 32.
TEXT ·tqCodesAVX2(SB), NOSPLIT, $0-72
	MOVQ    codes_base+0(FP), DI
	MOVQ    y_base+24(FP), SI
	MOVQ    y_len+32(FP), CX
	MOVQ    mid_base+48(FP), R8
	MOVQ    mid_len+56(FP), BX
	SHRQ    $5, CX
	JZ      tqcodes_done
	VMOVDQU packorder<>(SB), Y5

tqcodes_loop:
	VMOVUPS 0(SI), Y10
	VMOVUPS 32(SI), Y11
	VMOVUPS 64(SI), Y12
	VMOVUPS 96(SI), Y13
	VPXOR   Y0, Y0, Y0
	VPXOR   Y1, Y1, Y1
	VPXOR   Y2, Y2, Y2
	VPXOR   Y3, Y3, Y3
	MOVQ    R8, R9
	MOVQ    BX, DX

tqcodes_mid:
	VBROADCASTSS (R9), Y9
	VCMPPS       $0x1d, Y9, Y10, Y8 // y >= mid
	VPSUBD       Y8, Y0, Y0
	VCMPPS       $0x1d, Y9, Y11, Y8
	VPSUBD       Y8, Y1, Y1
	VCMPPS       $0x1d, Y9, Y12, Y8
	VPSUBD       Y8, Y2, Y2
	VCMPPS       $0x1d, Y9, Y13, Y8
	VPSUBD       Y8, Y3, Y3
	ADDQ         $4, R9
	DECQ         DX
	JNZ          tqcodes_mid
	packCodes32(VPACKUSWB)
	ADDQ $128, SI
	ADDQ $32, DI
	DECQ CX
	JNZ  tqcodes_loop

tqcodes_done:
	VZEROUPPER
	RET

splat(half32, $0x3f0000003f000000)

splat(fifteen32, $0x4170000041700000)

// int4Code8 is vllmNibble(float32(float64(y)·inv + zp)) for the 8 values
// at OFF(SI), into R (int32): the float64 product of two float32s is
// exact, the sum rounds once, the conversion to float32 once more, as the
// Go code's. Y10 inv, Y11 zp (float64 each), Y12 zero, Y13 0.5, Y14 15;
// Y8, Y9 clobbered.
#define int4Code8(OFF, R) \
	VCVTPS2PD     OFF(SI), Y8 \
	VCVTPS2PD     OFF+16(SI), Y9 \
	VMULPD        Y10, Y8, Y8 \
	VMULPD        Y10, Y9, Y9 \
	VADDPD        Y11, Y8, Y8 \
	VADDPD        Y11, Y9, Y9 \
	VCVTPD2PSY    Y8, X8 \
	VCVTPD2PSY    Y9, X9 \
	VINSERTF128   $1, X9, Y8, Y8 \
	VCMPPS        $0x1d, Y12, Y8, Y9 \
	VADDPS        Y13, Y8, R \
	VMINPS        Y14, R, R \
	VCVTTPS2DQ    R, R \
	VPAND         Y9, R, R

// func int4CodesAVX2(codes []byte, y []float32, inv, zp float32)
// writes vllmNibble(float32(float64(y_i)·inv + zp)) two a byte, element
// 2i low; len(y) a multiple of 8.
TEXT ·int4CodesAVX2(SB), NOSPLIT, $0-56
	MOVQ         codes_base+0(FP), DI
	MOVQ         y_base+24(FP), SI
	MOVQ         y_len+32(FP), CX
	SHRQ         $3, CX
	JZ           int4codes_done
	VBROADCASTSS inv+48(FP), X10
	VCVTPS2PD    X10, Y10
	VBROADCASTSS zp+52(FP), X11
	VCVTPS2PD    X11, Y11
	VXORPS       Y12, Y12, Y12
	VMOVUPS      half32<>(SB), Y13
	VMOVUPS      fifteen32<>(SB), Y14
	VMOVDQU      nvfp4pick<>(SB), Y15

int4codes_loop:
	int4Code8(0, Y0)
	VPSRLQ       $28, Y0, Y1 // the odd code of each pair 4 bits up into the even one's dword
	VPOR         Y1, Y0, Y0
	VPSHUFB      Y15, Y0, Y0
	VEXTRACTI128 $1, Y0, X1
	VPUNPCKLWD   X1, X0, X0
	VMOVD        X0, (DI)
	ADDQ         $32, SI
	ADDQ         $4, DI
	DECQ         CX
	JNZ          int4codes_loop

int4codes_done:
	VZEROUPPER
	RET

// func xorBitsAVX2(x []float32, m []uint32)
// XORs m into the bits of x (len(x) a multiple of 8, len(m) >= len(x)).
TEXT ·xorBitsAVX2(SB), NOSPLIT, $0-48
	MOVQ x_base+0(FP), SI
	MOVQ x_len+8(FP), CX
	MOVQ m_base+24(FP), DX
	SHRQ $3, CX
	JZ   xorbits_done

xorbits_loop:
	VMOVUPS (SI), Y0
	VXORPS  (DX), Y0, Y0
	VMOVUPS Y0, (SI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	DECQ    CX
	JNZ     xorbits_loop

xorbits_done:
	VZEROUPPER
	RET

// func scaleXorBitsAVX2(x []float32, m []uint32, c float32)
// sets x_i to the bits of x_i·c XOR m_i (len(x) a multiple of 8).
TEXT ·scaleXorBitsAVX2(SB), NOSPLIT, $0-52
	MOVQ         x_base+0(FP), SI
	MOVQ         x_len+8(FP), CX
	MOVQ         m_base+24(FP), DX
	VBROADCASTSS c+48(FP), Y1
	SHRQ         $3, CX
	JZ           scalexor_done

scalexor_loop:
	VMULPS  (SI), Y1, Y0
	VXORPS  (DX), Y0, Y0
	VMOVUPS Y0, (SI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	DECQ    CX
	JNZ     scalexor_loop

scalexor_done:
	VZEROUPPER
	RET

splat(neginf32, $0xff800000ff800000)

// func minMaxNumAVX2(x []float32) (lo, hi float32)
// is the least and the largest of x's non-NaN values (+Inf and -Inf for
// none; of two zeros either may be kept), len(x) a multiple of 8. VMINPS
// and VMAXPS return the second source when the first is a NaN.
TEXT ·minMaxNumAVX2(SB), NOSPLIT, $0-32
	MOVQ    x_base+0(FP), SI
	MOVQ    x_len+8(FP), CX
	VMOVUPS inf32<>(SB), Y0
	VMOVUPS neginf32<>(SB), Y1
	SHRQ    $3, CX
	JZ      minmaxnum_fold

minmaxnum_loop:
	VMOVUPS (SI), Y2
	VMINPS  Y0, Y2, Y0
	VMAXPS  Y1, Y2, Y1
	ADDQ    $32, SI
	DECQ    CX
	JNZ     minmaxnum_loop

minmaxnum_fold:
	VEXTRACTF128 $1, Y0, X2
	VMINPS       X2, X0, X0
	VPERMILPS    $0x4e, X0, X2
	VMINPS       X2, X0, X0
	VPERMILPS    $0xb1, X0, X2
	VMINPS       X2, X0, X0
	VEXTRACTF128 $1, Y1, X2
	VMAXPS       X2, X1, X1
	VPERMILPS    $0x4e, X1, X2
	VMAXPS       X2, X1, X1
	VPERMILPS    $0xb1, X1, X2
	VMAXPS       X2, X1, X1
	VMOVSS       X0, lo+24(FP)
	VMOVSS       X1, hi+28(FP)
	VZEROUPPER
	RET

// nvfp4Err8 is one candidate's half block in fourSixError: the 8 products
// x_i · os in P become their codes (nvfp4Code8, past-6 lanes ORed into Y12),
// then D = fma(q_i, dq, -x_i) for the codes' signed E2M1 values q_i (the
// fused multiply-add rounds once, as fma32 does). X is the 8 values'
// address, Y7 the broadcast dq, Y15 the E2M1 magnitudes; Y8-Y11 clobbered.
#define nvfp4Err8(P, X, D) \
	nvfp4Code8(P) \
	VPERMPS     Y15, P, Y8 \
	VPSLLD      $28, P, Y9 \
	VPAND       Y14, Y9, Y9 \
	VXORPS      Y9, Y8, Y8 \
	VXORPS      X, Y14, D \
	VFMADD231PS Y7, Y8, D

// nvfp4PairErr turns a candidate's D of elements 0-7 (LO) and 8-15 (HI)
// into its 8 pair errors fma(dx, dx, dy·dy) in E, pairs in lane order
// 0, 1, 4, 5 | 2, 3, 6, 7; Y8 clobbered.
#define nvfp4PairErr(LO, HI, E) \
	VSHUFPS     $0x88, HI, LO, Y8 \
	VSHUFPS     $0xdd, HI, LO, E \
	VMULPS      E, E, E \
	VFMADD231PS Y8, Y8, E

// func nvfp4FourSixAVX2(dst *[8]byte, x *[16]float32, os4, dq4, os6, dq6 float32) (e4, e6 float32, past6 uint32, four bool)
// is nvfp4_4over6's choice for a finite block: both candidates' errors
// (fourSixError, each pair's error rounded as there and summed in pair
// order), four = e4 < e6, and the chosen candidate's codes (two a byte,
// as nvfp4CodesAVX2 writes them) and past-6 bits. Needs FMA.
TEXT ·nvfp4FourSixAVX2(SB), NOSPLIT, $0-45
	MOVQ    dst+0(FP), DI
	MOVQ    x+8(FP), SI
	VMOVDQU absmask<>(SB), Y13
	VMOVDQU signmask<>(SB), Y14
	VMOVUPS e2m1mag<>(SB), Y15

	// the /4 candidate: codes in Y1 (elements 0-7) and Y0 (8-15), errors in Y6
	VBROADCASTSS os4+16(FP), Y0
	VBROADCASTSS dq4+20(FP), Y7
	VMULPS       0(SI), Y0, Y1
	VMULPS       32(SI), Y0, Y0
	VPXOR        Y12, Y12, Y12
	nvfp4Err8(Y1, 0(SI), Y4)
	VMOVMSKPS    Y12, AX
	VPXOR        Y12, Y12, Y12
	nvfp4Err8(Y0, 32(SI), Y5)
	VMOVMSKPS    Y12, BX
	SHLL         $8, BX
	ORL          BX, AX
	nvfp4PairErr(Y4, Y5, Y6)

	// the /6 candidate: codes in Y3 and Y2, errors in Y5
	VBROADCASTSS os6+24(FP), Y2
	VBROADCASTSS dq6+28(FP), Y7
	VMULPS       0(SI), Y2, Y3
	VMULPS       32(SI), Y2, Y2
	VPXOR        Y12, Y12, Y12
	nvfp4Err8(Y3, 0(SI), Y4)
	VMOVMSKPS    Y12, CX
	VPXOR        Y12, Y12, Y12
	nvfp4Err8(Y2, 32(SI), Y10)
	VMOVMSKPS    Y12, BX
	SHLL         $8, BX
	ORL          BX, CX
	nvfp4PairErr(Y4, Y10, Y5)

	// the sums, pair 0 first, both candidates at once (lane 0 /4, lane 1 /6)
	VUNPCKLPS    Y5, Y6, Y10 // pairs 0, 1 | 2, 3
	VUNPCKHPS    Y5, Y6, Y11 // pairs 4, 5 | 6, 7
	VMOVHLPS     X10, X10, X8
	VADDPS       X8, X10, X4
	VEXTRACTF128 $1, Y10, X9
	VADDPS       X9, X4, X4
	VMOVHLPS     X9, X9, X9
	VADDPS       X9, X4, X4
	VADDPS       X11, X4, X4
	VMOVHLPS     X11, X11, X8
	VADDPS       X8, X4, X4
	VEXTRACTF128 $1, Y11, X9
	VADDPS       X9, X4, X4
	VMOVHLPS     X9, X9, X9
	VADDPS       X9, X4, X4
	VMOVSS       X4, e4+32(FP)
	VMOVSHDUP    X4, X8
	VMOVSS       X8, e6+36(FP)

	// four = e4 < e6: pick its codes and past-6 bits
	VCMPSS       $0x01, X8, X4, X9
	VBROADCASTSS X9, Y9
	VBLENDVPS    Y9, Y1, Y3, Y1
	VBLENDVPS    Y9, Y0, Y2, Y0
	VMOVD        X9, DX
	TESTL        DX, DX
	CMOVLNE      AX, CX
	SETNE        four+44(FP)
	MOVL         CX, past6+40(FP)
	VPSRLQ       $28, Y1, Y2 // packed as nvfp4CodesAVX2 packs them
	VPOR         Y2, Y1, Y1
	VPSRLQ       $28, Y0, Y2
	VPOR         Y2, Y0, Y0
	VMOVDQU      nvfp4pick<>(SB), Y3
	VPSHUFB      Y3, Y1, Y1
	VPSHUFB      Y3, Y0, Y0
	VEXTRACTI128 $1, Y1, X2
	VPUNPCKLWD   X2, X1, X1
	VEXTRACTI128 $1, Y0, X2
	VPUNPCKLWD   X2, X0, X0
	VPUNPCKLDQ   X0, X1, X1
	VMOVQ        X1, (DI)
	VZEROUPPER
	RET

// iq4_nl's codebook (kvaluesIQ4NL) as bytes, its float32 values by code
// (0-7, 8-15) and its 15 midpoints (iq4nlMids).
DATA iq4nlk<>+0(SB)/8, $0xf6eaddcfbfad9881
DATA iq4nlk<>+8(SB)/8, $0x7159453526190d01
GLOBL iq4nlk<>(SB), RODATA|NOPTR, $16

DATA iq4nlv<>+0(SB)/4, $0xc2fe0000
DATA iq4nlv<>+4(SB)/4, $0xc2d00000
DATA iq4nlv<>+8(SB)/4, $0xc2a60000
DATA iq4nlv<>+12(SB)/4, $0xc2820000
DATA iq4nlv<>+16(SB)/4, $0xc2440000
DATA iq4nlv<>+20(SB)/4, $0xc20c0000
DATA iq4nlv<>+24(SB)/4, $0xc1b00000
DATA iq4nlv<>+28(SB)/4, $0xc1200000
DATA iq4nlv<>+32(SB)/4, $0x3f800000
DATA iq4nlv<>+36(SB)/4, $0x41500000
DATA iq4nlv<>+40(SB)/4, $0x41c80000
DATA iq4nlv<>+44(SB)/4, $0x42180000
DATA iq4nlv<>+48(SB)/4, $0x42540000
DATA iq4nlv<>+52(SB)/4, $0x428a0000
DATA iq4nlv<>+56(SB)/4, $0x42b20000
DATA iq4nlv<>+60(SB)/4, $0x42e20000
GLOBL iq4nlv<>(SB), RODATA|NOPTR, $64

DATA iq4nlmid<>+0(SB)/4, $0xc2e70000
DATA iq4nlmid<>+4(SB)/4, $0xc2bb0000
DATA iq4nlmid<>+8(SB)/4, $0xc2940000
DATA iq4nlmid<>+12(SB)/4, $0xc2640000
DATA iq4nlmid<>+16(SB)/4, $0xc2280000
DATA iq4nlmid<>+20(SB)/4, $0xc1e40000
DATA iq4nlmid<>+24(SB)/4, $0xc1800000
DATA iq4nlmid<>+28(SB)/4, $0xc0900000
DATA iq4nlmid<>+32(SB)/4, $0x40e00000
DATA iq4nlmid<>+36(SB)/4, $0x41980000
DATA iq4nlmid<>+40(SB)/4, $0x41fc0000
DATA iq4nlmid<>+44(SB)/4, $0x42360000
DATA iq4nlmid<>+48(SB)/4, $0x42740000
DATA iq4nlmid<>+52(SB)/4, $0x429e0000
DATA iq4nlmid<>+56(SB)/4, $0x42ca0000
GLOBL iq4nlmid<>(SB), RODATA|NOPTR, $60

// iq4nlMid counts midpoint OFF reached (y >= mid) by the 32 values in
// Y10-Y13 into Y0-Y3; Y8, Y9 clobbered.
#define iq4nlMid(OFF) \
	VBROADCASTSS iq4nlmid<>+OFF(SB), Y9 \
	VCMPPS       $0x1d, Y9, Y10, Y8 \
	VPSUBD       Y8, Y0, Y0 \
	VCMPPS       $0x1d, Y9, Y11, Y8 \
	VPSUBD       Y8, Y1, Y1 \
	VCMPPS       $0x1d, Y9, Y12, Y8 \
	VPSUBD       Y8, Y2, Y2 \
	VCMPPS       $0x1d, Y9, Y13, Y8 \
	VPSUBD       Y8, Y3, Y3

// iq4nlSums8 adds the 8 elements at OFF(SI), codes in C, to the sums in
// X4 (lane 0 sumqx, lane 1 sumq2), one element after the other: q the
// code's value, w = x·x, wq = w·q, then sumqx += wq·x and sumq2 += wq·q,
// each product rounded (no fused multiply-add). Y14, Y15 the values of
// codes 0-7 and 8-15; Y5-Y12 clobbered.
#define iq4nlSums8(OFF, C) \
	VPERMPS      Y14, C, Y5 \
	VPERMPS      Y15, C, Y6 \
	VPSLLD       $28, C, Y7 \
	VBLENDVPS    Y7, Y6, Y5, Y5 \
	VMOVUPS      OFF(SI), Y6 \
	VMULPS       Y6, Y6, Y7 \
	VMULPS       Y5, Y7, Y7 \
	VMULPS       Y6, Y7, Y8 \
	VMULPS       Y5, Y7, Y9 \
	VUNPCKLPS    Y9, Y8, Y10 \
	VUNPCKHPS    Y9, Y8, Y11 \
	VADDPS       X10, X4, X4 \
	VMOVHLPS     X10, X10, X12 \
	VADDPS       X12, X4, X4 \
	VADDPS       X11, X4, X4 \
	VMOVHLPS     X11, X11, X12 \
	VADDPS       X12, X4, X4 \
	VEXTRACTF128 $1, Y10, X10 \
	VADDPS       X10, X4, X4 \
	VMOVHLPS     X10, X10, X12 \
	VADDPS       X12, X4, X4 \
	VEXTRACTF128 $1, Y11, X11 \
	VADDPS       X11, X4, X4 \
	VMOVHLPS     X11, X11, X12 \
	VADDPS       X12, X4, X4

// func iq4nlQuantAVX2(dst *[16]byte, x *[32]float32, id float32) (sumqx, sumq2 float32)
// is llamaQuantizeIQ4NL's block of finite values: each code the count of
// midpoints <= x_i·id, written two a byte (element j low, j+16 high), and
// the weighted sums in element order.
TEXT ·iq4nlQuantAVX2(SB), NOSPLIT, $0-32
	MOVQ         dst+0(FP), DI
	MOVQ         x+8(FP), SI
	VBROADCASTSS id+16(FP), Y9
	VMULPS       0(SI), Y9, Y10
	VMULPS       32(SI), Y9, Y11
	VMULPS       64(SI), Y9, Y12
	VMULPS       96(SI), Y9, Y13
	VPXOR        Y0, Y0, Y0
	VPXOR        Y1, Y1, Y1
	VPXOR        Y2, Y2, Y2
	VPXOR        Y3, Y3, Y3
	iq4nlMid(0)
	iq4nlMid(4)
	iq4nlMid(8)
	iq4nlMid(12)
	iq4nlMid(16)
	iq4nlMid(20)
	iq4nlMid(24)
	iq4nlMid(28)
	iq4nlMid(32)
	iq4nlMid(36)
	iq4nlMid(40)
	iq4nlMid(44)
	iq4nlMid(48)
	iq4nlMid(52)
	iq4nlMid(56)
	VMOVUPS      iq4nlv<>+0(SB), Y14
	VMOVUPS      iq4nlv<>+32(SB), Y15
	VXORPS       X4, X4, X4
	iq4nlSums8(0, Y0)
	iq4nlSums8(32, Y1)
	iq4nlSums8(64, Y2)
	iq4nlSums8(96, Y3)
	VMOVSS       X4, sumqx+24(FP)
	VMOVSHDUP    X4, X5
	VMOVSS       X5, sumq2+28(FP)
	VPSLLD       $4, Y2, Y2 // element j+16 in the high nibble
	VPOR         Y2, Y0, Y0
	VPSLLD       $4, Y3, Y3
	VPOR         Y3, Y1, Y1
	VEXTRACTI128 $1, Y0, X5
	VPACKUSDW    X5, X0, X0
	VEXTRACTI128 $1, Y1, X5
	VPACKUSDW    X5, X1, X1
	VPACKUSWB    X1, X0, X0
	VMOVDQU      X0, (DI)
	VZEROUPPER
	RET

// func iq4nlDecAVX2(dst *[32]float32, src *[16]byte, d float32)
// is llamaDequantizeIQ4NL's block: d · kvalues_iq4nl[code].
TEXT ·iq4nlDecAVX2(SB), NOSPLIT, $0-20
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	VBROADCASTSS d+16(FP), Y4
	VMOVDQU      (SI), X0
	VMOVDQU      iq4nlk<>(SB), X2
	VMOVDQU      nibble<>(SB), X3
	VPSRLW       $4, X0, X1
	VPAND        X3, X0, X0
	VPAND        X3, X1, X1
	VPSHUFB      X0, X2, X0 // the codes' values, elements 0-15
	VPSHUFB      X1, X2, X1 // elements 16-31
	VPMOVSXBD    X0, Y5
	VPSRLDQ      $8, X0, X0
	VPMOVSXBD    X0, Y6
	VPMOVSXBD    X1, Y7
	VPSRLDQ      $8, X1, X1
	VPMOVSXBD    X1, Y8
	VCVTDQ2PS    Y5, Y5
	VCVTDQ2PS    Y6, Y6
	VCVTDQ2PS    Y7, Y7
	VCVTDQ2PS    Y8, Y8
	VMULPS       Y5, Y4, Y5
	VMULPS       Y6, Y4, Y6
	VMULPS       Y7, Y4, Y7
	VMULPS       Y8, Y4, Y8
	VMOVUPS      Y5, 0(DI)
	VMOVUPS      Y6, 32(DI)
	VMOVUPS      Y7, 64(DI)
	VMOVUPS      Y8, 96(DI)
	VZEROUPPER
	RET

// iq4nlValue stores the values of the 8 codes in C at QOFF(SP); Y5-Y7
// clobbered.
#define iq4nlValue(C, QOFF) \
	VPERMPS   Y14, C, Y5 \
	VPERMPS   Y15, C, Y6 \
	VPSLLD    $28, C, Y7 \
	VBLENDVPS Y7, Y6, Y5, Y5 \
	VMOVUPS   Y5, QOFF(SP)

// iq4nlCodes writes the codes of the block at XOFF(SI) (each the count of
// midpoints <= x_i·id, id broadcast in Y9) two a byte at DOFF(DI), and the
// codes' values at QOFF(SP); Y0-Y3, Y5-Y13 clobbered, Y14 and Y15 the values.
#define iq4nlCodes(XOFF, QOFF, DOFF) \
	VMULPS       XOFF+0(SI), Y9, Y10 \
	VMULPS       XOFF+32(SI), Y9, Y11 \
	VMULPS       XOFF+64(SI), Y9, Y12 \
	VMULPS       XOFF+96(SI), Y9, Y13 \
	VPXOR        Y0, Y0, Y0 \
	VPXOR        Y1, Y1, Y1 \
	VPXOR        Y2, Y2, Y2 \
	VPXOR        Y3, Y3, Y3 \
	iq4nlMid(0) \
	iq4nlMid(4) \
	iq4nlMid(8) \
	iq4nlMid(12) \
	iq4nlMid(16) \
	iq4nlMid(20) \
	iq4nlMid(24) \
	iq4nlMid(28) \
	iq4nlMid(32) \
	iq4nlMid(36) \
	iq4nlMid(40) \
	iq4nlMid(44) \
	iq4nlMid(48) \
	iq4nlMid(52) \
	iq4nlMid(56) \
	iq4nlValue(Y0, QOFF+0) \
	iq4nlValue(Y1, QOFF+32) \
	iq4nlValue(Y2, QOFF+64) \
	iq4nlValue(Y3, QOFF+96) \
	VPSLLD       $4, Y2, Y2 \
	VPOR         Y2, Y0, Y0 \
	VPSLLD       $4, Y3, Y3 \
	VPOR         Y3, Y1, Y1 \
	VEXTRACTI128 $1, Y0, X5 \
	VPACKUSDW    X5, X0, X0 \
	VEXTRACTI128 $1, Y1, X5 \
	VPACKUSDW    X5, X1, X1 \
	VPACKUSWB    X1, X0, X0 \
	VMOVDQU      X0, DOFF(DI)

// iq4nlSums2 adds elements OFF/4 to OFF/4+7 of both blocks to X4 (lanes:
// A's sumqx, sumq2, B's sumqx, sumq2), element after element, with the
// products of iq4nlSums8; Y5-Y13 clobbered.
#define iq4nlSums2(OFF) \
	VMOVUPS      OFF(SI), Y6 \
	VMOVUPS      OFF(SP), Y5 \
	VMULPS       Y6, Y6, Y7 \
	VMULPS       Y5, Y7, Y7 \
	VMULPS       Y6, Y7, Y8 \
	VMULPS       Y5, Y7, Y9 \
	VMOVUPS      128+OFF(SI), Y6 \
	VMOVUPS      128+OFF(SP), Y5 \
	VMULPS       Y6, Y6, Y7 \
	VMULPS       Y5, Y7, Y7 \
	VMULPS       Y6, Y7, Y10 \
	VMULPS       Y5, Y7, Y11 \
	VUNPCKLPS    Y9, Y8, Y12 \
	VUNPCKHPS    Y9, Y8, Y13 \
	VUNPCKLPS    Y11, Y10, Y8 \
	VUNPCKHPS    Y11, Y10, Y9 \
	VUNPCKLPD    Y8, Y12, Y10 \
	VUNPCKHPD    Y8, Y12, Y11 \
	VUNPCKLPD    Y9, Y13, Y12 \
	VUNPCKHPD    Y9, Y13, Y13 \
	VADDPS       X10, X4, X4 \
	VADDPS       X11, X4, X4 \
	VADDPS       X12, X4, X4 \
	VADDPS       X13, X4, X4 \
	VEXTRACTF128 $1, Y10, X10 \
	VADDPS       X10, X4, X4 \
	VEXTRACTF128 $1, Y11, X11 \
	VADDPS       X11, X4, X4 \
	VEXTRACTF128 $1, Y12, X12 \
	VADDPS       X12, X4, X4 \
	VEXTRACTF128 $1, Y13, X13 \
	VADDPS       X13, X4, X4

// func iq4nlQuant2AVX2(dst *byte, x *[64]float32, ida, idb float32) (sums [4]float32)
// is iq4nlQuantAVX2 of two consecutive blocks (codes at dst and dst+18,
// the second block's at x[32:]), their sums in one register: sums is A's
// sumqx and sumq2, then B's.
TEXT ·iq4nlQuant2AVX2(SB), NOSPLIT, $256-40
	MOVQ    dst+0(FP), DI
	MOVQ    x+8(FP), SI
	VMOVUPS iq4nlv<>+0(SB), Y14
	VMOVUPS iq4nlv<>+32(SB), Y15
	VBROADCASTSS ida+16(FP), Y9
	iq4nlCodes(0, 0, 0)
	VBROADCASTSS idb+20(FP), Y9
	iq4nlCodes(128, 128, 18)
	VXORPS  X4, X4, X4
	iq4nlSums2(0)
	iq4nlSums2(32)
	iq4nlSums2(64)
	iq4nlSums2(96)
	VMOVUPS X4, sums+24(FP)
	VZEROUPPER
	RET

// int8HeadCode is vLLM's int8_per_token_head code of the 8 values at
// OFF(SI), into R: q = float32(x * inv), then q ± 0.5 by q's sign, clamped
// to [-128, 127] (Y15, Y14: VMINPS and VMAXPS return their second source,
// q, for a NaN, which stays one), a NaN made 0 (the low byte of the scalar
// conversion's 0x80000000), truncated.
#define int8HeadCode(OFF, R) \
	VMULPS     OFF(SI), Y9, R \
	VANDNPS    R, Y7, Y6 \
	VORPS      Y10, Y6, Y6 \
	VADDPS     Y6, R, R \
	VMINPS     R, Y14, R \
	VMAXPS     R, Y15, R \
	VCMPPS     $3, R, R, Y13 \
	VANDNPS    R, Y13, R \
	VCVTTPS2DQ R, R

// func int8HeadCodesAVX2(q []uint8, x []float32, inv float32)
//
// The codes of len(x) values (a multiple of 32), 32 a step.
TEXT ·int8HeadCodesAVX2(SB), NOSPLIT, $0-52
	MOVQ         q_base+0(FP), DI
	MOVQ         x_base+24(FP), SI
	MOVQ         x_len+32(FP), CX
	SHRQ         $5, CX
	VBROADCASTSS inv+48(FP), Y9
	VMOVDQU      absmask<>(SB), Y7
	VBROADCASTSS half<>(SB), Y10
	int8Bounds()
	VMOVDQU      packorder<>(SB), Y5

i8h_loop:
	TESTQ CX, CX
	JZ    i8h_done
	int8HeadCode(0, Y0)
	int8HeadCode(32, Y1)
	int8HeadCode(64, Y2)
	int8HeadCode(96, Y3)
	packCodes32(VPACKSSWB)
	ADDQ  $128, SI
	ADDQ  $32, DI
	DECQ  CX
	JMP   i8h_loop

i8h_done:
	VZEROUPPER
	RET
