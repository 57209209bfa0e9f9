package compression

import (
	"encoding/binary"
	"math"
)

// vLLM's KV-cache formats (--kv-cache-dtype), as vLLM 0.33.0 writes them
// (the wheel vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64, commit
// 4ba787ec9; paths relative to its vllm/ package, CUDA kernels in the
// repository's csrc/).
//
// Per-tensor FP8 (fp8 = fp8_e4m3, fp8_e5m2): one static float32 scale per
// layer and role, the checkpoint's k_scale/v_scale or 1.0 when it has
// none (model_executor/layers/quantization/kv_cache.py:117-169,
// attention/attention.py:133-153); vLLM 0.33.0 computes none at run time
// (calculate_kv_scales is gone). kvlib's /scaleS option is that scale,
// default 1 (the flag alone); calibrated scales are per-layer overrides
// (k3=vllm:fp8_e4m3/scale0.0123). The write is the CUDA
// reshape_and_cache_flash of the FlashAttention and FlashInfer backends
// (csrc/cache_kernels.cu, CopyWithScaleOp; csrc/quantization/w8a8/fp8/
// nvidia/quant_utils.cuh scaled_convert): the value widened to float32,
// divided by the scale (an IEEE float32 division), converted with
// __nv_cvt_float_to_fp8(..., __NV_SATFINITE, E4M3|E5M2): round to nearest
// even, finite values beyond the largest (448, 57344) and infinities to
// the largest. The read multiplies by the scale (float32).
//
// Per-token-head (int8_per_token_head, fp8_per_token_head): the Triton
// kernel _reshape_cache_per_token_head
// (v1/attention/ops/triton_reshape_and_cache_flash.py:168-275), one
// program per (token, KV head): scale = max(amax|x| / QMAX, 1e-6) with
// QMAX 127 (int8) or 448 (fp8), stored as float32 beside the head's codes;
// codes = x * (1/scale), for int8 rounded half away from zero (±0.5, then
// the store's truncation), clamped to [QMIN, QMAX] first; for fp8 clamped
// to ±448 and cast (round to nearest even). The read is code * scale
// (float32). The divisions are IEEE here and in Triton's interpreter; the
// GPU's div.full.f32 may differ from them by up to 2 ulp, which moves a
// stored scale in its last bits and, rarely, a code by one step.
var vllm = &engine{
	name:    "vllm",
	version: "vLLM 0.33.0 (wheel, commit 4ba787ec9)",
	flag:    "--kv-cache-dtype %s",
	detail: func(f *engineFormat) string {
		if f.name == "int4_per_token_head" {
			return "read, its rotation executed: vLLM's own RHT (fast_hadamard_transform, _get_rht_signs, single_rht; " +
				"tests/third_party/vllm_int4_rht.py, verbatim from the wheel) runs on the vector caches and gives the codec's " +
				"rotated values, signs and restored cache; the Triton quantizer was read (file cited), not run"
		}
		return "read: from the pinned source (file cited); tests/vllm_reference.py, the NumPy reference written from it, pins the " +
			"codec bit for bit (tests/vectors/engine_vectors.json), its float8 casts checked against torch's; vLLM's CUDA and " +
			"Triton writers have not run on these bytes (no GPU here)"
	},
	formats: []*engineFormat{
		{name: "fp8", bits: 8, elems: 1, bytes: 1, scaled: true, scaleMax: 448, evidence: EvidenceRead,
			source:    "csrc/cache_kernels.cu reshape_and_cache_flash (CopyWithScaleOp); csrc/quantization/w8a8/fp8/nvidia/quant_utils.cuh scaled_convert; 'fp8' is fp8_e4m3 (utils/torch_utils.py:79)",
			encodeAll: encodeFP8All(fp8E4M3), decodeAll: decodeFP8All(fp8E4M3)},
		{name: "fp8_e4m3", bits: 8, elems: 1, bytes: 1, scaled: true, scaleMax: 448, evidence: EvidenceRead,
			source:    "csrc/cache_kernels.cu reshape_and_cache_flash (CopyWithScaleOp); csrc/quantization/w8a8/fp8/nvidia/quant_utils.cuh scaled_convert",
			encodeAll: encodeFP8All(fp8E4M3), decodeAll: decodeFP8All(fp8E4M3)},
		{name: "fp8_e5m2", bits: 8, elems: 1, bytes: 1, scaled: true, scaleMax: 57344, evidence: EvidenceRead,
			source:    "csrc/cache_kernels.cu reshape_and_cache_flash (FlashInfer's writer; FlashAttention refuses e5m2, v1/attention/backends/fa_utils.py:293)",
			encodeAll: encodeFP8All(fp8E5M2), decodeAll: decodeFP8All(fp8E5M2)},
		{name: "int8_per_token_head", bits: 8, perHead: true, evidence: EvidenceRead,
			source:     "v1/attention/ops/triton_reshape_and_cache_flash.py:168-283 (_reshape_cache_per_token_head, IS_INT_QUANT)",
			quantize:   perHeadQuantizer(perHeadInt8),
			dequantize: perHeadDequantizer(perHeadInt8)},
		{name: "fp8_per_token_head", bits: 8, perHead: true, evidence: EvidenceRead,
			source:     "v1/attention/ops/triton_reshape_and_cache_flash.py:168-283 (_reshape_cache_per_token_head, FP8_MAX 448)",
			quantize:   perHeadQuantizer(perHeadFP8),
			dequantize: perHeadDequantizer(perHeadFP8)},
		vllmInt4,
	},
}

