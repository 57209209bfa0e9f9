package safetensors

import (
	"encoding/binary"
	"math"
	"unsafe"
)

// useSIMD selects the assembly conversions (AVX2 and F16C, little-endian
// amd64); the Go functions below define their bits and run everywhere else.
var useSIMD = haveSIMD

// SetSIMD switches the assembly conversions on or off (when the CPU has
// them) and returns the previous setting: tests and benchmarks compare the
// two paths with it.
func SetSIMD(on bool) bool {
	prev := useSIMD
	useSIMD = on && haveSIMD
	return prev
}

// simdLen is the prefix of n values the assembly conversions take.
func simdLen(n int) int {
	if !useSIMD {
		return 0
	}
	return n &^ 7
}

// FP16ToFloat32 converts IEEE 754 binary16 bits to float32 (exactly).
func FP16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case mant == 0: // signed zero
		return math.Float32frombits(sign)
	}
	// subnormal: mant * 2^-24, exact in float32
	f := float32(mant) * (1.0 / (1 << 24))
	if sign != 0 {
		return -f
	}
	return f
}

// Float32ToFP16 converts float32 to binary16 bits, rounding to nearest even.
// Values too large for FP16 become ±Inf; NaN stays NaN.
func Float32ToFP16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 // quiet NaN
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00 // overflow
	}
	if e <= 0 {
		// subnormal or zero in FP16: shift the full significand right.
		if e < -10 {
			return sign // rounds to zero
		}
		m := mant | 0x800000
		shift := uint32(14 - e) // 24-bit significand down to 10-e bits
		half := uint32(1) << (shift - 1)
		r := m >> shift
		rem := m & (1<<shift - 1)
		if rem > half || (rem == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r) // r may carry into the exponent: still correct
	}
	r := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && r&1 == 1) {
		r++ // a carry into the exponent is correct, up to Inf
	}
	return sign | uint16(r)
}

// BF16ToFloat32 converts bfloat16 bits to float32 (exactly).
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToBF16 converts float32 to bfloat16 bits, rounding to nearest even.
func Float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40 // quiet NaN
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// Float32View returns b's bytes as float32s without copying, when they are
// F32 data this machine reads natively: a little-endian host and b aligned
// to 4 bytes. Otherwise ok is false and the caller decodes a copy.
func Float32View(b []byte) (v []float32, ok bool) {
	if !littleEndian || len(b)%4 != 0 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 != 0 {
		return nil, false
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4), true
}

// DecodeFloat32s decodes little-endian src of dtype dt into dst.
func DecodeFloat32s(dst []float32, src []byte, dt DType) {
	switch dt {
	case F32:
		src = src[:4*len(dst)]            // one bounds check for the loop
		if littleEndian && len(dst) > 0 { // the bytes are already float32s
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), src)
			return
		}
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i : 4*i+4]))
		}
	case F16:
		src = src[:2*len(dst)]
		n := simdLen(len(dst))
		if n > 0 {
			decodeF16AVX2(dst[:n], src[:2*n])
		}
		for i := n; i < len(dst); i++ {
			dst[i] = FP16ToFloat32(binary.LittleEndian.Uint16(src[2*i : 2*i+2]))
		}
	case BF16:
		src = src[:2*len(dst)]
		n := simdLen(len(dst))
		if n > 0 {
			decodeBF16AVX2(dst[:n], src[:2*n])
		}
		for i := n; i < len(dst); i++ {
			dst[i] = BF16ToFloat32(binary.LittleEndian.Uint16(src[2*i : 2*i+2]))
		}
	default:
		panic("safetensors: DecodeFloat32s of " + string(dt))
	}
}

// littleEndian reports whether this machine stores a float32 as the
// little-endian bytes safetensors uses, so F32 converts by a plain copy.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// EncodeFloat32s encodes src as little-endian dtype dt into dst.
func EncodeFloat32s(dst []byte, src []float32, dt DType) {
	switch dt {
	case F32:
		dst = dst[:4*len(src)]
		if littleEndian && len(src) > 0 {
			copy(dst, unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 4*len(src)))
			return
		}
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:4*i+4], math.Float32bits(v))
		}
	case F16:
		dst = dst[:2*len(src)]
		n := simdLen(len(src))
		if n > 0 {
			encodeF16AVX2(dst[:2*n], src[:n])
		}
		for i := n; i < len(src); i++ {
			binary.LittleEndian.PutUint16(dst[2*i:2*i+2], Float32ToFP16(src[i]))
		}
	case BF16:
		dst = dst[:2*len(src)]
		n := simdLen(len(src))
		if n > 0 {
			encodeBF16AVX2(dst[:2*n], src[:n])
		}
		for i := n; i < len(src); i++ {
			binary.LittleEndian.PutUint16(dst[2*i:2*i+2], Float32ToBF16(src[i]))
		}
	default:
		panic("safetensors: EncodeFloat32s to " + string(dt))
	}
}
