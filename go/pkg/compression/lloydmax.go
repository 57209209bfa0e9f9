package compression

import (
	"fmt"
	"math"

	"kvlib/pkg/safetensors"
)

// Lloyd–Max groups ("lm"): after the Walsh-Hadamard rotation a group's
// values are close to Gaussian, and the levels that minimise a unit
// Gaussian's squared error (Max, 1960) beat evenly spaced ones. A group
// stores one FP16 scale s and, per element, the index q of its level:
// the reconstruction is float32(L[q] * s), with L the ascending levels of
// the width (lmLevels). Exactly, in float32, for a group x:
//
//	a = max |x|
//	for each candidate c: s_c = fp16(a * F[c]), F[c] = float32(lmFractions[bits][c] / L[n-1])
//	    q(x) = #{k : x > float32(M[k] * s_c)}, M[k] = float32((L[k] + L[k+1]) / 2)
//	    d_i = x_i - float32(L[q(x_i)] * s_c); lane j sums float32(d_i * d_i) over
//	    i = j, j+8, j+16, ... in order, from 0; E_c = ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))
//	s = the s_c of the smallest E_c (the first on ties); codes q(x) under s
//
// A zero s (a zero group) gives every element the code n/2, the smallest
// positive level, and so the reconstruction +0. The
// candidates put the group's largest value at fractions of the outermost
// level around where a Gaussian group of 64 has it (max |x| is near 2.4
// sigma, where the 2-, 3- and 4-bit codebooks want 0.63, 0.90 and 1.14);
// on real caches, after rotation, four of them do as well as eight from
// 0.5 to 1.2 (README). The eight lanes let the sum run eight wide.

// MinLMBits and MaxLMBits bound the Lloyd–Max widths (the codebooks below).
const (
	MinLMBits = 2
	MaxLMBits = 4
)

// lmLevels are the non-negative Lloyd–Max levels of a unit Gaussian, per
// width; the codebook is their negatives and themselves, ascending.
var lmLevels = map[int][]float64{
	2: {0.4528, 1.5104},
	3: {0.2451, 0.7560, 1.3439, 2.1519},
	4: {0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6180, 2.0690, 2.7326},
}

// LMCandidates is how many scales a group tries.
const LMCandidates = 4

// lmFractions are where a candidate scale puts max |x|, as a fraction of
// the outermost level, per width.
var lmFractions = map[int][LMCandidates]float64{
	2: {0.45, 0.55, 0.65, 0.75},
	3: {0.7, 0.8, 0.9, 1.0},
	4: {0.85, 0.95, 1.05, 1.15},
}

// lmCodebook is one width's constants in float32.
type lmCodebook struct {
	levels []float32 // L, ascending, 2^bits of them
	mids   []float32 // M, the midpoints between neighbours
	fracs  [LMCandidates]float32
}

var lmBooks = func() map[int]*lmCodebook {
	books := map[int]*lmCodebook{}
	for bits, pos := range lmLevels {
		var full []float64
		for i := len(pos) - 1; i >= 0; i-- {
			full = append(full, -pos[i])
		}
		full = append(full, pos...)
		b := &lmCodebook{}
		for i, v := range full {
			b.levels = append(b.levels, float32(v))
			if i > 0 {
				b.mids = append(b.mids, float32((full[i-1]+v)/2))
			}
		}
		for c, f := range lmFractions[bits] {
			b.fracs[c] = float32(f / full[len(full)-1])
		}
		books[bits] = b
	}
	return books
}()

// lmTables are a codebook scaled by one s: thresholds and reconstructions.
type lmTables struct {
	t [15]float32 // float32(M[k] * s)
	y [16]float32 // float32(L[k] * s), repeated past the codebook
}

func (b *lmCodebook) tables(s float32, tb *lmTables) {
	for k := range tb.t {
		tb.t[k] = float32(math.Inf(1)) // past the codebook: never exceeded
	}
	for k, m := range b.mids {
		tb.t[k] = float32(m * s)
	}
	for k, l := range b.levels {
		tb.y[k] = float32(l * s)
	}
	for k := len(b.levels); k < len(tb.y); k++ { // any bits above a code's width: the same level
		tb.y[k] = tb.y[k%len(b.levels)]
	}
}

