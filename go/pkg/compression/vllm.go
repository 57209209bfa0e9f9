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
// the largest. The read multiplies by the scale (float32). The Triton
// attention backend writes with triton_reshape_and_cache_flash
// (v1/attention/ops/triton_reshape_and_cache_flash.py:377-482): the same
// division and a saturating conversion, but into a cache it views as
// current_platform.fp8_dtype(), float8_e4m3fn, whatever the flag
// (v1/attention/backends/triton_attn.py:542, 826-831): its fp8_e5m2 bytes
// are e4m3 codes, not modelled (tests/vllm_triton_harness.py runs it).
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
// tests/vllm_triton_harness.py runs the launcher and kernel (verbatim) in
// Triton's interpreter on the vector caches: int8 is executed; fp8's
// codes take torch's e4m3 cast there, the interpreter's not being the
// GPU's, so its conversion stays read.
var vllm = &engine{
	name:    "vllm",
	version: "vLLM 0.33.0 (wheel, commit 4ba787ec9)",
	flag:    "--kv-cache-dtype %s",
	blockRule: "vLLM refuses %[1]s for head_dim %[2]d: its blocks of %[3]d elements must divide head_size " +
		"(csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu: \"head_size must be divisible by 16 for NVFP4 KV cache\")",
	detail: func(f *engineFormat) string {
		if f.quantizeScaled != nil {
			return "read, and checked against the binary: the CUDA kernel's source (file cited, from the source index) and the " +
				"0.33.0 wheel's SM100 SASS of reshape_and_cache_nvfp4_kernel (cuobjdump: rcp(6) = 0x3E2AAAAB, the E2M1 thresholds, " +
				"the FFMA contractions); tests/vllm_reference.py pins the codec bit for bit; no CUDA or Triton writer ran (no GPU " +
				"here): rcp.approx results are taken as IEEE reciprocals [unverified]"
		}
		if f.role != "" { // a TurboQuant half
			d := "executed: vLLM's own TurboQuant store (triton_turboquant_store: torch's norm and rotation GEMM on the CPU, its " +
				"Triton kernels in Triton's interpreter) and read (_tq_full_dequant_kv), verbatim in tests/third_party/, ran on " +
				"every TurboQuant vector cache (tests/vllm_turboquant_harness.py) and gave kv-compress's bytes and reads bit for " +
				"bit; the centroid tables are vLLM's solver's output, the boundary layers its get_boundary_skip_layers. Not run: a " +
				"GPU (cuBLAS's and its reductions' summation orders, div.full.f32)"
			if f == tqKeyFP8 {
				d = "read for the keys: Triton's fp32 -> float8e4nv conversion is the GPU's (SM90+: cvt.rn.satfinite), which the " +
					"interpreter does not reproduce; checked against torch's float8_e4m3fn cast after a clamp to 448. The values: " + d
			}
			return d
		}
		switch f.name {
		case "int8_per_token_head":
			return "executed: vLLM's own writer (triton_reshape_and_cache_flash_per_token_head_quant and its Triton kernel " +
				"_reshape_cache_per_token_head, verbatim in tests/third_party/vllm_per_token_head.py) ran in Triton 3.8.0's " +
				"interpreter (TRITON_INTERPRET=1, CPU) on every vector tensor of the format (tests/vllm_triton_harness.py) " +
				"and gave kv-compress's bytes, codes and float32 scales, bit for bit. Not run: the read (fused in vLLM's " +
				"attention kernel) and a GPU (div.full.f32; whether it contracts x*(1/scale) +- 0.5 into an fma)"
		case "fp8_per_token_head":
			return "read for the codes' fp32 -> e4m3 conversion, the rest executed: vLLM's own writer (" +
				"triton_reshape_and_cache_flash_per_token_head_quant, _reshape_cache_per_token_head; tests/third_party/" +
				"vllm_per_token_head.py, verbatim) ran in Triton 3.8.0's interpreter on every vector tensor of the format " +
				"(tests/vllm_triton_harness.py) and gave kv-compress's bytes, bit for bit, with the store's conversion of the " +
				"clamped codes made torch's float8_e4m3fn cast (SM89+'s cvt.rn.satfinite): the interpreter's own cast rounds " +
				"half up and drops carries (149 of the 8,832 code bytes otherwise). Not run: the read (fused in vLLM's " +
				"attention kernel) and a GPU (div.full.f32)"
		case "int4_per_token_head":
			return "executed: vLLM's own write path (reshape_and_cache_int4: its torch RHT, then the Triton kernel " +
				"_reshape_cache_int4_kernel; tests/third_party/vllm_int4_store.py and vllm_int4_rht.py, verbatim) ran in " +
				"Triton 3.8.0's interpreter on every vector tensor of the format (tests/vllm_triton_harness.py): every " +
				"scale word and all but 2 of the 9,920 codes are kv-compress's; those 2 are where the interpreter's unfused " +
				"x*(1/scale) + zp rounds onto a tie that the fma the GPU computes (Triton's default fp fusion, kv-compress's " +
				"arithmetic) does not reach, each recomputed both ways. vLLM's inverse single_rht gives kv-compress's restored " +
				"F32 caches. Not run: the read (fused in vLLM's attention kernel) and a GPU (hadacore or the Triton Hadamard " +
				"through bfloat16, div.full.f32)"
		}
		d := "read: from the pinned source (file cited); tests/vllm_reference.py, the NumPy reference written from it, pins the " +
			"codec bit for bit (tests/vectors/engine_vectors.json), its float8 casts checked against torch's; vLLM's CUDA " +
			"writer has not run on these bytes (no GPU here). The Triton backend's writer (triton_reshape_and_cache_flash, " +
			"verbatim in tests/third_party/vllm_reshape_and_cache_flash.py) ran in Triton 3.8.0's interpreter on every vector " +
			"tensor of the format (tests/vllm_triton_harness.py), its fp32 -> e4m3 conversion made torch's cast after the " +
			"clamp (SM89+'s cvt.rn.satfinite; the interpreter's own is not the GPU's), "
		if f.name == "fp8_e5m2" {
			return d + "and wrote the e4m3 codes of x/scale: that backend views an fp8_e5m2 cache as float8_e4m3fn; " +
				"kv-compress writes e5m2 as FlashInfer's CUDA writer does"
		}
		return d + "and gave kv-compress's bytes: its division executed, the conversion read"
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
		{name: "int8_per_token_head", bits: 8, perHead: true, evidence: EvidenceExecuted,
			source:     "v1/attention/ops/triton_reshape_and_cache_flash.py:168-283 (_reshape_cache_per_token_head, IS_INT_QUANT)",
			quantize:   perHeadQuantizer(perHeadInt8),
			dequantize: perHeadDequantizer(perHeadInt8)},
		{name: "fp8_per_token_head", bits: 8, perHead: true, evidence: EvidenceRead,
			source:     "v1/attention/ops/triton_reshape_and_cache_flash.py:168-283 (_reshape_cache_per_token_head, FP8_MAX 448)",
			quantize:   perHeadQuantizer(perHeadFP8),
			dequantize: perHeadDequantizer(perHeadFP8)},
		vllmInt4,
		vllmNVFP4, vllmNVFP4FourOverSix,
		tqKeyFP8, tqKey4, tqKey3, tqVal4, tqVal3, // listed as their combos, the TurboQuant presets
	},
	combos: tqCombos,
	unregistered: map[string]string{
		"ultraquant_4bit": ultraquantUnavailable,
	},
}

