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
// the group's symbol i): slot l = X & mask; e = the entry at row + lane
// offset + l (decodeEntries's: symbol, frequency less one, l - start);
// the symbol (e's low byte) is stored; X = (X >> prec) * (f-1+1) +
// (l - start). Then the lanes below 2^16 take the next words in lane
// order (VPEXPANDD of the 16 words at R14, zero-extended): X = X<<16 |
// word, R14 += 2 a word; the row and out step on.
#define wireGroup32(X) \
	VPANDD      X, Z10, Z2 \
	VPADDD      Z2, Z11, Z3 \
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
	ADDQ        R10, R8 \
	ADDQ        $16, R12

// At a row's end (R15 groups counted down), the row steps back.
#define wireRowEnd(L) \
	DECQ R15 \
	JNZ  L \
	MOVQ DI, R15 \
	SUBQ 96(BX), R8 \
L:

// func wireDecode32(a *wireDecode32Args)
TEXT ·wireDecode32(SB), NOSPLIT, $0-8
	MOVQ a+0(FP), BX
	MOVQ 0(BX), R8   // entries row
	MOVQ 8(BX), R12  // out
	MOVQ 16(BX), R14 // words
	MOVQ 32(BX), R13
	ADDQ R14, R13    // the last group start in words
	MOVQ 48(BX), CX  // prec
	VMOVQ CX, X16
	MOVL $1, AX
	SHLL CX, AX
	DECL AX
	VPBROADCASTD AX, Z10
	VMOVDQU32 wireIota<>(SB), Z5
	MOVQ 40(BX), AX  // rstep
	VPBROADCASTD AX, Z11
	VPMULLD Z5, Z11, Z11
	SHLQ $6, AX      // 16 lanes of 4 bytes
	MOVQ AX, R10
	MOVL $0xfff, AX
	VPBROADCASTD AX, Z13
	MOVL $1, AX
	VPBROADCASTD AX, Z14
	MOVL $0x10000, AX
	VPBROADCASTD AX, Z15
	MOVQ 56(BX), SI
	VMOVDQU32 (SI), Z0
	VMOVDQU32 64(SI), Z1
	MOVQ 24(BX), CX  // groups
	XORQ DX, DX
	MOVQ 88(BX), DI  // groups a row
	MOVQ DI, R15     // groups left in this row
	MOVQ 64(BX), AX
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
	MOVQ DX, 72(BX)
	SUBQ 16(BX), R14
	MOVQ R14, 80(BX)
	VZEROUPPER
	RET

// One encoder group of 16 symbols with the state vector XZ (its low half
// XY): the symbols at SI, e = fs row [lane offset + symbol]; the lanes
// whose state x has x >> (32-prec) >= freq give their low 16 bits, in
// lane order, as the words below DI (compressed, moved to the top lanes,
// narrowed and stored as the 32 bytes below DI: the bytes below the
// group's words are free), and shift down by 16; then x += start +
// floor(x/freq) * (M - freq), the quotient in float64 (exact: x < 2^32,
// freq <= 2^12). The row and the symbols step back.
#define wireEncGroup32(XZ, XY) \
	VPMOVZXBD     (SI), Z2 \
	VPADDD        Z2, Z20, Z3 \
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
	SUBQ          R10, R8

// At a row's start (R15 groups counted down), the row steps on to the
// previous row's last group.
#define wireEncRowEnd(L) \
	DECQ R15 \
	JNZ  L \
	MOVQ R9, R15 \
	ADDQ 72(BX), R8 \
L:

