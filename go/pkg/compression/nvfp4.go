package compression

import (
	"math"
	"math/bits"
)

// NVFP4 KV caches: vLLM 0.33.0's nvfp4 and nvfp4_4over6, TensorRT-LLM
// 1.2.1's nvfp4. Both engines write with NVIDIA's cvt_warp_fp16_to_fp4
// recipe: per block of 16 consecutive elements of a head vector, with the
// layer's static global scale g = 1/k (k the checkpoint's k_scale or
// v_scale, 1.0 without one; an IEEE float32 division):
//
//	vecMax = max |x|                                  (exact)
//	SF     = g * (vecMax * rcp(6))                    (two float32 products, in this order)
//	sf     = E4M3(SF)                                 (round to nearest even, satfinite at 448)
//	os     = guard ? rcp(float(sf) * rcp(g)) : 0      (rcp: rcp.approx.ftz.f32)
//	code_i = E2M1(x_i * os)                           (cvt.rn.satfinite.e2m1x2.f32)
//
// element 2i in the low nibble. The read is E2M1(code) * float(sf)
// (exact) * k, in float32: the engines fold k into their attention's
// scales, kvlib multiplies it in. kvlib stores a block as [8 code bytes |
// scale byte]; the engines keep the codes and the scales in separate
// regions (see each format's doc comment for its layout).
//
// Numerics common to both: rcp.approx.ftz.f32 (MUFU.RCP) is not
// specified bit-exactly by NVIDIA, and no GPU was at hand: kvlib takes
// the IEEE float32 reciprocal in its place, with the instruction's ftz
// rules (a subnormal input counts as ±0 and gives ±Inf, a subnormal
// result is ±0) [unverified: MUFU.RCP may differ from the IEEE result by
// one ulp for inputs that are not powers of two, here the E4M3 scale's
// mantissas 1.125 ... 1.875 times rcp(g), which moves a code whose x * os
// lies within an ulp of an E2M1 rounding boundary]. The products are IEEE
// float32 without flushing (no .FTZ on the FMULs of vLLM's binary). The
// E2M1 conversion rounds to nearest even and saturates at ±6; a negative
// value that rounds to zero keeps its sign (code 0x8) and a NaN is stored
// as 0x7 [both unverified: PTX does not say; a NaN reaches the conversion
// only in TensorRT-LLM's guard case below, where its block's scale byte
// is 0 and it reads back as 0 whatever the code]. kv-compress refuses a
// cache holding NaN or Inf before it reaches the format; the arithmetic
// is total all the same.
const (
	nvfp4Block = 16               // elements per E4M3 scale
	nvfp4Bytes = nvfp4Block/2 + 1 // 8 bytes of nibbles, 1 scale byte
	// nvfp4ScaleMax is what a calibrated k maps a tensor's largest |x| to,
	// amax / k: the largest E2M1 value times the largest E4M3 scale (6 ×
	// 448), ModelOpt's NVFP4 KV scale amax / (6 · 448).
	nvfp4ScaleMax = 6 * 448
	// nvfp4Rcp6 is rcp.approx.ftz.f32(6.0f) as vLLM 0.33.0's binary has it:
	// the SM100 SASS of reshape_and_cache_nvfp4_kernel (cuobjdump of
	// _C_stable_libtorch.abi3.so) multiplies vecMax by the folded constant
	// 0x3E2AAAAB, the IEEE float32 nearest 1/6.
	nvfp4Rcp6 = float32(1.0 / 6.0)
)

// An nvfp4Writer is one engine's variant of the recipe.
type nvfp4Writer struct {
	// guardVecMax: the output scale is 0 only for an all-zero block
	// (TensorRT-LLM's vecMax != 0); otherwise it is 0 wherever the E4M3
	// scale is (vLLM's float(sf) != 0).
	guardVecMax bool
	// fourOverSix: choose per block between the /6 scale and a /4 one by
	// squared reconstruction error (vLLM's nvfp4_4over6).
	fourOverSix bool
}

