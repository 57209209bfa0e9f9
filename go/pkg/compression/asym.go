package compression

import (
	"errors"
	"fmt"

	"kvlib/pkg/safetensors"
)

// QuantizeGroupAsym quantizes one group x asymmetrically to unsigned codes
// in [0, 2^bits-1], stored in codes as their low bits (Pack masks them),
// and returns the FP16 bits of the scale s and the zero point m:
//
//	m = fp16(min x), s = fp16((max x - min x) / (2^bits - 1))
//	q = clamp(roundHalfEven((x - m) / s), 0, 2^bits - 1), or 0 where s = 0
//
// all in float32. A NaN or Inf in x is ErrNotFinite; m or s beyond FP16 is
// ErrScaleOverflow.
func QuantizeGroupAsym(x []float32, bits int, codes []int8) (scale, zero uint16, err error) {
	lo, hi, abits := minMax(x)
	if abits >= 0x7f800000 { // Inf's bits and above: Inf or NaN
		return 0, 0, ErrNotFinite
	}
	if len(x) == 0 {
		lo, hi = 0, 0
	}
	qmax := float32(int32(1)<<bits - 1)
	zero = safetensors.Float32ToFP16(lo)
	scale = safetensors.Float32ToFP16((hi - lo) / qmax)
	if zero&0x7c00 == 0x7c00 || scale&0x7c00 == 0x7c00 {
		return 0, 0, fmt.Errorf("%w (group range [%g, %g])", ErrScaleOverflow, lo, hi)
	}
	m, s := safetensors.FP16ToFloat32(zero), safetensors.FP16ToFloat32(scale)
	codes = codes[:len(x)]
	if s == 0 {
		for i := range codes {
			codes[i] = 0
		}
		return scale, zero, nil
	}
	quantAsym(codes, x, m, s, qmax)
	return scale, zero, nil
}

// encodeAsym and decodeAsym are asym's entries in methods: group gi's
// FP16 scale and zero point, and its codes in q.
func (j *tensorJob) encodeAsym(x []float32, q []int8, gi int) (err error) {
	j.scales[gi], j.zeros[gi], err = QuantizeGroupAsym(x, j.l.s.Bits, q)
	return err
}

func (j *tensorJob) decodeAsym(y []float32, q []int8, gi int) error {
	if j.scales[gi]&0x7c00 == 0x7c00 || j.zeros[gi]&0x7c00 == 0x7c00 {
		return errors.New("scale or zero point is not finite")
	}
	DequantizeGroupAsym(y, q, j.l.s.Bits, j.scales[gi], j.zeros[gi])
	return nil
}

// DequantizeGroupAsym writes float32(q*s) + m into dst; codes hold the
// unsigned codes in their low bits (as Unpack leaves them, sign-extended).
func DequantizeGroupAsym(dst []float32, codes []int8, bits int, scale, zero uint16) {
	s, m := safetensors.FP16ToFloat32(scale), safetensors.FP16ToFloat32(zero)
	mask := uint8(1)<<bits - 1
	if bits == 8 {
		mask = 0xff
	}
	dequantAsym(dst, codes, mask, s, m)
}
