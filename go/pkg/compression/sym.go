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
	symCodes(codes[:len(x)], x, safetensors.FP16ToFloat32(h), iqmax)
	return h, nil
}

// symCodes writes the codes of x under the scale s: clamp(rne(x/s), -iqmax-1,
// iqmax), or zeros where s is 0. |x/s| stays far below 2^22, where
// roundMagic is exact: s is max |x| over at least 2^(b-1)-1, rounded.
func symCodes(codes []int8, x []float32, s float32, iqmax int32) {
	if s == 0 {
		for i := range codes {
			codes[i] = 0
		}
		return
	}
	quantSym(codes, x, s, iqmax)
}

// errScaleNotFinite is a stored scale that is Inf or NaN.
var errScaleNotFinite = errors.New("scale is not finite")

// encodeSym and decodeSym are sym's entries in methods (decodeSym is
// symf's too): group gi's FP16 scale, and its codes in q.
func (j *tensorJob) encodeSym(x []float32, q []int8, gi int) (err error) {
	j.scales[gi], err = QuantizeGroup(x, j.l.s.Bits, q)
	return err
}

func (j *tensorJob) decodeSym(y []float32, q []int8, gi int) error {
	if j.scales[gi]&0x7c00 == 0x7c00 {
		return errScaleNotFinite
	}
	DequantizeGroup(y, q, j.scales[gi])
	return nil
}

// DequantizeGroup writes codes * s into dst.
func DequantizeGroup(dst []float32, codes []int8, scale uint16) {
	dequantSym(dst, codes, safetensors.FP16ToFloat32(scale))
}
