// The wire decoder's loop over groups of four symbols (wireDecodeGroups in
// wire_rans.go), in assembly: Go's code for it keeps the four states in
// memory. It computes exactly what the Go version does.

#include "textflag.h"

// One symbol with state X: slot l = X & mask, a = sym row[l], out[OFF] = a,
// e = fs row[a], X = (e & 0xffff) * (X >> prec) + l - (e >> 16); the rows
// step on. R15 = l, BX = a then f, R13 = e.
#define wireSym(X, OFF) \
	MOVL    X, R15 \
	ANDL    16(SP), R15 \
	MOVBLZX (R8)(R15*1), BX \
	MOVB    BX, OFF(R12) \
	MOVL    (R9)(BX*4), R13 \
	SHRL    CX, X \
	MOVWLZX R13, BX \
	IMULL   BX, X \
	ADDL    R15, X \
	SHRL    $16, R13 \
	SUBL    R13, X \
	ADDQ    R10, R8 \
	ADDQ    R11, R9

// Renormalize X from the group's words in R13 (the next unread word in its
// low 16 bits): if X < 2^16, X = X<<16 | word, R13 >>= 16, R14 += 2.
#define wireRenorm(X) \
	MOVL    X, R15 \
	SHLL    $16, R15 \
	MOVWLZX R13, BX \
	ORL     BX, R15 \
	MOVQ    R13, BX \
	SHRQ    $16, BX \
	CMPL    X, $0x10000 \
	CMOVLCS R15, X \
	CMOVQCS BX, R13 \
	LEAQ    2(R14), R15 \
	CMOVQCS R15, R14

// func wireGroupsAMD64(a *wireGroupArgs)
TEXT ·wireGroupsAMD64(SB), NOSPLIT, $24-8
	MOVQ a+0(FP), BX
	MOVQ 0(BX), R8   // sym row
	MOVQ 8(BX), R9   // fs row
	MOVQ 16(BX), R12 // out
	MOVQ 24(BX), R14 // words
	MOVQ 32(BX), AX
	ADDQ R12, AX
	MOVQ AX, 0(SP)   // out end
	MOVQ 40(BX), AX
	ADDQ R14, AX
	MOVQ AX, 8(SP)   // last group start in words
	MOVQ 48(BX), R10 // rstep
	MOVQ 56(BX), R11
	SHLQ $2, R11     // fstep in bytes
	MOVQ 64(BX), CX  // prec
	MOVL $1, AX
	SHLL CX, AX
	DECL AX
	MOVQ AX, 16(SP)  // mask
	MOVL 72(BX), AX
	MOVL 76(BX), DX
	MOVL 80(BX), SI
	MOVL 84(BX), DI

wire_loop:
	CMPQ R12, 0(SP)
	JAE  wire_done
	CMPQ R14, 8(SP)
	JHI  wire_done
	wireSym(AX, 0)
	wireSym(DX, 1)
	wireSym(SI, 2)
	wireSym(DI, 3)
	MOVQ (R14), R13
	wireRenorm(AX)
	wireRenorm(DX)
	wireRenorm(SI)
	wireRenorm(DI)
	ADDQ $4, R12
	JMP  wire_loop

wire_done:
	MOVQ a+0(FP), BX
	MOVL AX, 72(BX)
	MOVL DX, 76(BX)
	MOVL SI, 80(BX)
	MOVL DI, 84(BX)
	SUBQ 16(BX), R12
	MOVQ R12, 88(BX) // symbols decoded
	SUBQ 24(BX), R14
	MOVQ R14, 96(BX) // bytes of words read
	RET

// One encoder step of state T on the symbol at OFF(SI): the entry e =
// R8 + 24*sym (wireEnc: rcp, xmax, bias, cmpl); T's low 16 bits go to
// -2(DI), and if T >= xmax, T >>= 16 and DI -= 2; then T += bias +
// hi64(T*rcp)*cmpl; the row steps back by R10 bytes.
#define wireEnc(T, OFF) \
	MOVBLZX OFF(SI), BX \
	LEAQ    (BX)(BX*2), BX \
	LEAQ    (R8)(BX*8), BX \
	MOVW    T, -2(DI) \
	MOVL    T, CX \
	SHRL    $16, CX \
	LEAQ    -2(DI), R15 \
	CMPQ    T, 8(BX) \
	CMOVLCC CX, T \
	CMOVQCC R15, DI \
	MOVQ    T, AX \
	MULQ    0(BX) \
	IMULL   20(BX), DX \
	ADDL    16(BX), DX \
	ADDL    DX, T \
	SUBQ    R10, R8

