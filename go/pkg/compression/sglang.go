package compression

import (
	"math"

	"kvlib/pkg/safetensors"
)

// SGLang's FP8 KV-cache formats (--kv-cache-dtype fp8_e4m3, fp8_e5m2), as
// SGLang 0.5.10.post1 writes them (the wheel
// sglang-0.5.10.post1-py3-none-any; paths relative to its sglang/ package;
// it pins torch 2.9.1).
//
// The write, MHATokenToKVPool.set_kv_buffer (srt/mem_cache/memory_pool.py:
// 995-1030), for the flashinfer, fa3 and triton backends: when the layer
// has a k_scale (a quantized checkpoint's; srt/layers/quantization/
// kv_cache.py:47-81, 1.0 when it names none), cache_k.div_(k_scale) in the
// model's dtype (the scale rounded to that dtype, the quotient computed in
// float32 and rounded to it); an unquantized checkpoint has no k_scale
// (srt/layers/radix_attention.py:83-92) and nothing is divided. Then a
// plain torch cast, .to(torch.float8_e4m3fn) or .to(torch.float8_e5m2):
// c10's fp8e4m3fn_from_fp32_value and fp8e5m2_from_fp32_value
// (c10/util/Float8_e4m3fn.h, Float8_e5m2.h), round to nearest even and NOT
// saturating: an e4m3 value past 464 becomes NaN, an e5m2 value from 61440
// on becomes Inf. kv-compress keeps those, as the engine does, and counts
// them (non_finite). The read multiplies by the scale (float32).
// tests/test_sglang_formats.py runs torch's own division and cast on the
// same caches: the bytes agree, except that this CPU build of torch (2.13)
// saturates e4m3 values past 464, where the CUDA conversion above gives
// NaN. Not modelled: the fused Triton writer of the trtllm_mha backend
// (Blackwell, e4m3 only), which saturates (srt/layers/attention/
// trtllm_fp8_kv_kernel.py:71-74). fp4_e2m1 is in kvfp4.go.
var sglang = &engine{
	name:    "sglang",
	version: "SGLang 0.5.10.post1 (wheel)",
	flag:    "--kv-cache-dtype %s",
	blockRule: "kvlib refuses SGLang's %[1]s for head_dim %[2]d: SGLang's blocks of %[3]d run along each token's " +
		"[heads × head_dim] row (srt/layers/quantization/kvfp4_tensor.py:43-45) and would straddle two heads, which kvlib's " +
		"per-head layout cannot hold",
	detail: func(f *engineFormat) string {
		if f.name == "fp4_e2m1" {
			return "executed: SGLang's own kvfp4_tensor.py (the wheel's file, pure torch) ran on CPU on the vector inputs " +
				"(tests/make_engine_vectors.py) and tests/vectors/engine_vectors.json holds its bytes, which the codec reproduces; " +
				"compiled on CUDA it may differ from the CPU run only for a float32 block max within a few ulp above 6·2^k"
		}
		return "read, and run where torch can run it: the write is torch's (a division in the cache's dtype, then " +
			".to(float8)); tests/test_sglang_formats.py runs that on the same caches with this CPU torch and agrees byte " +
			"for byte except past e4m3's range, where CPU torch 2.13 saturates and the CUDA cast SGLang runs (c10, read) " +
			"gives NaN; SGLang's own Python was read (files cited), not run (its wheel needs CUDA)"
	},
	formats: []*engineFormat{
		{name: "fp8_e4m3", bits: 8, elems: 1, bytes: 1, scaled: true, scaleMax: 448, evidence: EvidenceRead,
			source:    "srt/mem_cache/memory_pool.py:995-1030 (set_kv_buffer: div_, .to); c10/util/Float8_e4m3fn.h",
			encodeAll: encodeTorchFP8All(fp8E4M3), decodeAll: decodeFP8All(fp8E4M3)},
		{name: "fp8_e5m2", bits: 8, elems: 1, bytes: 1, scaled: true, scaleMax: 57344, evidence: EvidenceRead,
			source:    "srt/mem_cache/memory_pool.py:995-1030 (set_kv_buffer: div_, .to); c10/util/Float8_e5m2.h",
			encodeAll: encodeTorchFP8All(fp8E5M2), decodeAll: decodeFP8All(fp8E5M2)},
		{name: "fp4_e2m1", bits: 4, elems: kvfp4Block, bytes: kvfp4Bytes, evidence: EvidenceExecuted,
			source:   "srt/layers/quantization/kvfp4_tensor.py:32-112 (KVFP4QuantizeUtil); srt/mem_cache/memory_pool.py:1084-1225 (MHATokenToKVPoolFP4)",
			quantize: sglangQuantizeFP4, dequantize: sglangDequantizeFP4},
	},
}

// encodeTorch converts y as torch's cast to the format does: round to
// nearest even; e4m3fn, which has no infinity, gives NaN (0x7f, signed)
// past its largest value and for NaN and Inf; e5m2 gives Inf (0x7c,
// signed) from 61440 on (the rounding carries), NaN for NaN.
func (f *fp8Format) encodeTorch(y float32) uint8 {
	u := math.Float32bits(y)
	sign, a := uint8(u>>24)&0x80, u&0x7fffffff
	if a > 0x7f800000 {
		return sign | 0x7f
	}
	top := uint32(f.maxCode) + 1 // e4m3fn: 0x7f, NaN; e5m2: 0x7c, Inf
	return sign | uint8(min(f.rounded(a), top))
}

// encodeTorchFP8All is set_kv_buffer on a chunk: with a scale other than
// 1, the division in the cache's dtype; then torch's cast.
func encodeTorchFP8All(f *fp8Format) func(j *tensorJob, x []float32, qlo, qhi int) {
	return func(j *tensorJob, x []float32, qlo, qhi int) {
		scale, codes := float32(j.l.s.Scale), j.codes[qlo:qhi]
		round := dtypeRounding(j.dtype)
		s := round(scale)
		for i, v := range x[:len(codes)] {
			if scale != 1 {
				v = round(v / s)
			}
			codes[i] = f.encodeTorch(v)
		}
	}
}

// dtypeRounding rounds a float32 to the source dtype, as a tensor of that
// dtype holds the result of an operation on it (round to nearest even).
func dtypeRounding(dt safetensors.DType) func(float32) float32 {
	switch dt {
	case safetensors.BF16:
		return func(v float32) float32 { return safetensors.BF16ToFloat32(safetensors.Float32ToBF16(v)) }
	case safetensors.F16:
		return rn16 // the fp16 round trip (exllamav2.go)
	}
	return func(v float32) float32 { return v }
}
