// Mode 4's AVX-512 decoder (wireDecodeOrder1Groups in wire_order1.go): as
// wireDecode32 (wire_amd64.s), with each lane's table row the sum of its
// channel's base (the head's (head, class) context << prec) and the code
// decoded d positions before (the previous token's, same channel) << prec.

#include "textflag.h"

// One group of 16 symbols with the state vector X: the previous row's 16
// codes at R10, zero-extended and shifted by prec, plus the 16 bases at
// R9, plus slot l = X & mask, index the entries at R8 (symbol, frequency
// less one, l - start); the symbol is stored at R12; X = (X >> prec) * f +
// (l - start); the lanes below 2^16 take the next words in lane order.
// R12, R10 step by 16, R9 by 64 bytes, back to R11 at DI (the row's end).
#define wireO1Group(X) \
	VPMOVZXBD   (R10), Z7 \
	VPSLLD      X16, Z7, Z7 \
	VPADDD      (R9), Z7, Z7 \
	VPANDD      X, Z10, Z2 \
	VPADDD      Z2, Z7, Z3 \
	KXNORW      K1, K1, K1 \
	VPXORD      Z4, Z4, Z4 \
	VPGATHERDD  (R8)(Z3*4), K1, Z4 \
	VPMOVDB     Z4, (R12) \
	VPSRLD      $8, Z4, Z5 \
	VPANDD      Z5, Z13, Z5 \
	VPADDD      Z5, Z14, Z5 \
	VPSRLD      $20, Z4, Z6 \
	VPSRLD      X16, X, X \
	VPMULLD     Z5, X, X \
	VPADDD      Z6, X, X \
	VPCMPUD     $1, Z15, X, K3 \
	VPMOVZXWD   (R14), Z8 \
	VPEXPANDD.Z Z8, K3, Z9 \
	VPSLLD      $16, X, K3, X \
	VPORD       Z9, X, X \
	KMOVW       K3, AX \
	POPCNTL     AX, AX \
	LEAQ        (R14)(AX*2), R14 \
	ADDQ        $16, R12 \
	ADDQ        $16, R10 \
	ADDQ        $64, R9 \
	CMPQ        R9, DI \
	CMOVQEQ     R11, R9

// func wireDecodeOrder1(a *wireOrder1Args)
TEXT ·wireDecodeOrder1(SB), NOSPLIT, $0-8
	MOVQ a+0(FP), BX
	MOVQ 0(BX), R8   // entries
	MOVQ 8(BX), R12  // out
	MOVQ 16(BX), R14 // words
	MOVQ 32(BX), R13
	ADDQ R14, R13    // the last group start in words
	MOVQ 40(BX), CX  // prec
	VMOVQ CX, X16
	MOVL $1, AX
	SHLL CX, AX
	DECL AX
	VPBROADCASTD AX, Z10
	MOVL $0xfff, AX
	VPBROADCASTD AX, Z13
	MOVL $1, AX
	VPBROADCASTD AX, Z14
	MOVL $0x10000, AX
	VPBROADCASTD AX, Z15
	MOVQ 48(BX), SI
	VMOVDQU32 (SI), Z0
	VMOVDQU32 64(SI), Z1
	MOVQ 80(BX), R11 // bases
	MOVQ 96(BX), R10 // d
	LEAQ (R11)(R10*4), DI
	MOVQ R11, R9
	ADDQ 88(BX), R9  // the first group's bases
	MOVQ R12, AX
	SUBQ R10, AX
	MOVQ AX, R10     // the previous row's codes
	MOVQ 24(BX), CX  // groups
	XORQ DX, DX
	MOVQ 56(BX), AX
	TESTQ AX, AX
	JNZ  wire_o1_second

wire_o1_first:
	TESTQ CX, CX
	JZ    wire_o1_done
	CMPQ  R14, R13
	JHI   wire_o1_done
	wireO1Group(Z0)
	DECQ  CX
	INCQ  DX

wire_o1_second:
	TESTQ CX, CX
	JZ    wire_o1_done
	CMPQ  R14, R13
	JHI   wire_o1_done
	wireO1Group(Z1)
	DECQ  CX
	INCQ  DX
	JMP   wire_o1_first

wire_o1_done:
	VMOVDQU32 Z0, (SI)
	VMOVDQU32 Z1, 64(SI)
	MOVQ DX, 64(BX)
	SUBQ 16(BX), R14
	MOVQ R14, 72(BX)
	VZEROUPPER
	RET