// func wireEncode32(a *wireEnc32Args)
TEXT ·wireEncode32(SB), NOSPLIT, $0-8
	MOVQ a+0(FP), BX
	MOVQ 0(BX), R8   // fs row of the first group's first lane
	MOVQ 8(BX), SI   // the first group's symbols (the highest group)
	MOVQ 16(BX), DI
	ADDQ 24(BX), DI  // the words' start
	MOVQ 80(BX), CX  // prec
	MOVL $1, AX
	SHLL CX, AX
	VPBROADCASTD AX, Z22 // M
	MOVQ $32, AX
	SUBQ CX, AX
	VMOVQ AX, X23
	MOVL $0xffff, AX
	VPBROADCASTD AX, Z21
	VMOVDQU32 wireIota<>(SB), Z5
	MOVQ 40(BX), AX  // lane step in entries
	VPBROADCASTD AX, Z20
	VPMULLD Z5, Z20, Z20
	SHLQ $6, AX
	MOVQ AX, R10     // bytes a group steps back
	MOVQ 48(BX), DX
	VMOVDQU32 (DX), Z0
	VMOVDQU32 64(DX), Z1
	MOVQ 32(BX), R12 // groups
	MOVQ 64(BX), R9  // groups a row
	MOVQ R9, R15
	MOVQ 56(BX), AX
	TESTQ AX, AX
	JZ   wire_e32_low

wire_e32_high:
	TESTQ R12, R12
	JZ    wire_e32_done
	wireEncGroup32(Z1, Y1)
	DECQ  R12
	wireEncRowEnd(wire_e32_row1)

wire_e32_low:
	TESTQ R12, R12
	JZ    wire_e32_done
	wireEncGroup32(Z0, Y0)
	DECQ  R12
	wireEncRowEnd(wire_e32_row0)
	JMP   wire_e32_high

wire_e32_done:
	MOVQ 48(BX), DX
	VMOVDQU32 Z0, (DX)
	VMOVDQU32 Z1, 64(DX)
	SUBQ 16(BX), DI
	MOVQ DI, 24(BX)
	VZEROUPPER
	RET

// func wireFill32(dst []uint32, e uint32)
// dst[l] = e | l<<20, sixteen entries a store (decodeEntries's segments).
TEXT ·wireFill32(SB), NOSPLIT, $0-28
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVL e+24(FP), AX
	VPBROADCASTD AX, Z0
	VMOVDQU32 wireIota<>(SB), Z1
	VPSLLD $20, Z1, Z1
	VPORD  Z1, Z0, Z0
	MOVL $0x1000000, AX
	VPBROADCASTD AX, Z2

wire_fill_loop:
	CMPQ CX, $16
	JB   wire_fill_tail
	VMOVDQU32 Z0, (DI)
	VPADDD Z2, Z0, Z0
	ADDQ $64, DI
	SUBQ $16, CX
	JMP  wire_fill_loop

wire_fill_tail:
	TESTQ CX, CX
	JZ    wire_fill_done
	MOVL $1, AX
	SHLL CX, AX
	DECL AX
	KMOVW AX, K1
	VMOVDQU32 Z0, K1, (DI)

wire_fill_done:
	VZEROUPPER
	RET

// The unpacking of 2-, 3- and 4-bit codes to a byte each (wireUnpack's
// loops, AVX2): whole blocks, the Go code does the rest.

DATA wireShuf2<>+0(SB)/8, $0x0101010100000000
DATA wireShuf2<>+8(SB)/8, $0x0303030302020202
DATA wireShuf2<>+16(SB)/8, $0x0505050504040404
DATA wireShuf2<>+24(SB)/8, $0x0707070706060606
GLOBL wireShuf2<>(SB), RODATA|NOPTR, $32

DATA wireShuf3<>+0(SB)/8, $0x0201010001000100
DATA wireShuf3<>+8(SB)/8, $0x0302030202010201
DATA wireShuf3<>+16(SB)/8, $0x0504040304030403
DATA wireShuf3<>+24(SB)/8, $0x0605060505040504
GLOBL wireShuf3<>(SB), RODATA|NOPTR, $32

DATA wireMul3<>+0(SB)/8, $0x1000008004002000
DATA wireMul3<>+8(SB)/8, $0x0100080000400200
DATA wireMul3<>+16(SB)/8, $0x1000008004002000
DATA wireMul3<>+24(SB)/8, $0x0100080000400200
GLOBL wireMul3<>(SB), RODATA|NOPTR, $32

