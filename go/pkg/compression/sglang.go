package compression

import (
	"math"

	"kvlib/pkg/safetensors"
)

// SGLang's FP8 KV-cache formats (--kv-cache-dtype fp8_e4m3, fp8_e5m2), as
// SGLang 0.5.10.post1 writes them (the wheel
// sglang-0.5.10.post1-py3-none-any; paths relative to its sglang/ package;
// it requires torch==2.9.1).
//
// The write, MHATokenToKVPool.set_kv_buffer (srt/mem_cache/memory_pool.py:
// 995-1032), for the flashinfer, fa3 and triton backends: when the layer
// has a k_scale (a quantized checkpoint's; srt/layers/quantization/
// kv_cache.py:47-81, 1.0 when it names none), cache_k.div_(k_scale) in the
// model's dtype: k_scale is a 0-dim float32 Parameter on the GPU, which
// CUDA's division kernel loads as the cache's dtype (torch 2.9.1's
// ATen/native/cuda/Loops.cuh:195-197, DivFunctor<scalar_t>), so the scale
// is rounded to that dtype and the quotient computed in float32 and
// rounded to it; an unquantized checkpoint has no k_scale
// (srt/layers/radix_attention.py:83-92) and nothing is divided. Then a
// plain torch cast, .to(torch.float8_e4m3fn) or .to(torch.float8_e5m2):
// torch 2.9.1's fp8e4m3fn_from_fp32_value and fp8e5m2_from_fp32_value
// (torch/headeronly/util/Float8_e4m3fn.h:170-232, Float8_e5m2.h), round to
// nearest even and NOT saturating: an e4m3 value past 464 (or Inf) becomes
// NaN, an e5m2 value from 61440 on becomes Inf. kv-compress keeps those, as
// the engine does, and counts them (non_finite). torch 2.12 on saturates
// e4m3 to 448 instead (pytorch#178817), on CPU and GPU alike: SGLang on a
// later torch than it requires would write 0x7e there. The read multiplies
// by the scale (float32), inside the attention kernels; the torch_native
// backend writes without a scale and reads with a cast to the query's
// dtype (srt/layers/attention/torch_native_backend.py:117-190).
// tests/test_sglang_formats.py runs SGLang's own set_kv_buffer and that
// read (tests/third_party/, verbatim) on the vector caches and the CLI's.
// Not modelled: the fused Triton writer of the trtllm_mha backend
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
		d := "executed: SGLang's own MHATokenToKVPool.set_kv_buffer and _set_kv_buffer_impl (srt/mem_cache/memory_pool.py:" +
			"89-123, 967-1032, verbatim in tests/third_party/sglang_memory_pool.py: the division by k_scale, .to(float8), the " +
			"uint8 store) ran under torch 2.13 on the CPU on every vector case (F32, F16, BF16; head_dim 64, 128, 256; a " +
			"checkpoint scale; values past the range) and on caches the CLI compressed (scales that push values past the " +
			"range too), and wrote kv-compress's bytes; its scale was handed over in the cache's dtype, as the GPU's division " +
			"kernel reads the float32 k_scale (the CPU's divides by the float32 value: other bytes, measured). "
		if f.name == "fp8_e4m3" {
			d += "Past 464 torch 2.13 saturates to 448 where torch 2.9.1, which SGLang requires, gives NaN (its " +
				"fp8e4m3fn_from_fp32_value, read in the 2.9.1 wheel's headers; pytorch#178817 changed it): kv-compress " +
				"writes NaN, and the test checks those bytes are exactly the values past 464. "
		} else {
			d += "torch 2.9.1's e5m2 cast is 2.13's (Inf from 61440 on, read in both wheels' headers). "
		}
		return d + "The pool's get_key_buffer and, unscaled, the torch_native backend's decode read (torch_native_backend.py:" +
			"117-190, verbatim) read kv-compress's bytes back as it reconstructs them. Not run: SGLang on a GPU (torch " +
			"2.9.1, the store_cache JIT copy), and the flashinfer, fa3 and triton attention kernels that read the cache and " +
			"multiply by the scale"
	},
	formats: []*engineFormat{
		{name: "fp8_e4m3", bits: 8, elems: 1, bytes: 1, scaled: true, scaleMax: 448, evidence: EvidenceExecuted,
			source:    "srt/mem_cache/memory_pool.py:995-1032 (set_kv_buffer: div_, .to); torch 2.9.1 c10/util/Float8_e4m3fn.h",
			encodeAll: encodeTorchFP8All(fp8E4M3), decodeAll: decodeFP8All(fp8E4M3)},
		{name: "fp8_e5m2", bits: 8, elems: 1, bytes: 1, scaled: true, scaleMax: 57344, evidence: EvidenceExecuted,
			source:    "srt/mem_cache/memory_pool.py:995-1032 (set_kv_buffer: div_, .to); torch 2.9.1 c10/util/Float8_e5m2.h",
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

// torchOverflow is where torch's cast and encode part: from these float32
// magnitude bits on (a value that rounds past the largest finite one:
// e4m3fn past 464, 448's halfway to 480, a tie going to 448; e5m2 from
// 61440, 57344's halfway to 65536, a tie going to Inf) torch stores code
// (e4m3fn's NaN, e5m2's Inf) with the sign where encode saturates.
func (f *fp8Format) torchOverflow() (bits uint32, code uint8) {
	if f == fp8E4M3 {
		return 0x43e80001, 0x7f
	}
	return 0x47700000, 0x7c
}

// encodeTorchFP8All is set_kv_buffer on a chunk: with a scale other than
// 1, the division in the cache's dtype; then torch's cast.
func encodeTorchFP8All(f *fp8Format) func(j *tensorJob, x []float32, qlo, qhi int) {
	return func(j *tensorJob, x []float32, qlo, qhi int) {
		scale, codes := float32(j.l.s.Scale), j.codes[qlo:qhi]
		round := dtypeRounding(j.dtype)
		s := round(scale)
		x = x[:len(codes)]
		m := 0
		if useSIMD && (scale == 1 || j.dtype == safetensors.F32) {
			// v/s by the division kernel into a scratch (no dtype rounding
			// for a float32 cache), the format's saturating kernel, then
			// torch's cast where they differ (torchOverflow)
			var buf [1024]float32
			for m+32 <= len(x) {
				y := buf[:min(len(buf), (len(x)-m)&^31)]
				copy(y, x[m:])
				if scale != 1 {
					divAVX2(y, s)
				}
				c := codes[m : m+len(y)]
				c = c[:f.encodeKernel(c, y, 1)]
				over, code := f.torchOverflow()
				for i, v := range y[:len(c)] {
					if u := math.Float32bits(v); u&0x7fffffff >= over {
						c[i] = uint8(u>>24)&0x80 | code
						if u&0x7fffffff > 0x7f800000 {
							c[i] |= 0x7f // a NaN: the NaN code, signed
						}
					}
				}
				m += len(y)
			}
		}
		for i, v := range x[m:] {
			if scale != 1 {
				v = round(v / s)
			}
			codes[m+i] = f.encodeTorch(v)
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
