package compression

import (
	"fmt"
	"math"

	"kvlib/pkg/safetensors"
)

// Full-range symmetric groups ("symf"): the scale divides the group's
// signed extreme by -2^(b-1), as llama.cpp's q4_0 does, so all 2^b codes
// are used. Plain "sym" divides max|x| by 2^(b-1)-1 and never uses the code
// -2^(b-1): at 3 bits that is 7 levels of 8. In float32, for a group x:
//
//	e = the first element of largest |x|
//	s = fp16(e / -2^(b-1)), stored as +0 when it is zero
//	q = clamp(roundHalfEven(x / s), -2^(b-1), 2^(b-1)-1), or 0 where s = 0
//
// and the reconstruction is float32(q) * s, as for sym.

// QuantizeGroupFull quantizes one group x with every code of the width and
// returns the FP16 bits of its (signed) scale. A NaN or Inf in x is
// ErrNotFinite.
func QuantizeGroupFull(x []float32, bits int, codes []int8) (uint16, error) {
	iqmax := int32(1)<<(bits-1) - 1
	abits := absMaxBits(x)
	if abits >= 0x7f800000 { // Inf's bits and above: Inf or NaN
		return 0, ErrNotFinite
	}
	e := float32(0)
	for _, v := range x {
		if math.Float32bits(v)&0x7fffffff == abits {
			e = v
			break
		}
	}
	h := safetensors.Float32ToFP16(e / -float32(iqmax+1))
	if h&0x7c00 == 0x7c00 {
		return 0, fmt.Errorf("%w (extreme %g)", ErrScaleOverflow, e)
	}
	if h&0x7fff == 0 { // -0 would restore a zero group as -0
		h = 0
	}
	symCodes(codes[:len(x)], x, safetensors.FP16ToFloat32(h), iqmax)
	return h, nil
}

// encodeSymF is symf's entry in methods; it decodes as sym (decodeSym).
func (j *tensorJob) encodeSymF(x []float32, q []int8, gi int) (err error) {
	j.scales[gi], err = QuantizeGroupFull(x, j.l.s.Bits, q)
	return err
}