// vllmNVFP4 is vLLM 0.33.0's --kv-cache-dtype nvfp4 (nvfp4_4over6 below;
// the arithmetic shared with TensorRT-LLM is in nvfp4.go).
//
// The writer on SM100 (FlashInfer backend, v1/attention/backends/
// flashinfer.py) is the CUDA kernel reshape_and_cache_nvfp4_kernel
// (csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu, read through the source
// index; the wheel has no CUDA source) over cvt_warp_fp16_to_fp4
// (csrc/libtorch_stable/quantization/fp4/nvfp4_utils.cuh): one thread per
// 16 elements of a head vector (NVFP4_ENABLE_ELTS16), the global scale
// 1.0f / *k_scale_ptr (the layer's _k_scale or _v_scale: the checkpoint's,
// or 1.0, model_executor/layers/quantization/kv_cache.py:117-169; no
// dynamic scale), the recipe's guard on the converted scale (float(sf) !=
// 0: a block whose SF rounds to E4M3 zero stores zero codes). kvlib's
// /scaleS is k (default 1, the flag alone); a calibrated k is amax / 2688.
// The kernel refuses head_size % 16 != 0 ("head_size must be divisible by
// 16 for NVFP4 KV cache"); it dispatches fp16 and bf16 caches only
// (VLLM_STABLE_DISPATCH_HALF_TYPES): an F32 cache goes through the same
// float32 arithmetic here, as the kernel would on those values.
//
// Not modelled: SM80/90/120, where vLLM writes nvfp4 through FlashInfer
// 0.7.2.post1's nvfp4_quantize_append_paged_kv_cache_with_slot_mapping,
// not read.
//
// Layout (storage only; kvlib keeps [8 code bytes | scale byte] per
// block): a page is [K_data | K_scale | V_data | V_scale] (utils/
// torch_utils.py:542-544, head_size/2 + head_size/16 bytes per token and
// head); K scales are linear, V scales are written in the 4×4 swizzle of
// the SM100 trtllm-gen kernels, swizzled_t = (t/4)*4 + s/(S/4),
// swizzled_s = (s%(S/4))*4 + t%4 (swizzle_scale_offset), which moves
// bytes, not values.
var vllmNVFP4 = &engineFormat{name: "nvfp4", bits: 4, elems: nvfp4Block, bytes: nvfp4Bytes, scaled: true, scaleMax: nvfp4ScaleMax, evidence: EvidenceRead,
	source: "csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu (reshape_and_cache_nvfp4_dispatch, reshape_and_cache_nvfp4_kernel DEFAULT); " +
		"csrc/libtorch_stable/quantization/fp4/nvfp4_utils.cuh (cvt_warp_fp16_to_fp4); checked against the wheel's SM100 SASS",
	quantizeScaled: nvfp4VLLM.quantize, dequantizeScaled: nvfp4Dequantize,
	quantizeRun: nvfp4VLLM.quantizeRun, dequantizeRun: nvfp4DequantizeRun}

