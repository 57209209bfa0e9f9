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
	qmax := float32(iqmax)
	abits := absMaxBits(x)
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
	// |v/s| <= qmax * (scale/s) stays far below 2^22, where roundMagic is exact.
	quantSym(codes, x, s, iqmax)
	return h, nil
}

// DequantizeGroup writes codes * s into dst.
func DequantizeGroup(dst []float32, codes []int8, scale uint16) {
	dequantSym(dst, codes, safetensors.FP16ToFloat32(scale))
}