// An fp8Format is one of the OCP 8-bit float formats, as NVIDIA's
// satfinite conversion writes it.
type fp8Format struct {
	mant, bias int   // mantissa bits, exponent bias
	maxCode    uint8 // the largest finite magnitude's code (448: 0x7e; 57344: 0x7b)
	nan        uint8 // the code of a NaN (the PTX canonical NaN)
	decode     *[256]float32
}

var (
	fp8E4M3 = newFP8Format(3, 7, 0x7e)
	fp8E5M2 = newFP8Format(2, 15, 0x7b)
)

func newFP8Format(mant, bias int, maxCode uint8) *fp8Format {
	f := &fp8Format{mant: mant, bias: bias, maxCode: maxCode, nan: 0x7f, decode: new([256]float32)}
	for c := 0; c < 256; c++ {
		e, m := c>>mant&(1<<(7-mant)-1), c&(1<<mant-1)
		var v float64
		switch {
		case c&0x7f > int(maxCode) && (mant == 3 || m != 0):
			v = math.NaN()
		case c&0x7f > int(maxCode): // e5m2's 0x7c: Inf
			v = math.Inf(1)
		case e == 0:
			v = math.Ldexp(float64(m), 1-bias-mant)
		default:
			v = math.Ldexp(float64(m|1<<mant), e-bias-mant)
		}
		if c&0x80 != 0 {
			v = -v
		}
		f.decode[c] = float32(v)
	}
	return f
}

// encode converts y as __nv_cvt_float_to_fp8(y, __NV_SATFINITE, ...):
// round to nearest even; beyond the largest finite value, and ±Inf, the
// largest; NaN the canonical NaN.
func (f *fp8Format) encode(y float32) uint8 {
	u := math.Float32bits(y)
	if u&0x7fffffff > 0x7f800000 {
		return f.nan
	}
	return uint8(u>>24)&0x80 | uint8(min(f.rounded(u&0x7fffffff), uint32(f.maxCode)))
}

