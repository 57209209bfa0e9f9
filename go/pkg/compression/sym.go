package compression

import (
	"errors"
	"fmt"
	"math"

	"kvlib/pkg/safetensors"
)

// ErrScaleOverflow reports a group whose scale does not fit in FP16.
var ErrScaleOverflow = errors.New("group scale overflows FP16")

// ErrNotFinite reports a NaN or Inf in a group.
var ErrNotFinite = errors.New("NaN or Inf cannot be quantized")

// roundMagic rounds half to even for |v| < 2^22 by float32 addition: the
// sum's ulp is 1, so the FPU's own round-to-nearest-even does the work.
const roundMagic = float32(1 << 23 * 1.5)

// QuantizeGroup (sym) quantizes one group x symmetrically into codes (len(x) values) and
// returns the FP16 bits of its scale. A NaN or Inf in x is ErrNotFinite.
func QuantizeGroup(x []float32, bits int, codes []int8) (uint16, error) {
	iqmax := int32(1)<<(bits-1) - 1
	iqmin := -iqmax - 1
	qmax := float32(iqmax)
	// max |x| on the bits: for non-negative floats the bit patterns order
	// like the values, and integer max is branch-free (signs are random).
	var abits uint32
	for _, v := range x {
		abits = max(abits, math.Float32bits(v)&0x7fffffff)
	}
	if abits >= 0x7f800000 { // Inf's bits and above: Inf or NaN
		return 0, ErrNotFinite
	}
	amax := math.Float32frombits(abits)
	h := safetensors.Float32ToFP16(amax / qmax)
	if h&0x7c00 == 0x7c00 {
		return 0, fmt.Errorf("%w (max |x| = %g)", ErrScaleOverflow, amax)
	}
	s := safetensors.FP16ToFloat32(h)
	codes = codes[:len(x)]
	if s == 0 {
		for i := range codes {
			codes[i] = 0
		}
		return h, nil
	}
	for i, v := range x {
		// |v/s| <= qmax * (scale/s) stays far below 2^22, where roundMagic is exact.
		q := int32((v/s + roundMagic) - roundMagic)
		codes[i] = int8(min(max(q, iqmin), iqmax)) // integer clamp: branch-free
	}
	return h, nil
}

// DequantizeGroup writes codes * s into dst.
func DequantizeGroup(dst []float32, codes []int8, scale uint16) {
	s := safetensors.FP16ToFloat32(scale)
	for i, q := range codes[:len(dst)] {
		dst[i] = float32(q) * s
	}
}
