package compression

import "math"

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
	detail: func(*engineFormat) string {
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
	},
}

// encodeTRTFP8All: the multiplier rounded to the cache's dtype, the
// product rounded to it, then the satfinite E4M3 conversion.
func encodeTRTFP8All(j *tensorJob, x []float32, qlo, qhi int) {
	codes := j.codes[qlo:qhi]
	round := dtypeRounding(j.dtype)
	s := round(float32(1) / float32(j.l.s.Scale))
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