// func wireEncodeAMD64(a *wireEncArgs)
TEXT ·wireEncodeAMD64(SB), NOSPLIT, $0-8
	MOVQ a+0(FP), BX
	MOVQ 0(BX), R8   // entries of the row of the first symbol
	MOVQ 8(BX), SI   // the first symbol (the group's last position)
	MOVQ 16(BX), DI
	ADDQ 24(BX), DI  // the words' start
	MOVQ 32(BX), R9  // groups
	MOVQ 40(BX), R10 // bytes a symbol steps back in the entries
	MOVL 48(BX), R11
	MOVL 52(BX), R12
	MOVL 56(BX), R13
	MOVL 60(BX), R14
	TESTQ R9, R9
	JZ    wire_enc_done

wire_enc_loop:
	wireEnc(R11, 0)
	wireEnc(R12, -1)
	wireEnc(R13, -2)
	wireEnc(R14, -3)
	SUBQ $4, SI
	DECQ R9
	JNZ  wire_enc_loop

wire_enc_done:
	MOVQ a+0(FP), BX
	MOVL R11, 48(BX)
	MOVL R12, 52(BX)
	MOVL R13, 56(BX)
	MOVL R14, 60(BX)
	SUBQ 16(BX), DI
	MOVQ DI, 24(BX)
	RET

// func wireEncodeWideAMD64(a *wireEncWideArgs)
// wireEncodeAMD64's loop with the states in memory: a group of four
// positions k..k-3 takes states j+3..j, then j steps back by four.
TEXT ·wireEncodeWideAMD64(SB), NOSPLIT, $24-8
	MOVQ a+0(FP), BX
	MOVQ 0(BX), R8   // entries of the row of the first symbol
	MOVQ 8(BX), SI   // the first symbol (the group's last position)
	MOVQ 16(BX), DI
	ADDQ 24(BX), DI  // the words' start
	MOVQ 32(BX), R9  // groups
	MOVQ 40(BX), R10 // bytes a symbol steps back in the entries
	MOVQ 48(BX), AX
	MOVQ AX, 0(SP)   // states
	MOVQ 56(BX), AX
	MOVQ AX, 8(SP)   // j
	MOVQ 64(BX), AX
	MOVQ AX, 16(SP)  // jmask
	TESTQ R9, R9
	JZ    wire_encw_done

wire_encw_loop:
	MOVQ 0(SP), BX
	MOVQ 8(SP), CX
	LEAQ (BX)(CX*4), BX
	MOVL 12(BX), R11
	MOVL 8(BX), R12
	MOVL 4(BX), R13
	MOVL 0(BX), R14
	wireEnc(R11, 0)
	wireEnc(R12, -1)
	wireEnc(R13, -2)
	wireEnc(R14, -3)
	MOVQ 0(SP), BX
	MOVQ 8(SP), CX
	LEAQ (BX)(CX*4), BX
	MOVL R11, 12(BX)
	MOVL R12, 8(BX)
	MOVL R13, 4(BX)
	MOVL R14, 0(BX)
	MOVQ 8(SP), CX
	SUBQ $4, CX
	ANDQ 16(SP), CX
	MOVQ CX, 8(SP)
	SUBQ $4, SI
	DECQ R9
	JNZ  wire_encw_loop

wire_encw_done:
	MOVQ a+0(FP), BX
	SUBQ 16(BX), DI
	MOVQ DI, 24(BX)
	RET

DATA wireIota<>+0(SB)/4, $0
DATA wireIota<>+4(SB)/4, $1
DATA wireIota<>+8(SB)/4, $2
DATA wireIota<>+12(SB)/4, $3
DATA wireIota<>+16(SB)/4, $4
DATA wireIota<>+20(SB)/4, $5
DATA wireIota<>+24(SB)/4, $6
DATA wireIota<>+28(SB)/4, $7
DATA wireIota<>+32(SB)/4, $8
DATA wireIota<>+36(SB)/4, $9
DATA wireIota<>+40(SB)/4, $10
DATA wireIota<>+44(SB)/4, $11
DATA wireIota<>+48(SB)/4, $12
DATA wireIota<>+52(SB)/4, $13
DATA wireIota<>+56(SB)/4, $14
DATA wireIota<>+60(SB)/4, $15
GLOBL wireIota<>(SB), RODATA|NOPTR, $64

