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
