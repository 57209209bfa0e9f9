package compression

import (
	"math"

	"kvlib/pkg/safetensors"
)

// TensorRT-LLM's 8-bit KV caches, as its C++ AttentionOp writes them (the
// same kernels under the PyTorch backend and the TensorRT engine; read
// through the source index, not at the 1.2.1 tag, which could not be
// fetched here: docs/research/tensorrt-llm-1.2.1-kv-formats.md says which
// commits and what varies).
//
// fp8 (kv_cache_config.dtype="fp8", QuantAlgo.FP8): the context writer
// applyBiasRopeUpdateKVCache[V2] (kernels/unfusedAttentionKernels/
// unfusedAttentionKernels_2_template.h) with store_8bits_kv_cache_vec
// (kernels/decoderMaskedMultiheadAttentionUtils.h): the multiplier
// s = kv_scale_orig_quant[0] (the reciprocal of the dequantisation scale,
// torch.reciprocal in float32) rounded to the model's dtype T, the value
// times it rounded to T (mul.f16x2 / __hmul2; in float32 for a float32
// model), then cvt.rn.satfinite.e4m3: round to nearest even, saturating
// at ±448. The PyTorch backend keeps the scale at 1.0 and ignores a
// checkpoint's (TrtllmAttention: kv_cache_scaling_factor = ones(1)), so the
// flag alone writes E4M3(x); the TensorRT engine takes one scale per
// layer, max(k_scale, v_scale) of the checkpoint (layers/attention.py
// Attention.postprocess), which /scaleS is (kvlib's calibrated scales take
// that maximum too: shared_scale). The read is the code times the scale
// (float32).
//
// int8 (the TensorRT engine's QuantAlgo.INT8; the PyTorch backend refuses
// it): y = float32(x) × float32(1/scale) in float32, not rounded to T, then
// cvt.rni.sat.s8.f32: round to nearest even (2.5 → 2), saturating at -128
// and 127 (NaN → 0); the read is code × scale.
var trtllm = &engine{
	name:    "trtllm",
	version: "TensorRT-LLM 1.2.1 (its C++ kernels, read through the source index; the 1.2.1 tag could not be fetched)",
	flag:    "kv_cache_config.dtype=%s",
	blockRule: "kvlib refuses TensorRT-LLM's %[1]s for head_dim %[2]d: its blocks of %[3]d elements, one E4M3 scale each, " +
		"must divide the head (quantizeAndWriteFP4KVCache writes head_dim/16 scales per head vector)",
	detail: func(f *engineFormat) string {
		if f.quantizeScaled != nil {
			return "read: from TensorRT-LLM's C++ kernels as the source index holds them (commits in docs/research/" +
				"tensorrt-llm-1.2.1-kv-formats.md; no 1.2.1 wheel or tag could be fetched here); tests/trtllm_reference.py pins " +
				"the codec bit for bit; the kernels need a Blackwell GPU and have not run here: rcp.approx results are taken as " +
				"IEEE reciprocals and the guard as @2a0ce833's vecMax != 0 [unverified]"
		}
		return "read: from TensorRT-LLM's C++ kernels as the source index holds them (commits in docs/research/" +
			"tensorrt-llm-1.2.1-kv-formats.md; no 1.2.1 wheel or tag could be fetched here); tests/trtllm_reference.py pins " +
			"the codec bit for bit, its float8 cast checked against torch's; the kernels need CUDA and have not run here"
	},
	formats: []*engineFormat{
		{name: "fp8", bits: 8, elems: 1, bytes: 1, scaled: true, scaleMax: 448, kvScale: true, evidence: EvidenceRead,
			source:    "kernels/unfusedAttentionKernels/unfusedAttentionKernels_2_template.h (applyBiasRopeUpdateKVCache[V2]); kernels/decoderMaskedMultiheadAttentionUtils.h (store_8bits_kv_cache_vec)",
			encodeAll: encodeTRTFP8All, decodeAll: decodeFP8All(fp8E4M3)},
		{name: "int8", bits: 8, elems: 1, bytes: 1, scaled: true, scaleMax: 127, kvScale: true, evidence: EvidenceRead,
			flags:     "quant_config.kv_cache_quant_algo=INT8 (TensorRT engine backend)",
			source:    "kernels/decoderMaskedMultiheadAttentionUtils.h (store_8bits_kv_cache_vec, int8_t: cvt.rni.sat.s8.f32); layers/attention.py (Attention.postprocess)",
			encodeAll: encodeTRTInt8All, decodeAll: decodeTRTInt8All},
		trtllmNVFP4,
	},
}