var (
	nvfp4VLLM       = nvfp4Writer{}
	nvfp4VLLM4over6 = nvfp4Writer{fourOverSix: true}
	nvfp4TRTLLM     = nvfp4Writer{guardVecMax: true}
)

// rcpApproxFTZ stands in for rcp.approx.ftz.f32: the IEEE reciprocal
// [unverified, see above], subnormal inputs and results flushed to ±0.
func rcpApproxFTZ(a float32) float32 {
	if isSubnormal32(a) {
		a = float32(math.Copysign(0, float64(a)))
	}
	r := 1 / a
	if isSubnormal32(r) {
		r = float32(math.Copysign(0, float64(r)))
	}
	return r
}

func isSubnormal32(v float32) bool {
	b := math.Float32bits(v) & 0x7fffffff
	return b != 0 && b < 0x00800000
}

// fma32 is a*b + c rounded once to float32, as the GPU's FFMA computes
// it. The product is exact in float64; the sum is rounded to float64 and
// its rounding error recovered exactly (TwoSum), so the one case where
// rounding twice differs from rounding once, a float64 sum that lies
// exactly halfway between two float32 values while the exact sum does
// not, is settled by that error's sign.
//
// The float64 sum is such a midpoint only where its 29 bits below a
// float32's 24 are 1 followed by zeros, at float32's normal exponents (and
// its overflow threshold, which that covers too); elsewhere, and for an Inf
// or a NaN, the one rounding of float32(s) is the answer.
func fma32(a, b, c float32) float32 {
	p, cc := float64(a)*float64(b), float64(c)
	s := p + cc
	if u := math.Float64bits(s); u&0x1fffffff != 0x10000000 && u&0x7ff0000000000000 >= 0x3810000000000000 {
		return float32(s)
	}
	return fma32Slow(p, cc, s)
}

// fma32Fast is fma32's fast path, inlined: ok where it is the answer.
func fma32Fast(a, b, c float32) (r float32, ok bool) {
	s := float64(a)*float64(b) + float64(c) // the product is exact: fused or not, one rounding
	u := math.Float64bits(s)
	return float32(s), u&0x1fffffff != 0x10000000 && u&0x7ff0000000000000 >= 0x3810000000000000
}

// fma32Slow is fma32 of the exact product p and c (float64), s = p + cc.
func fma32Slow(p, cc, s float64) float32 {
	r := float32(s)
	if math.IsInf(s, 0) || math.IsNaN(s) || float64(r) == s {
		return r
	}
	bv := s - p
	e := (p - (s - bv)) + (cc - bv)
	if e == 0 {
		return r
	}
	lo, hi := float64(r), float64(r) // the float32 neighbours around s (±2^128 past the largest)
	if lo < s {
		hi = float32Up(r)
	} else {
		lo = -float32Up(-r)
	}
	if (lo+hi)/2 != s {
		return r
	}
	if e > 0 {
		return float32(hi)
	}
	return float32(lo)
}

// float32Up is the float32 after r as a float64, 2^128 after the largest
// finite value (the overflow threshold's other end).
func float32Up(r float32) float64 {
	switch {
	case math.IsInf(float64(r), -1):
		return -math.MaxFloat32
	case r == math.MaxFloat32 || math.IsInf(float64(r), 1):
		return math.Ldexp(1, 128)
	}
	return float64(math.Nextafter32(r, float32(math.Inf(1))))
}

// nvfp4Code is cvt.rn.satfinite.e2m1x2.f32 of one value: e2m1RNE (mx.go),
// and 0x7 for a NaN [unverified].
func nvfp4Code(v float32) uint8 {
	if v != v {
		return 0x7
	}
	return e2m1RNE(float64(v))
}

// e2m1Signed is e2m1Value of each code.
var e2m1Signed = func() (t [16]float32) {
	for c := range t {
		t[c] = e2m1Value(uint8(c))
	}
	return t
}()

