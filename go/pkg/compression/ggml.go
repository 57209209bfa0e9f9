package compression

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"kvlib/pkg/safetensors"
)

// llama.cpp's KV-cache types (-ctk/-ctv): blocks of 32 elements along the
// row-major tensor, each stored as FP16 scale d [, FP16 minimum m]
// [, 32 high bits qh] and the codes. The arithmetic is that of the gguf
// Python package's gguf.quants (the test oracle), in float32:
//
//	q4_0: d = x[argmax|x|] / -8,  q = min(trunc(x/d + 8.5), 15),       x' = d(q-8)
//	q5_0: d = x[argmax|x|] / -16, q = min(trunc(x/d + 16.5), 31),      x' = d(q-16)
//	q4_1: d = (max-min)/15,       q = min(trunc((x-min)/d + 0.5), 15), x' = dq + m
//	q5_1: d = (max-min)/31,       q = min(trunc((x-min)/d + 0.5), 31), x' = dq + m
//	q8_0: d = max|x| / 127,       q = roundHalfAway(x/d),              x' = dq
//
// where x/d is x times the float32 reciprocal of d (0 when d = 0).
type ggmlType struct {
	bits      int
	blockSize int // bytes per block
	hasMin    bool
	elems     int // elements per block when not GGMLBlock (an engine's unblocked f16: 1)
}

// blockElems is the elements per block: GGMLBlock unless set.
func (t *ggmlType) blockElems() int {
	if t.elems > 0 {
		return t.elems
	}
	return GGMLBlock
}

// ggmlInfo describes type m, from its entry in methods (ok false for
// other methods).
func ggmlInfo(m Method) (t ggmlType, ok bool) {
	if q := quantizerOf(m); q != nil && !q.packed() {
		return *q.block, true
	}
	return ggmlType{}, false
}

// GGMLBlockBytes is the size of one block of 32 elements of type m.
func GGMLBlockBytes(m Method) int { t, _ := ggmlInfo(m); return t.blockSize }

func recip(d float32) float32 {
	if d == 0 {
		return 0
	}
	return 1 / d
}

// truncCode is uint8(trunc(v)) for the non-negative v the quantizers make,
// clamped to [0, qmax] (and 0 for a NaN, which only a subnormal d can cause).
func truncCode(v float32, qmax uint8) uint8 {
	if !(v >= 0) {
		return 0
	}
	if v >= float32(qmax) {
		return qmax
	}
	return uint8(v)
}

// QuantizeBlockGGML encodes 32 values x as one block of type m into dst
// (GGMLBlockBytes(m) bytes).
func QuantizeBlockGGML(m Method, x []float32, dst []byte) error {
	x = x[:GGMLBlock]
	var q [GGMLBlock]uint8
	var d, mn float32
	switch m {
	case Q4_0, Q5_0, Q8_0:
		// The first element of largest |x| (argmax), compared on the bits.
		imax, abits := argAbsMax32(x)
		if abits >= 0x7f800000 {
			return ErrNotFinite
		}
		switch m {
		case Q4_0:
			d = x[imax] / -8
			offsetCodes32(&q, x, 0, recip(d), 8.5, 15)
		case Q5_0:
			d = x[imax] / -16
			offsetCodes32(&q, x, 0, recip(d), 16.5, 31)
		default:
			d = math.Float32frombits(abits) / 127
			roundCodes32(&q, x, recip(d))
		}
	case Q4_1, Q5_1:
		lo, hi, abits := minMax(x)
		if abits >= 0x7f800000 {
			return ErrNotFinite
		}
		qmax := uint8(15)
		if m == Q5_1 {
			qmax = 31
		}
		d, mn = (hi-lo)/float32(qmax), lo
		offsetCodes32(&q, x, lo, recip(d), 0.5, qmax)
	default:
		return fmt.Errorf("%s is not a ggml type", m)
	}
	return putBlock(m, dst, d, mn, &q)
}

// putBlock writes a block: d [, m] [, qh] and the codes; a scale or
// minimum beyond FP16 is an error.
func putBlock(m Method, dst []byte, d, mn float32, q *[GGMLBlock]uint8) error {
	dh := safetensors.Float32ToFP16(d)
	mh := safetensors.Float32ToFP16(mn)
	if dh&0x7c00 == 0x7c00 || mh&0x7c00 == 0x7c00 {
		return fmt.Errorf("%w (%s block scale %g, minimum %g)", ErrScaleOverflow, m, d, mn)
	}
	writeBlock(m, dst, dh, mh, q)
	return nil
}

// writeBlock writes a block of type m from its FP16 scale dh (and minimum
// mh), whatever their values, and its codes (the low bits of each; q5
// types' bit 4 into qh).
func writeBlock(m Method, dst []byte, dh, mh uint16, q *[GGMLBlock]uint8) {
	binary.LittleEndian.PutUint16(dst, dh)
	off := 2
	if m == Q4_1 || m == Q5_1 {
		binary.LittleEndian.PutUint16(dst[2:], mh)
		off = 4
	}
	switch m {
	case Q8_0:
		copy(dst[off:off+32], q[:])
		return
	case Q5_0, Q5_1:
		binary.LittleEndian.PutUint32(dst[off:], highBits(q))
		off += 4
	}
	// Byte j holds code j in its low nibble and code j+16 in its high one,
	// eight bytes at a time.
	const low = 0x0f0f0f0f0f0f0f0f
	for j := 0; j < 16; j += 8 {
		a, b := binary.LittleEndian.Uint64(q[j:]), binary.LittleEndian.Uint64(q[j+16:])
		binary.LittleEndian.PutUint64(dst[off+j:], a&low|(b&low)<<4)
	}
}

