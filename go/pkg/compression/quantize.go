package compression

import (
	"errors"
	"fmt"

	"kvlib/pkg/safetensors"
)

// MinBits and MaxBits bound the code width.
const (
	MinBits = 2
	MaxBits = 8
)

// ErrScaleOverflow reports a group whose scale does not fit in FP16.
var ErrScaleOverflow = errors.New("group scale overflows FP16")

// CheckParams validates a code width and group size.
func CheckParams(bits, groupSize int) error {
	if bits < MinBits || bits > MaxBits {
		return fmt.Errorf("bits %d out of range [%d, %d]", bits, MinBits, MaxBits)
	}
	if groupSize <= 0 || groupSize%2 != 0 {
		return fmt.Errorf("group size %d must be a positive even number", groupSize)
	}
	return nil
}

// roundMagic rounds half to even for |v| < 2^22 by float32 addition: the
// sum's ulp is 1, so the FPU's own round-to-nearest-even does the work.
const roundMagic = float32(1 << 23 * 1.5)

// QuantizeGroup quantizes one group x into codes (len(x) values) and
// returns the FP16 bits of its scale.
func QuantizeGroup(x []float32, bits int, codes []int8) (uint16, error) {
	qmax := float32(int(1)<<(bits-1) - 1)
	qmin := -qmax - 1
	var amax float32
	for _, v := range x {
		if v < 0 {
			v = -v
		}
		if v > amax {
			amax = v
		}
	}
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
		q := (v/s + roundMagic) - roundMagic
		if q > qmax {
			q = qmax
		} else if q < qmin {
			q = qmin
		}
		codes[i] = int8(q)
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