// vllmNVFP4FourOverSix is vLLM 0.33.0's --kv-cache-dtype nvfp4_4over6
// (NVFP4KVScaleSearch::FOUR_OVER_SIX, "selects between max/6
// and max/4 scales per 16 values by minimizing squared reconstruction
// error", config/cache.py): a second candidate with vecMax * 0.25 in
// place of vecMax * rcp(6); each candidate's error is summed over the 8
// pairs of the block with round_to_nearest_e2m1, and the /4 one is kept
// only when its error is strictly smaller (ties keep /6). In 0.33.0 that
// helper rounds with the thresholds of round to nearest even (<= 0.25,
// < 0.75, <= 1.25, < 1.75, <= 2.5, < 3.5, <= 5), the same as the stored
// codes: one version of the file in the source index has half-up
// thresholds (< 0.25, < 0.75, < 1.25, ...) and a third mode,
// nvfp4_4over6_k_only, but the wheel's _C_stable_libtorch.abi3.so has no
// such mode and its SM100 code compares |v| > 0.25, >= 0.75, > 1.25,
// >= 1.75, > 2.5, >= 3.5, > 5 (FSETP.GTU/GEU). The binary also fixes what
// the source leaves to the compiler: rcp(6) folded to 0x3E2AAAAB, the
// global scale an IEEE division, the error's multiply-adds contracted into
// FFMAs (fourSixError), no shuffle (one thread holds the 16 values).
// Not verified: rcp.approx results (nvfp4.go), which can also move a
// near-tie between the two candidates' errors. Otherwise as nvfp4
// (scales, refusals, layout); nvfp4_4over6 runs on SM100 only
// (flashinfer.py:655-658 refuses it on SM80/90/120).
var vllmNVFP4FourOverSix = &engineFormat{name: "nvfp4_4over6", bits: 4, elems: nvfp4Block, bytes: nvfp4Bytes, scaled: true, scaleMax: nvfp4ScaleMax, evidence: EvidenceRead,
	source: "csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu (cvt_warp_fp16_to_fp4_4over6, nvfp4_candidate_scale, " +
		"nvfp4_reconstruction_error, round_to_nearest_e2m1; FOUR_OVER_SIX); config/cache.py (the dtype's docstring); checked against the wheel's SM100 SASS",
	quantizeScaled: nvfp4VLLM4over6.quantize, dequantizeScaled: nvfp4Dequantize,
	quantizeRun: nvfp4VLLM4over6.quantizeRun, dequantizeRun: nvfp4DequantizeRun}

