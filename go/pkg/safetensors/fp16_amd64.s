// AVX2 + F16C versions of the F16 and BF16 conversions in fp16.go, 8 values
// a step. Each gives exactly the bits of its Go loop: F16C converts with
// IEEE round-to-nearest-even, as the Go code does, and the lanes where the
// hardware and the Go code differ (NaN: the Go code keeps a half's payload
// on the way in and writes the canonical quiet NaN on the way out) are
// replaced by the Go code's bits.

#include "textflag.h"

#define splat(NAME, V) \
	DATA NAME<>+0(SB)/8, V \
	DATA NAME<>+8(SB)/8, V \
	DATA NAME<>+16(SB)/8, V \
	DATA NAME<>+24(SB)/8, V \
	GLOBL NAME<>(SB), RODATA|NOPTR, $32

splat(h16exp, $0x00007c0000007c00)   // a half's exponent field
splat(h16body, $0x0fffe0000fffe000)  // (h & 0x7fff) << 13
splat(f32top, $0x7000000070000000)   // with h16body's exponent bits: 0x7f800000
splat(signbit, $0x8000000080000000)
splat(h16sign, $0x0000800000008000)
splat(h16qnan, $0x00007e0000007e00)
splat(bf16round, $0x00007fff00007fff)
splat(lowbit, $0x0000000100000001)
splat(absmask, $0x7fffffff7fffffff)
splat(f32inf, $0x7f8000007f800000)
splat(bf16quiet, $0x0000004000000040)

// func decodeF16AVX2(dst []float32, src []byte)
TEXT ·decodeF16AVX2(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ src_base+24(FP), SI
	SHRQ $3, CX
	JZ   f16dec_done
	VMOVDQU h16exp<>(SB), Y5
	VMOVDQU h16body<>(SB), Y6
	VMOVDQU f32top<>(SB), Y7
	VMOVDQU signbit<>(SB), Y8

f16dec_loop:
	VCVTPH2PS (SI), Y0          // exact for zeros, subnormals, normals and Inf
	VPMOVZXWD (SI), Y1          // the halves as dwords
	VPAND     Y5, Y1, Y2
	VPCMPEQD  Y5, Y2, Y2        // lanes with exponent 0x1f: Inf and NaN
	VPSLLD    $13, Y1, Y3
	VPAND     Y6, Y3, Y3
	VPOR      Y7, Y3, Y3        // 0x7f800000 | mant << 13
	VPSLLD    $16, Y1, Y4
	VPAND     Y8, Y4, Y4
	VPOR      Y4, Y3, Y3        // | sign << 16: the Go code's bits
	VBLENDVPS Y2, Y3, Y0, Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       f16dec_loop

f16dec_done:
	VZEROUPPER
	RET

// func encodeF16AVX2(dst []byte, src []float32)
TEXT ·encodeF16AVX2(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ src_base+24(FP), SI
	MOVQ src_len+32(FP), CX
	SHRQ $3, CX
	JZ   f16enc_done
	VMOVDQU h16sign<>(SB), Y5
	VMOVDQU h16qnan<>(SB), Y6

f16enc_loop:
	VMOVUPS     (SI), Y0
	VCVTPS2PH   $0, Y0, X1       // round to nearest even; overflow to Inf
	VCMPPS      $3, Y0, Y0, Y2   // NaN lanes (unordered with themselves)
	VPSRLD      $16, Y0, Y3
	VPAND       Y5, Y3, Y3
	VPOR        Y6, Y3, Y3       // sign | 0x7e00: the Go code's NaN
	VEXTRACTI128 $1, Y2, X4
	VPACKSSDW   X4, X2, X2       // the mask as 8 words
	VEXTRACTI128 $1, Y3, X4
	VPACKUSDW   X4, X3, X3       // the NaN halves as 8 words
	VPBLENDVB   X2, X3, X1, X1
	VMOVDQU     X1, (DI)
	ADDQ        $32, SI
	ADDQ        $16, DI
	DECQ        CX
	JNZ         f16enc_loop

f16enc_done:
	VZEROUPPER
	RET

// func decodeBF16AVX2(dst []float32, src []byte)
TEXT ·decodeBF16AVX2(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ src_base+24(FP), SI
	SHRQ $3, CX
	JZ   bf16dec_done

bf16dec_loop:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VMOVDQU   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       bf16dec_loop

bf16dec_done:
	VZEROUPPER
	RET

// func encodeBF16AVX2(dst []byte, src []float32)
TEXT ·encodeBF16AVX2(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ src_base+24(FP), SI
	MOVQ src_len+32(FP), CX
	SHRQ $3, CX
	JZ   bf16enc_done
	VMOVDQU bf16round<>(SB), Y5
	VMOVDQU lowbit<>(SB), Y6
	VMOVDQU absmask<>(SB), Y7
	VMOVDQU f32inf<>(SB), Y8
	VMOVDQU bf16quiet<>(SB), Y9

bf16enc_loop:
	VMOVDQU     (SI), Y0         // b
	VPSRLD      $16, Y0, Y1      // b >> 16
	VPAND       Y6, Y1, Y2
	VPADDD      Y5, Y0, Y3
	VPADDD      Y2, Y3, Y3       // b + 0x7fff + (b>>16)&1
	VPSRLD      $16, Y3, Y3
	VPAND       Y7, Y0, Y4
	VPCMPGTD    Y8, Y4, Y4       // NaN: |b| > 0x7f800000
	VPOR        Y9, Y1, Y1       // (b >> 16) | 0x40
	VPBLENDVB   Y4, Y1, Y3, Y3
	VEXTRACTI128 $1, Y3, X4
	VPACKUSDW   X4, X3, X3
	VMOVDQU     X3, (DI)
	ADDQ        $32, SI
	ADDQ        $16, DI
	DECQ        CX
	JNZ         bf16enc_loop

bf16enc_done:
	VZEROUPPER
	RET