// highBits gathers bit 4 of each code: bit i of the result is q[i]'s.
func highBits(q *[GGMLBlock]uint8) uint32 {
	var qh uint32
	for j := 0; j < GGMLBlock; j += 8 {
		// Bit 4 of each byte, moved to bit 0, then gathered into the top
		// byte by a multiply whose partial products do not overlap.
		w := binary.LittleEndian.Uint64(q[j:]) >> 4 & 0x0101010101010101
		qh |= uint32(w*0x0102040810204080>>56) << j
	}
	return qh
}

// spreadBits[b] has byte k = 0x10 where bit k of b is set: the high bits
// of 8 q5 codes, ready to be or-ed onto their low nibbles.
var spreadBits = func() (t [256]uint64) {
	for b := range t {
		for k := 0; k < 8; k++ {
			t[b] |= uint64(b>>k&1) << (8*k + 4)
		}
	}
	return t
}()

// encodeBlock and decodeBlock are the block types' entries in methods:
// block gi of the job's codes.
func (j *tensorJob) encodeBlock(x []float32, _ []int8, gi int) error {
	bb := j.l.q.block.blockSize
	return QuantizeBlockGGML(j.l.s.Method, x, j.codes[gi*bb:(gi+1)*bb])
}

func (j *tensorJob) decodeBlock(y []float32, _ []int8, gi int) error {
	bb := j.l.q.block.blockSize
	return DequantizeBlockGGML(j.l.s.Method, j.codes[gi*bb:(gi+1)*bb], y)
}

// DequantizeBlockGGML decodes one block of type m from src into 32 values.
// A non-finite scale or minimum is an error.
func DequantizeBlockGGML(m Method, src []byte, dst []float32) error {
	if m == Q4_1 || m == Q5_1 {
		if binary.LittleEndian.Uint16(src[2:])&0x7c00 == 0x7c00 {
			return fmt.Errorf("block minimum is not finite")
		}
	}
	if binary.LittleEndian.Uint16(src)&0x7c00 == 0x7c00 {
		return fmt.Errorf("block scale is not finite")
	}
	dequantBlock(m, src, dst)
	return nil
}

// dequantBlock decodes one block of type m, whatever its scale and
// minimum (a non-finite one gives the products IEEE arithmetic gives, as
// ggml's dequantize_row_* does).
func dequantBlock(m Method, src []byte, dst []float32) {
	dst = dst[:GGMLBlock]
	d := safetensors.FP16ToFloat32(binary.LittleEndian.Uint16(src))
	var mn float32
	off := 2
	if m == Q4_1 || m == Q5_1 {
		mn = safetensors.FP16ToFloat32(binary.LittleEndian.Uint16(src[2:]))
		off = 4
	}
	if m == Q8_0 { // dst[i] = float32(int8(code)) * d
		dequantSym(dst, codesOf(src[off:off+GGMLBlock]), d)
		return
	}
	var qh uint32
	if m == Q5_0 || m == Q5_1 {
		qh = binary.LittleEndian.Uint32(src[off:])
		off += 4
	}
	// Codes j and j+16 from byte j's nibbles and bits j and j+16 of qh,
	// eight at a time.
	var q [GGMLBlock]uint8
	const low = 0x0f0f0f0f0f0f0f0f
	for j := 0; j < 16; j += 8 {
		b := binary.LittleEndian.Uint64(src[off+j:])
		binary.LittleEndian.PutUint64(q[j:], b&low|spreadBits[uint8(qh>>j)])
		binary.LittleEndian.PutUint64(q[j+16:], b>>4&low|spreadBits[uint8(qh>>(j+16))])
	}
	switch m {
	case Q4_0, Q5_0: // dst[i] = d * float32(int8(code) - bias), bias 8 or 16
		bias := uint64(0x0808080808080808)
		if m == Q5_0 {
			bias <<= 1
		}
		for j := 0; j < GGMLBlock; j += 8 {
			// Byte-wise code - bias modulo 256: setting bit 7 first keeps
			// each byte's borrow inside it (codes are below 32).
			c := binary.LittleEndian.Uint64(q[j:])
			binary.LittleEndian.PutUint64(q[j:], (c|0x8080808080808080)-bias^0x8080808080808080)
		}
		dequantSym(dst, codesOf(q[:]), d)
	default: // q4_1, q5_1: float32(d * float32(code)) + mn, the product rounded first
		dequantAsym(dst, codesOf(q[:]), 0xff, d, mn)
	}
}

// codesOf reads bytes as the signed codes the dequantizers take.
func codesOf(b []byte) []int8 {
	return unsafe.Slice((*int8)(unsafe.Pointer(unsafe.SliceData(b))), len(b))
}