// func wireUnpack4AVX2(dst []uint8, src []byte)
// 64 codes from 32 bytes a step, len(dst)/64 steps: the low and the high
// nibbles masked, interleaved within the 128-bit lanes, and the lanes put
// in order.
TEXT ·wireUnpack4AVX2(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ src_base+24(FP), SI
	MOVL $0x0f0f0f0f, AX
	VMOVD AX, X7
	VPBROADCASTD X7, Y7
	SHRQ $6, CX
	JZ   wire_u4_done

wire_u4_loop:
	VMOVDQU    (SI), Y0
	VPSRLW     $4, Y0, Y1
	VPAND      Y7, Y0, Y0
	VPAND      Y7, Y1, Y1
	VPUNPCKLBW Y1, Y0, Y2
	VPUNPCKHBW Y1, Y0, Y3
	VPERM2I128 $0x20, Y3, Y2, Y4
	VPERM2I128 $0x31, Y3, Y2, Y5
	VMOVDQU    Y4, (DI)
	VMOVDQU    Y5, 32(DI)
	ADDQ       $32, SI
	ADDQ       $64, DI
	DECQ       CX
	JNZ        wire_u4_loop

wire_u4_done:
	VZEROUPPER
	RET

// func wireUnpack2AVX2(dst []uint8, src []byte)
// 32 codes from 8 bytes a step, len(dst)/32 steps: each byte copied to
// the four bytes of its codes, then byte k of every four takes bits
// 2k..2k+1 (a 16-bit shift; the mask drops what the shift brings in).
TEXT ·wireUnpack2AVX2(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ src_base+24(FP), SI
	VMOVDQU wireShuf2<>(SB), Y8
	MOVL $0x00000003, AX
	VMOVD AX, X9
	VPBROADCASTD X9, Y9
	MOVL $0x00000300, AX
	VMOVD AX, X10
	VPBROADCASTD X10, Y10
	MOVL $0x00030000, AX
	VMOVD AX, X11
	VPBROADCASTD X11, Y11
	MOVL $0x03000000, AX
	VMOVD AX, X12
	VPBROADCASTD X12, Y12
	SHRQ $5, CX
	JZ   wire_u2_done

wire_u2_loop:
	VPBROADCASTQ (SI), Y0
	VPSHUFB      Y8, Y0, Y0
	VPAND        Y9, Y0, Y1
	VPSRLW       $2, Y0, Y2
	VPAND        Y10, Y2, Y2
	VPSRLW       $4, Y0, Y3
	VPAND        Y11, Y3, Y3
	VPSRLW       $6, Y0, Y4
	VPAND        Y12, Y4, Y4
	VPOR         Y2, Y1, Y1
	VPOR         Y4, Y3, Y3
	VPOR         Y3, Y1, Y1
	VMOVDQU      Y1, (DI)
	ADDQ         $8, SI
	ADDQ         $32, DI
	DECQ         CX
	JNZ          wire_u2_loop

wire_u2_done:
	VZEROUPPER
	RET

// func wireUnpack3AVX2(dst []uint8, src []byte)
// 32 codes from 12 bytes a step, len(dst)/32 steps (reading 14 bytes a
// step: the caller leaves two bytes of src past the last): per 16-bit lane
// the two bytes that hold a code, multiplied so that the code's bits are
// the top three, shifted down, and packed to bytes.
TEXT ·wireUnpack3AVX2(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ src_base+24(FP), SI
	VMOVDQU wireShuf3<>(SB), Y8
	VMOVDQU wireMul3<>(SB), Y9
	SHRQ $5, CX
	JZ   wire_u3_done

wire_u3_loop:
	VPBROADCASTQ (SI), Y0
	VPBROADCASTQ 6(SI), Y1
	VPSHUFB      Y8, Y0, Y0
	VPSHUFB      Y8, Y1, Y1
	VPMULLW      Y9, Y0, Y0
	VPMULLW      Y9, Y1, Y1
	VPSRLW       $13, Y0, Y0
	VPSRLW       $13, Y1, Y1
	VPACKUSWB    Y1, Y0, Y0
	VPERMQ       $0xD8, Y0, Y0
	VMOVDQU      Y0, (DI)
	ADDQ         $12, SI
	ADDQ         $32, DI
	DECQ         CX
	JNZ          wire_u3_loop

wire_u3_done:
	VZEROUPPER
	RET
