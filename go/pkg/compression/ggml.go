package compression

import (
	"encoding/binary"
	"fmt"
	"math"

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
	blockSize int // bytes per block of 32
	hasMin    bool
}

// ggmlInfo describes type m (ok false for other methods). A switch, not a
// map: it runs once per block.
func ggmlInfo(m Method) (t ggmlType, ok bool) {
	switch m {
	case Q4_0:
		return ggmlType{4, 18, false}, true
	case Q4_1:
		return ggmlType{4, 20, true}, true
	case Q5_0:
		return ggmlType{5, 22, false}, true
	case Q5_1:
		return ggmlType{5, 24, true}, true
	case Q8_0:
		return ggmlType{8, 34, false}, true
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
		var abits uint32
		imax := 0
		for i, v := range x {
			if b := math.Float32bits(v) & 0x7fffffff; b > abits {
				abits, imax = b, i
			}
		}
		if abits >= 0x7f800000 {
			return ErrNotFinite
		}
		switch m {
		case Q4_0:
			d = x[imax] / -8
			quantizeOffset(&q, x, recip(d), 8.5, 15)
		case Q5_0:
			d = x[imax] / -16
			quantizeOffset(&q, x, recip(d), 16.5, 31)
		default:
			d = math.Float32frombits(abits) / 127
			id := recip(d)
			for i, v := range x {
				q[i] = uint8(int8(math.Round(float64(float32(v * id))))) // half away from zero
			}
		}
	case Q4_1, Q5_1:
		lo, hi := x[0], x[0]
		for _, v := range x {
			lo, hi = min(lo, v), max(hi, v)
		}
		if lo != lo || hi != hi || math.IsInf(float64(lo), 0) || math.IsInf(float64(hi), 0) {
			return ErrNotFinite
		}
		qmax := uint8(15)
		if m == Q5_1 {
			qmax = 31
		}
		d, mn = (hi-lo)/float32(qmax), lo
		id := recip(d)
		for i, v := range x {
			q[i] = truncCode(float32(float32(v-lo)*id)+0.5, qmax)
		}
	default:
		return fmt.Errorf("%s is not a ggml type", m)
	}
	return putBlock(m, dst, d, mn, &q)
}

// quantizeOffset is q = min(trunc(x*id + off), qmax), the q4_0/q5_0 codes.
func quantizeOffset(q *[GGMLBlock]uint8, x []float32, id, off float32, qmax uint8) {
	for i, v := range x[:GGMLBlock] {
		q[i] = truncCode(float32(v*id)+off, qmax)
	}
}

// putBlock writes a block: d [, m] [, qh] and the codes.
func putBlock(m Method, dst []byte, d, mn float32, q *[GGMLBlock]uint8) error {
	dh := safetensors.Float32ToFP16(d)
	mh := safetensors.Float32ToFP16(mn)
	if dh&0x7c00 == 0x7c00 || mh&0x7c00 == 0x7c00 {
		return fmt.Errorf("%w (%s block scale %g, minimum %g)", ErrScaleOverflow, m, d, mn)
	}
	binary.LittleEndian.PutUint16(dst, dh)
	off := 2
	if m == Q4_1 || m == Q5_1 {
		binary.LittleEndian.PutUint16(dst[2:], mh)
		off = 4
	}
	switch m {
	case Q8_0:
		copy(dst[off:off+32], q[:])
		return nil
	case Q5_0, Q5_1:
		var qh uint32
		for i, c := range q {
			qh |= uint32(c>>4) << i
		}
		binary.LittleEndian.PutUint32(dst[off:], qh)
		off += 4
	}
	for j := 0; j < 16; j++ {
		dst[off+j] = q[j]&0x0f | q[j+16]<<4
	}
	return nil
}

// DequantizeBlockGGML decodes one block of type m from src into 32 values.
// A non-finite scale or minimum is an error.
func DequantizeBlockGGML(m Method, src []byte, dst []float32) error {
	dst = dst[:GGMLBlock]
	dh := binary.LittleEndian.Uint16(src)
	d := safetensors.FP16ToFloat32(dh)
	var mn float32
	off := 2
	if m == Q4_1 || m == Q5_1 {
		mh := binary.LittleEndian.Uint16(src[2:])
		if mh&0x7c00 == 0x7c00 {
			return fmt.Errorf("block minimum is not finite")
		}
		mn = safetensors.FP16ToFloat32(mh)
		off = 4
	}
	if dh&0x7c00 == 0x7c00 {
		return fmt.Errorf("block scale is not finite")
	}
	if m == Q8_0 {
		for i := range dst {
			dst[i] = float32(int8(src[off+i])) * d
		}
		return nil
	}
	var qh uint32
	if m == Q5_0 || m == Q5_1 {
		qh = binary.LittleEndian.Uint32(src[off:])
		off += 4
	}
	var q [GGMLBlock]uint8
	for j, b := range src[off : off+16] {
		q[j] = b&0x0f | uint8(qh>>j&1)<<4
		q[j+16] = b>>4 | uint8(qh>>(j+16)&1)<<4
	}
	switch m {
	case Q4_0:
		for i, c := range q {
			dst[i] = d * float32(int8(c)-8)
		}
	case Q5_0:
		for i, c := range q {
			dst[i] = d * float32(int8(c)-16)
		}
	default: // q4_1, q5_1; the conversion rounds d*q first
		for i, c := range q {
			dst[i] = float32(d*float32(c)) + mn
		}
	}
	return nil
}