// An fp8Format is one of the OCP 8-bit float formats, as NVIDIA's
// satfinite conversion writes it.
type fp8Format struct {
	mant, bias int   // mantissa bits, exponent bias
	maxCode    uint8 // the largest finite magnitude's code (448: 0x7e; 57344: 0x7b)
	nan        uint8 // the code of a NaN (the PTX canonical NaN)
	decode     *[256]float32

	// rounded's constants, from mant and bias
	shift, half uint32  // 23 - mant; half an ulp of the format less one, in float32 mantissa units
	rebias      uint32  // (127 - bias) << mant: float32's exponent bias moved to the format's
	minNormal   uint32  // the float32 bits of the format's smallest normal, 2^(1-bias)
	subScale    float32 // 2^(bias-1+mant): a subnormal's magnitude in smallest subnormals
	kernel      *fp8Kernel
}

// fp8Kernel is a format's constants for fp8EncodeAVX2, in 8 lanes each
// (the layout its assembly reads: offsets 0, 32, ... 160, then shift):
// half, rebias and subScale's bits as rounded takes them, minNormal - 1
// (for a greater-than compare), maxCode and the NaN code, and shift.
type fp8Kernel struct {
	half, rebias, sub, minn, max, nan [8]uint32
	shift                             uint64
}

func (f *fp8Format) newKernel() *fp8Kernel {
	k := &fp8Kernel{shift: uint64(f.shift)}
	for i := range 8 {
		k.half[i], k.rebias[i], k.sub[i] = f.half, f.rebias, math.Float32bits(f.subScale)
		k.minn[i], k.max[i], k.nan[i] = f.minNormal-1, uint32(f.maxCode), uint32(f.nan)
	}
	return k
}

var (
	fp8E4M3 = newFP8Format(3, 7, 0x7e)
	fp8E5M2 = newFP8Format(2, 15, 0x7b)
)