// e2m1Value is the signed value of an E2M1 code.
func e2m1Value(c uint8) float32 {
	v := e2m1Values[c&7]
	if c&8 != 0 {
		v = -v
	}
	return v
}

// candidate is one block scale: SF before the conversion, its E4M3
// byte and the output scale, for the block max vecMax, the global scale g
// (rg its rcpApproxFTZ) and the reciprocal rcpDen of the largest code the
// block maps to.
func (w nvfp4Writer) candidate(vecMax, g, rg, rcpDen float32) (sf float32, sfByte uint8, os float32) {
	sf = g * float32(vecMax*rcpDen)
	sfByte = fp8E4M3.encode(sf)
	narrow := fp8E4M3.decode[sfByte]
	if w.guardVecMax && vecMax != 0 || !w.guardVecMax && narrow != 0 {
		os = rcpApproxFTZ(float32(narrow * rg))
	}
	return sf, sfByte, os
}

// fourSixError is nvfp4_reconstruction_error of a block under output
// scale os, as vLLM 0.33.0's SM100 binary computes it: per pair (x, y),
// dx = fma(qx, dq, -x), dy likewise, the pair's error fma(dx, dx, dy*dy)
// (fma(x, x, y*y) when os is 0), summed in float32 from the first pair
// on; q is round_to_nearest_e2m1 of x*os, dq = rcp(os).
func fourSixError(x []float32, os float32) float32 {
	dq := fourSixDQ(os)
	var sum float32
	if useSIMD && os != 0 && absMaxBits(x[:nvfp4Block]) < 0x7f800000 {
		// finite x·os is never NaN, so nvfp4Code is e2m1RNE: its codes from
		// the kernel, their values from a table
		var c [nvfp4Block / 2]byte
		nvfp4CodesAVX2(&c, (*[nvfp4Block]float32)(x[:nvfp4Block]), os)
		for i := 0; i < nvfp4Block; i += 2 {
			a, b := x[i], x[i+1]
			qa, qb := e2m1Signed[c[i/2]&15], e2m1Signed[c[i/2]>>4]
			da, ok := fma32Fast(qa, dq, -a)
			if !ok {
				da = fma32(qa, dq, -a)
			}
			db, ok := fma32Fast(qb, dq, -b)
			if !ok {
				db = fma32(qb, dq, -b)
			}
			bb := float32(db * db)
			e, ok := fma32Fast(da, da, bb)
			if !ok {
				e = fma32(da, da, bb)
			}
			sum = float32(sum + e)
		}
		return sum
	}
	for i := 0; i < nvfp4Block; i += 2 {
		a, b := x[i], x[i+1]
		var e float32
		if os == 0 {
			e = fma32(a, a, float32(b*b))
		} else {
			da := fma32(e2m1Value(e2m1RNE(float64(float32(a*os)))), dq, -a)
			db := fma32(e2m1Value(e2m1RNE(float64(float32(b*os)))), dq, -b)
			e = fma32(da, da, float32(db*db))
		}
		sum = float32(sum + e)
	}
	return sum
}

// fourSixDQ is fourSixError's dq = rcp(os), 0 where os is 0.
func fourSixDQ(os float32) float32 {
	if os == 0 {
		return 0
	}
	return rcpApproxFTZ(os)
}