// One group of 16 symbols with the state vector X (lane i: the state of
// the group's symbol i): slot l = X & mask; a = the byte at sym row + lane
// offset + l (a 4-byte gather, masked to its low byte), stored; e = fs row
// [lane offset + a]; X = (e & 0xffff) * (X >> prec) + l - (e >> 16). Then
// the lanes below 2^16 take the next words in lane order (VPEXPANDD of the
// 16 words at R14, zero-extended): X = X<<16 | word, R14 += 2 a word; the
// rows and out step on.
#define wireGroup32(X) \
	VPANDD      X, Z10, Z2 \
	VPADDD      Z2, Z11, Z3 \
	KXNORW      K1, K1, K1 \
	VPXORD      Z4, Z4, Z4 \
	VPGATHERDD  (R8)(Z3*1), K1, Z4 \
	VPANDD      Z4, Z13, Z4 \
	VPMOVDB     Z4, (R12) \
	VPADDD      Z4, Z12, Z5 \
	KXNORW      K2, K2, K2 \
	VPXORD      Z6, Z6, Z6 \
	VPGATHERDD  (R9)(Z5*4), K2, Z6 \
	VPSRLD      X16, X, X \
	VPANDD      Z6, Z14, Z7 \
	VPMULLD     Z7, X, X \
	VPADDD      Z2, X, X \
	VPSRLD      $16, Z6, Z6 \
	VPSUBD      Z6, X, X \
	VPCMPUD     $1, Z15, X, K3 \
	VPMOVZXWD   (R14), Z8 \
	VPEXPANDD.Z Z8, K3, Z9 \
	VPSLLD      $16, X, K3, X \
	VPORD       Z9, X, X \
	KMOVW       K3, AX \
	POPCNTL     AX, AX \
	LEAQ        (R14)(AX*2), R14 \
	ADDQ        R10, R8 \
	ADDQ        R11, R9 \
	ADDQ        $16, R12

// At a row's end (R15 groups counted down), the rows step back.
#define wireRowEnd(L) \
	DECQ R15 \
	JNZ  L \
	MOVQ DI, R15 \
	SUBQ 112(BX), R8 \
	SUBQ 120(BX), R9 \
L:

// func wireDecode32(a *wireDecode32Args)
TEXT ·wireDecode32(SB), NOSPLIT, $0-8
	MOVQ a+0(FP), BX
	MOVQ 0(BX), R8   // sym row
	MOVQ 8(BX), R9   // fs row
	MOVQ 16(BX), R12 // out
	MOVQ 24(BX), R14 // words
	MOVQ 40(BX), R13
	ADDQ R14, R13    // the last group start in words
	MOVQ 64(BX), CX  // prec
	VMOVQ CX, X16
	MOVL $1, AX
	SHLL CX, AX
	DECL AX
	VPBROADCASTD AX, Z10
	VMOVDQU32 wireIota<>(SB), Z5
	MOVQ 48(BX), AX  // rstep
	VPBROADCASTD AX, Z11
	VPMULLD Z5, Z11, Z11
	SHLQ $4, AX
	MOVQ AX, R10
	MOVQ 56(BX), AX  // fstep
	VPBROADCASTD AX, Z12
	VPMULLD Z5, Z12, Z12
	SHLQ $6, AX
	MOVQ AX, R11
	MOVL $0xff, AX
	VPBROADCASTD AX, Z13
	MOVL $0xffff, AX
	VPBROADCASTD AX, Z14
	MOVL $0x10000, AX
	VPBROADCASTD AX, Z15
	MOVQ 72(BX), SI
	VMOVDQU32 (SI), Z0
	VMOVDQU32 64(SI), Z1
	MOVQ 32(BX), CX  // groups
	XORQ DX, DX
	MOVQ 104(BX), DI // groups a row
	MOVQ DI, R15     // groups left in this row
	MOVQ 80(BX), AX
	TESTQ AX, AX
	JNZ  wire_d32_second

wire_d32_first:
	TESTQ CX, CX
	JZ    wire_d32_done
	CMPQ  R14, R13
	JHI   wire_d32_done
	wireGroup32(Z0)
	DECQ  CX
	INCQ  DX
	wireRowEnd(wire_d32_row0)

wire_d32_second:
	TESTQ CX, CX
	JZ    wire_d32_done
	CMPQ  R14, R13
	JHI   wire_d32_done
	wireGroup32(Z1)
	DECQ  CX
	INCQ  DX
	wireRowEnd(wire_d32_row1)
	JMP   wire_d32_first

wire_d32_done:
	VMOVDQU32 Z0, (SI)
	VMOVDQU32 Z1, 64(SI)
	MOVQ DX, 88(BX)
	SUBQ 24(BX), R14
	MOVQ R14, 96(BX)
	VZEROUPPER
	RET

// func wireCPUID(leaf, sub uint32) (a, b, c, d uint32)
TEXT ·wireCPUID(SB), NOSPLIT, $0-24
	MOVL leaf+0(FP), AX
	MOVL sub+4(FP), CX
	CPUID
	MOVL AX, a+8(FP)
	MOVL BX, b+12(FP)
	MOVL CX, c+16(FP)
	MOVL DX, d+20(FP)
	RET

// func wireXGETBV0() uint32
TEXT ·wireXGETBV0(SB), NOSPLIT, $0-4
	MOVL $0, CX
	XGETBV
	MOVL AX, ret+0(FP)
	RET