func newFP8Format(mant, bias int, maxCode uint8) *fp8Format {
	shift := uint32(23 - mant)
	f := &fp8Format{mant: mant, bias: bias, maxCode: maxCode, nan: 0x7f, decode: new([256]float32),
		shift: shift, half: 1<<(shift-1) - 1, rebias: uint32(127-bias) << mant,
		minNormal: uint32(128-bias) << 23, subScale: float32(math.Ldexp(1, bias-1+mant))}
	f.kernel = f.newKernel()
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
// largest; NaN the canonical NaN. Branch-free (selects): which rounding
// path an element takes varies from element to element in a KV cache.
func (f *fp8Format) encode(y float32) uint8 {
	u := math.Float32bits(y)
	a := u & 0x7fffffff
	c := uint8(u>>24)&0x80 | uint8(min(f.rounded(a), uint32(f.maxCode)))
	if a > 0x7f800000 {
		c = f.nan
	}
	return c
}

// rounded is the code of the magnitude a (float32 bits, finite or Inf)
// rounded to nearest even, unbounded: past the largest finite value it
// counts on (an Inf's is far past it). Both paths are computed and one
// kept: a normal number of the format rounds its float32 mantissa to
// mant bits (ties to even) and rebiases the exponent; a subnormal, or
// zero, is scaled exactly to units of the smallest subnormal (< 2^mant)
// and rounded to an integer, to even, by adding 2^23 in float32.
func (f *fp8Format) rounded(a uint32) uint32 {
	normal := (a+f.half+(a>>f.shift&1))>>f.shift - f.rebias
	r := math.Float32bits(float32(math.Float32frombits(a)*f.subScale)+0x1p23) & 0x7fffff
	if a >= f.minNormal {
		r = normal
	}
	return r
}

// e4m3Encode writes fp8E4M3.encode(float32(x_i · mul)) for a prefix of
// x of whole blocks of 32 with the AVX2 kernel (none without it), and
// returns its length: the caller converts the rest.
func e4m3Encode(codes []uint8, x []float32, mul float32) int {
	return fp8E4M3.encodeKernel(codes, x, mul)
}

// encodeKernel writes f.encode(float32(x_i · mul)) for a prefix of x of
// whole blocks of 32 with the format's AVX2 kernel (E4M3's, E5M2's; none
// without AVX2) and returns its length: the caller converts the rest.
func (f *fp8Format) encodeKernel(codes []uint8, x []float32, mul float32) int {
	if !useSIMD {
		return 0
	}
	n := len(x) &^ 31
	if n > 0 {
		fp8EncodeAVX2(codes[:n], x[:n], mul, f.kernel)
	}
	return n
}

// encodeCount writes f.encode(float32(x_i·mul)) for all of x, by the
// format's kernel where there is one, and returns how many of those
// products lie beyond its largest finite value (the values the
// conversion saturates; a NaN is none).
func (f *fp8Format) encodeCount(codes []uint8, x []float32, mul float32) int64 {
	top := f.decode[f.maxCode]
	var n int64
	m := f.encodeKernel(codes, x, mul)
	for _, v := range x[:m] {
		if y := float32(v * mul); y > top || y < -top {
			n++
		}
	}
	for i, v := range x[m:] {
		y := float32(v * mul)
		if y > top || y < -top {
			n++
		}
		codes[m+i] = f.encode(y)
	}
	return n
}

// encodeFP8All and decodeFP8All are a per-tensor FP8 format's conversion
// of a whole chunk, with the scheme's static scale.
func encodeFP8All(f *fp8Format) func(j *tensorJob, x []float32, qlo, qhi int) {
	return func(j *tensorJob, x []float32, qlo, qhi int) {
		scale, codes := float32(j.l.s.Scale), j.codes[qlo:qhi]
		top, n := f.decode[f.maxCode], int64(0)
		x = x[:len(codes)]
		m := 0
		if useSIMD {
			// v/scale into a scratch by the IEEE division kernel (v/1 is v),
			// then the format's kernel of encode(y·1), y·1 being y
			var buf [1024]float32
			for m+32 <= len(x) {
				y := buf[:min(len(buf), (len(x)-m)&^31)]
				copy(y, x[m:])
				if scale != 1 {
					divAVX2(y, scale)
				}
				n += f.encodeCount(codes[m:m+len(y)], y, 1)
				m += len(y)
			}
		}
		for i, v := range x[m:] {
			y := v / scale
			if y > top || y < -top {
				n++
			}
			codes[m+i] = f.encode(y)
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
		top := absMaxBits(x) // the largest |x| as float32 bits (they order as the magnitudes; NaN above Inf)
		nonFinite := top >= 0x7f800000
		scale := max(math.Float32frombits(top)/p.qmax, 1e-6)
		inv := 1 / scale
		codes := dst[:len(x)]
		if p.int8 {
			m := 0
			if useSIMD {
				m = len(x) &^ 31
				if m > 0 {
					int8HeadCodesAVX2(codes[:m], x[:m], inv)
				}
			}
			for i, v := range x[m:] {
				i += m
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
			n := e4m3Encode(codes, x, inv)
			for i, v := range x[n:] {
				// the kernel clamps to ±448 first; encode saturates there itself (satfinite: a
				// value past 448, ±Inf, gives ±448's code; a NaN its NaN, as the clamp keeps it)
				codes[n+i] = fp8E4M3.encode(float32(v * inv))
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
			dequantSym(dst, codesOf(codes), scale) // float32(int8(c)) * scale
			return
		}
		for i, c := range codes {
			dst[i] = fp8E4M3.decode[c] * scale
		}
	}
}