// quantize writes one block of 16 values with the global scale 1/k into
// dst (nvfp4Bytes), and reports whether x held a NaN or an Inf and how
// many values the block clamped: those past ±6 times the block's scale
// where the static scale pushed that scale past E4M3's range (SF > 464,
// beyond which rounding to nearest would no longer give 448; a scale
// within rounding of 448, as a calibrated k gives, clamps nothing).
func (w nvfp4Writer) quantize(x []float32, dst []byte, k float32) (nonFinite bool, saturated int) {
	x = x[:nvfp4Block]
	top := absMaxBits(x)
	vecMax := math.Float32frombits(top)
	g := 1 / k
	rg := rcpApproxFTZ(g)
	sf, sfByte, os := w.candidate(vecMax, g, rg, nvfp4Rcp6)
	if w.fourOverSix {
		// nvfp4_candidate_scale(..., 4.0f): rcp.approx.ftz(4) is 0.25, a
		// multiplication by 0.25 in the binary; ties keep /6
		sf4, sfByte4, os4 := w.candidate(vecMax, g, rg, 0.25)
		if useSIMD && haveFMA && top < 0x7f800000 && max(math.Float32bits(os4), math.Float32bits(os)) < 0x7f800000 {
			// finite values and output scales (≥ 0): both errors, the choice and
			// its codes in one kernel, each FFMA a single-rounding VFMADD
			_, _, past6, four := nvfp4FourSixAVX2((*[nvfp4Block / 2]byte)(dst[:nvfp4Block/2]), (*[nvfp4Block]float32)(x),
				os4, fourSixDQ(os4), os, fourSixDQ(os))
			if four {
				sf, sfByte = sf4, sfByte4
			}
			if sf > 464 {
				saturated = bits.OnesCount32(past6)
			}
			dst[nvfp4Block/2] = sfByte
			return false, saturated
		}
		if fourSixError(x, os4) < fourSixError(x, os) {
			sf, sfByte, os = sf4, sfByte4, os4
		}
	}
	if useSIMD { // the same products and codes, 16 at a time (nvfp4CodesAVX2)
		past6 := nvfp4CodesAVX2((*[nvfp4Block / 2]byte)(dst[:nvfp4Block/2]), (*[nvfp4Block]float32)(x), os)
		if sf > 464 {
			saturated = bits.OnesCount32(past6)
		}
		dst[nvfp4Block/2] = sfByte
		return top >= 0x7f800000, saturated
	}
	for i := 0; i < nvfp4Block; i += 2 {
		a, b := float32(x[i]*os), float32(x[i+1]*os)
		dst[i/2] = nvfp4Code(a) | nvfp4Code(b)<<4
		if sf > 464 {
			for _, v := range [2]float32{a, b} {
				if v > 6 || v < -6 {
					saturated++
				}
			}
		}
	}
	dst[nvfp4Block/2] = sfByte
	return top >= 0x7f800000, saturated
}

// nvfp4Dequantize reads one block: E2M1 value times the E4M3 scale
// (exact), times k.
func nvfp4Dequantize(src []byte, dst []float32, k float32) {
	sf := fp8E4M3.decode[src[nvfp4Block/2]]
	if useSIMD {
		nvfp4DecAVX2((*[nvfp4Block]float32)(dst[:nvfp4Block]), (*[nvfp4Block / 2]byte)(src[:nvfp4Block/2]), sf, k)
		return
	}
	for i := range dst[:nvfp4Block] {
		dst[i] = e2m1Value(src[i/2]>>(4*(i&1))&0xf) * sf * k
	}
}

// quantizeRun is quantize over whole consecutive blocks (engineFormat's
// quantizeRun).
func (w nvfp4Writer) quantizeRun(x []float32, dst []byte, r blockRun) (nonFinite bool, saturated int) {
	k := r.k
	for i := 0; i < len(x)/nvfp4Block; i++ {
		nf, n := w.quantize(x[i*nvfp4Block:(i+1)*nvfp4Block], dst[i*nvfp4Bytes:(i+1)*nvfp4Bytes], k)
		nonFinite, saturated = nonFinite || nf, saturated+n
	}
	return nonFinite, saturated
}

// nvfp4DequantizeRun is nvfp4Dequantize over whole consecutive blocks.
func nvfp4DequantizeRun(src []byte, dst []float32, r blockRun) {
	k := r.k
	for i := 0; i < len(dst)/nvfp4Block; i++ {
		nvfp4Dequantize(src[i*nvfp4Bytes:(i+1)*nvfp4Bytes], dst[i*nvfp4Block:(i+1)*nvfp4Block], k)
	}
}