// code is #{k : x > t[k]}, by a binary search over the ascending
// thresholds (the same count) without branches: t - x is negative, its
// sign bit set, exactly when x > t (float32 subtraction keeps the sign of
// the exact difference and gives zero only for equal values).
func (tb *lmTables) code(x float32, n int) int {
	lo := 0 // codes [lo, lo+2h) remain
	for h := n / 2; h > 0; h /= 2 {
		lo += h & -int(math.Float32bits(tb.t[lo+h-1]-x)>>31)
	}
	return lo
}

// sqErr is the group's squared error under tb, summed in the eight lanes
// of the spec.
func (tb *lmTables) sqErr(x []float32, n int) float32 {
	var l [8]float32
	i := simdLen(len(x))
	if i > 0 {
		if n <= 8 {
			lmErr8AVX2(x[:i], &tb.t, &tb.y, &l)
		} else {
			lmErr16AVX2(x[:i], &tb.t, &tb.y, &l)
		}
	}
	for ; i+8 <= len(x); i += 8 {
		for j := 0; j < 8; j++ {
			d := x[i+j] - tb.y[tb.code(x[i+j], n)]
			l[j] += float32(d * d)
		}
	}
	for j := 0; i < len(x); i, j = i+1, j+1 {
		d := x[i] - tb.y[tb.code(x[i], n)]
		l[j] += float32(d * d)
	}
	return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

// QuantizeGroupLM quantizes one group x to Lloyd–Max codes (unsigned, in
// the low bits of codes) and returns the FP16 bits of its scale. A NaN or
// Inf in x is ErrNotFinite.
func QuantizeGroupLM(x []float32, bits int, codes []int8) (uint16, error) {
	b := lmBooks[bits]
	abits := absMaxBits(x)
	if abits >= 0x7f800000 {
		return 0, ErrNotFinite
	}
	a := math.Float32frombits(abits)
	codes = codes[:len(x)]
	n := len(b.levels)
	var best uint16
	var bestErr float32
	var tb lmTables
	for c := range b.fracs {
		h := safetensors.Float32ToFP16(a * b.fracs[c])
		if h&0x7c00 == 0x7c00 {
			return 0, fmt.Errorf("%w (max |x| = %g)", ErrScaleOverflow, a)
		}
		b.tables(safetensors.FP16ToFloat32(h), &tb) // s = 0: every level 0, E = sum x^2
		if e := tb.sqErr(x, n); c == 0 || e < bestErr {
			best, bestErr = h, e
		}
	}
	s := safetensors.FP16ToFloat32(best)
	if s == 0 {
		for i := range codes {
			codes[i] = int8(n / 2)
		}
		return best, nil
	}
	b.tables(s, &tb)
	i := simdLen(len(x))
	if i > 0 {
		if n <= 8 {
			lmCodes8AVX2(codes[:i], x[:i], &tb.t)
		} else {
			lmCodes16AVX2(codes[:i], x[:i], &tb.t)
		}
	}
	for ; i < len(x); i++ {
		codes[i] = int8(tb.code(x[i], n))
	}
	return best, nil
}

// encodeLM and decodeLM are lm's entries in methods: group gi's FP16
// scale, and its level indices in q.
func (j *tensorJob) encodeLM(x []float32, q []int8, gi int) (err error) {
	j.scales[gi], err = QuantizeGroupLM(x, j.l.s.Bits, q)
	return err
}

func (j *tensorJob) decodeLM(y []float32, q []int8, gi int) error {
	if j.scales[gi]&0x7c00 == 0x7c00 {
		return errScaleNotFinite
	}
	DequantizeGroupLM(y, q, j.l.s.Bits, j.scales[gi])
	return nil
}

// DequantizeGroupLM writes float32(L[q] * s) into dst; codes hold the
// level indices in their low bits (as Unpack leaves them, sign-extended).
func DequantizeGroupLM(dst []float32, codes []int8, bits int, scale uint16) {
	b := lmBooks[bits]
	var tb lmTables
	b.tables(safetensors.FP16ToFloat32(scale), &tb)
	mask := uint8(1)<<bits - 1
	codes = codes[:len(dst)]
	i := simdLen(len(dst))
	if i > 0 { // reads the code's low 4 bits: y repeats the levels past the codebook
		lmDequantAVX2(dst[:i], codes[:i], &tb.y)
	}
	for ; i < len(dst); i++ {
		dst[i] = tb.y[uint8(codes[i])&mask]
	}
}