// One encoder group of 16 symbols with the state vector XZ (its low half
// XY), as wireEncGroup32 (wire_amd64.s), each lane's entry at fs (R8)
// [((base at R9 + the previous row's code at R15) << bits) + symbol];
// SI and R15 step back by 16, R9 by 64 bytes, from R13 (the row's first
// base) round to R10 (its end).
#define wireO1EncGroup(XZ, XY) \
	VPMOVZXBD     (SI), Z2 \
	VPMOVZXBD     (R15), Z3 \
	VPADDD        (R9), Z3, Z3 \
	VPSLLD        X24, Z3, Z3 \
	VPADDD        Z2, Z3, Z3 \
	KXNORW        K1, K1, K1 \
	VPXORD        Z4, Z4, Z4 \
	VPGATHERDD    (R8)(Z3*4), K1, Z4 \
	VPANDD        Z4, Z21, Z5 \
	VPSRLD        $16, Z4, Z6 \
	VPSRLD        X23, XZ, Z7 \
	VPCMPUD       $5, Z5, Z7, K2 \
	VPCOMPRESSD   XZ, K2, Z8 \
	KMOVW         K2, AX \
	POPCNTL       AX, AX \
	MOVL          $16, CX \
	SUBL          AX, CX \
	MOVL          $0xffff, R11 \
	SHLL          CX, R11 \
	KMOVW         R11, K3 \
	VPEXPANDD.Z   Z8, K3, Z9 \
	VPMOVDW       Z9, -32(DI) \
	SHLQ          $1, AX \
	SUBQ          AX, DI \
	VPSRLD        $16, XZ, K2, XZ \
	VCVTUDQ2PD    XY, Z11 \
	VEXTRACTI32X8 $1, XZ, Y12 \
	VCVTUDQ2PD    Y12, Z12 \
	VCVTUDQ2PD    Y5, Z13 \
	VEXTRACTI32X8 $1, Z5, Y14 \
	VCVTUDQ2PD    Y14, Z14 \
	VDIVPD        Z13, Z11, Z11 \
	VDIVPD        Z14, Z12, Z12 \
	VCVTTPD2UDQ   Z11, Y11 \
	VCVTTPD2UDQ   Z12, Y12 \
	VINSERTI32X8  $1, Y12, Z11, Z11 \
	VPSUBD        Z5, Z22, Z15 \
	VPMULLD       Z15, Z11, Z11 \
	VPADDD        Z11, XZ, XZ \
	VPADDD        Z6, XZ, XZ \
	SUBQ          $16, SI \
	SUBQ          $16, R15 \
	CMPQ          R9, R13 \
	CMOVQEQ       R10, R9 \
	SUBQ          $64, R9

// func wireEncodeOrder1(a *wireEncOrder1Args)
TEXT ·wireEncodeOrder1(SB), NOSPLIT, $0-8
	MOVQ a+0(FP), BX
	MOVQ 0(BX), R8   // fs
	MOVQ 8(BX), SI   // the first group's symbols (the highest group)
	MOVQ 16(BX), DI
	ADDQ 24(BX), DI  // the words' start
	MOVQ 88(BX), CX  // prec
	MOVL $1, AX
	SHLL CX, AX
	VPBROADCASTD AX, Z22 // M
	MOVQ $32, AX
	SUBQ CX, AX
	VMOVQ AX, X23
	MOVL $0xffff, AX
	VPBROADCASTD AX, Z21
	MOVQ 80(BX), AX  // bits
	VMOVQ AX, X24
	MOVQ 40(BX), DX
	VMOVDQU32 (DX), Z0
	VMOVDQU32 64(DX), Z1
	MOVQ 32(BX), R12 // groups
	MOVQ 56(BX), R13 // bases
	MOVQ 72(BX), R14 // d
	LEAQ (R13)(R14*4), R10
	MOVQ R13, R9
	ADDQ 64(BX), R9  // the first group's bases
	MOVQ SI, R15
	SUBQ R14, R15    // the previous row's codes
	MOVQ 48(BX), AX
	TESTQ AX, AX
	JZ   wire_o1e_low

wire_o1e_high:
	TESTQ R12, R12
	JZ    wire_o1e_done
	wireO1EncGroup(Z1, Y1)
	DECQ  R12

wire_o1e_low:
	TESTQ R12, R12
	JZ    wire_o1e_done
	wireO1EncGroup(Z0, Y0)
	DECQ  R12
	JMP   wire_o1e_high

wire_o1e_done:
	MOVQ 40(BX), DX
	VMOVDQU32 Z0, (DX)
	VMOVDQU32 Z1, 64(DX)
	SUBQ 16(BX), DI
	MOVQ DI, 24(BX)
	VZEROUPPER
	RET