// trtllmNVFP4 is TensorRT-LLM's NVFP4 KV cache (kv_cache_config.dtype="nvfp4",
// QuantAlgo.NVFP4; ModelOpt's scales), the arithmetic in nvfp4.go,
// read through the source index (docs/research/tensorrt-llm-1.2.1-kv-
// formats.md section 3, which names the commits): the context writer
// applyBiasRopeUpdateKVCache[V2] calls quantizeAndWriteFP4KVCache
// (kernels/unfusedAttentionKernels/unfusedAttentionKernels_2_template.h),
// which runs cvt_warp_fp16_to_fp4<T, 16, false> (kernels/quantization.cuh)
// on 8 values per thread, the pair's max shared by __shfl_xor_sync (exact),
// with kSecondLevelSF = qkv_scale_orig_quant[1] for K and [2] for V: the
// attention's inv_kv_scales = 1.0 / kv_scales, kv_scales = [1, k_s, v_s]
// (fp32, default ones; _torch/modules/linear.py), one global scale per
// layer for K and another for V, not shared. kvlib's /scaleS is k_s (or
// v_s): default 1, a calibrated one amax / 2688 (ModelOpt's "calibrated
// KV scales are amax/(6*448)"); whether 1.2.1 loads a checkpoint's scales
// by default (TRTLLM_LOAD_KV_SCALES) and multiplies them by 6 differs
// between the two versions of linear.py the index holds [unverified]:
// /scaleS is the k_s the kernel ends up with either way. The read
// (trtllm-gen attention) is E2M1 × E4M3 scale, with k_s in its bmm
// scales.
//
// Where it differs from vLLM's nvfp4: the guard is vecMax != 0
// (quantization.cuh @2a0ce833; @0193dbd4 has SFValue != 0 on the
// unconverted scale, which differs from it only when g·vecMax/6 underflows
// to 0): a block whose SF is below E4M3's smallest subnormal (SF <= 2^-10,
// e.g. max |x| < 6·2^-10 at scale 1) gets scale byte 0 and output scale
// rcp(0) = +Inf, so its nonzero elements store ±6 and its zeros 0·Inf =
// NaN (0x7 here [unverified]); it reads back as zeros all the same. And
// rcp.approx.ftz(6.0f) is an asm volatile, computed at run time by
// MUFU.RCP, not folded: kvlib takes 0x3E2AAAAB, the IEEE value that
// vLLM's build folds [unverified]. The writer requires a 16-bit model
// dtype (ENABLE_4BITS_CACHE: sizeof(T) == 2) and, per the research note,
// a head size that is a power of two up to 256 (not verified here, not
// refused: kvlib refuses only head_dim % 16 != 0, which its blocks need);
// an F32 cache goes through the same float32 arithmetic. Layout (storage
// only): codes [num_kv_heads][tokens_per_block][D/2] per K or V half of a
// block, scales in a pool of their own, K linear, V interleaved by 4
// tokens ((T/4)·4·N + j·4 + T%4, N = D/16).
var trtllmNVFP4 = &engineFormat{name: "nvfp4", bits: 4, elems: nvfp4Block, bytes: nvfp4Bytes, scaled: true, scaleMax: nvfp4ScaleMax, evidence: EvidenceRead,
	flags: "kv_cache_config.dtype=nvfp4 (or a checkpoint's kv_cache_quant_algo NVFP4)",
	source: "kernels/unfusedAttentionKernels/unfusedAttentionKernels_2_template.h (quantizeAndWriteFP4KVCache); " +
		"kernels/quantization.cuh (cvt_warp_fp16_to_fp4, @2a0ce833); _torch/modules/linear.py (kv_scales, inv_kv_scales)",
	quantizeScaled: nvfp4TRTLLM.quantize, dequantizeScaled: nvfp4Dequantize,
	quantizeRun: nvfp4TRTLLM.quantizeRun, dequantizeRun: nvfp4DequantizeRun}

// encodeTRTFP8All: the multiplier rounded to the cache's dtype, the
// product rounded to it, then the satfinite E4M3 conversion.
func encodeTRTFP8All(j *tensorJob, x []float32, qlo, qhi int) {
	codes := j.codes[qlo:qhi]
	round := dtypeRounding(j.dtype)
	s := round(float32(1) / float32(j.l.s.Scale))
	if j.dtype == safetensors.F32 || s == 1 {
		// round(v·s) is float32(v·s): the dtype's rounding is none for a
		// float32 cache, and v·1 is v, already of the dtype (x holds the
		// cache's own values: an engine format takes no outlier or sparsity
		// stage, and TensorRT-LLM rotates nothing)
		j.saturated.Add(fp8E4M3.encodeCount(codes, x[:len(codes)], s))
		return
	}
	top, n := fp8E4M3.decode[fp8E4M3.maxCode], int64(0)
	for i, v := range x[:len(codes)] {
		y := round(v * s)
		if y > top || y < -top {
			n++
		}
		codes[i] = fp8E4M3.encode(y)
	}
	j.saturated.Add(n)
}

// encodeTRTInt8All: float32 product, round to nearest even, saturate.
func encodeTRTInt8All(j *tensorJob, x []float32, qlo, qhi int) {
	codes := j.codes[qlo:qhi]
	s := float32(1) / float32(j.l.s.Scale)
	n := int64(0)
	for i, v := range x[:len(codes)] {
		r := math.RoundToEven(float64(float32(v * s)))
		switch {
		case math.IsNaN(r):
			r = 0
		case r > 127:
			r, n = 127, n+1
		case r < -128:
			r, n = -128, n+1
		}
		codes[i] = uint8(int8(r))
	}
	j.saturated.Add(n)
}

func decodeTRTInt8All(j *tensorJob, y []float32, qlo, qhi int) {
	scale := float32(j.l.s.Scale)
	for i, c := range j.codes[qlo:qhi] {
		y[i] = float32(int8(c)) * scale
	}
}