// rounded is the code of the magnitude a (float32 bits, finite or Inf)
// rounded to nearest even, unbounded: past the largest finite value it
// counts on (an Inf's is far past it).
func (f *fp8Format) rounded(a uint32) uint32 {
	if int(a>>23)-127 >= 1-f.bias { // a normal number of the format (or beyond it)
		shift := uint32(23 - f.mant)
		r := (a + (1<<(shift-1) - 1) + (a >> shift & 1)) >> shift // round the mantissa, to even
		return r - uint32(127-f.bias)<<f.mant
	}
	// a subnormal of the format, or zero: an exact scaling, then one rounding
	return uint32(math.RoundToEven(float64(math.Float32frombits(a)) * math.Ldexp(1, f.bias-1+f.mant)))
}

// encodeFP8All and decodeFP8All are a per-tensor FP8 format's conversion
// of a whole chunk, with the scheme's static scale.
func encodeFP8All(f *fp8Format) func(j *tensorJob, x []float32, qlo, qhi int) {
	return func(j *tensorJob, x []float32, qlo, qhi int) {
		scale, codes := float32(j.l.s.Scale), j.codes[qlo:qhi]
		top, n := f.decode[f.maxCode], int64(0)
		for i, v := range x[:len(codes)] {
			y := v / scale
			if y > top || y < -top {
				n++
			}
			codes[i] = f.encode(y)
		}
		j.saturated.Add(n)
	}
}

func decodeFP8All(f *fp8Format) func(j *tensorJob, y []float32, qlo, qhi int) {
	return func(j *tensorJob, y []float32, qlo, qhi int) {
		scale, codes := float32(j.l.s.Scale), j.codes[qlo:qhi]
		for i, c := range codes {
			y[i] = f.decode[c] * scale
		}
	}
}

// A perHeadCode is how a per-token-head format writes and reads one code:
// int8 (codes rounded half away from zero) or fp8 e4m3.
type perHeadCode struct {
	qmax, qmin float32
	int8       bool
}

var (
	perHeadInt8 = perHeadCode{qmax: 127, qmin: -128, int8: true}
	perHeadFP8  = perHeadCode{qmax: 448, qmin: -448}
)

// perHeadQuantizer writes one head vector x: its codes, then its float32
// scale (little-endian), as the Triton kernel does; it reports a NaN or
// an Inf.
func perHeadQuantizer(p perHeadCode) func(x []float32, dst []byte) bool {
	return func(x []float32, dst []byte) bool {
		var top uint32 // the largest |x| as float32 bits (they order as the magnitudes; NaN above Inf)
		for _, v := range x {
			top = max(top, math.Float32bits(v)&0x7fffffff)
		}
		nonFinite := top >= 0x7f800000
		scale := max(math.Float32frombits(top)/p.qmax, 1e-6)
		inv := 1 / scale
		codes := dst[:len(x)]
		if p.int8 {
			for i, v := range x {
				q := float32(v * inv) // rounded before 0.5 is added: no fused multiply-add
				// ±0.5 by q's sign (the kernel's q >= 0 ? q + 0.5 : q - 0.5; a -0 gives code 0
				// either way), then the clamp and the store's truncation
				q += math.Float32frombits(math.Float32bits(q)&0x80000000 | 0x3f000000)
				if q > 127 {
					q = 127
				} else if q < -128 {
					q = -128
				}
				codes[i] = uint8(int8(q))
			}
		} else {
			for i, v := range x {
				codes[i] = fp8E4M3.encode(min(max(float32(v*inv), -448), 448))
			}
		}
		binary.LittleEndian.PutUint32(dst[len(x):], math.Float32bits(scale))
		return nonFinite
	}
}

func perHeadDequantizer(p perHeadCode) func(src []byte, dst []float32) {
	return func(src []byte, dst []float32) {
		scale := math.Float32frombits(binary.LittleEndian.Uint32(src[len(dst):]))
		codes := src[:len(dst)]
		if p.int8 {
			for i, c := range codes {
				dst[i] = float32(int8(c)) * scale
			}
			return
		}
		for i, c := range codes {
			dst[i] = fp8E4M3.decode[c] * scale
		}
	}
}
