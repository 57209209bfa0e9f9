package compression

import (
	"encoding/binary"
	"math"

	"kvlib/pkg/safetensors"
)

// llama.cpp's KV-cache formats (-ctk/-ctv), bit-exact to the x86-64 CPU
// build of llama.cpp as vendored in the llama-cpp-python 0.3.36 sdist
// (llama.cpp commit 0c1e57098, ggml 0.25.3). Paths are relative to its
// vendor/llama.cpp/.
//
// The write (what kv-compress compresses to): llama.cpp stores each
// token's K (and V) as one f32 row of n_head_kv*head_dim values with
// ggml_set_rows (src/llama-kv-cache.cpp:1336-1360), which converts the
// row with the cache type's CPU from_float
// (ggml/src/ggml-cpu/ops.cpp:5476-5492; the functions,
// ggml/src/ggml-cpu/ggml-cpu.c:216-385): blocks of 32 along the row. The
// engine refuses a quantized type whose block does not divide head_dim
// (src/llama-context.cpp:3851-3871), so a block never crosses a head, and
// the blocks of kvlib's row-major [batch, heads, tokens, head_dim] tensor
// are the engine's blocks.
//
// The rotation: since PR #21038 the engine multiplies K and Q, and V, by
// an orthonormal Hadamard matrix before the write
// (src/llama-graph.cpp:2883-2890), for every quantized cache type (not
// f16), unless LLAMA_ATTN_ROT_DISABLE is set (src/llama-kv-cache.cpp:315-336):
// see engineRotation for the sizes and rotateLlama for the arithmetic.
// The cache holds the rotated, quantized values. The engine never rotates
// K back (Q is rotated the same way, so every dot product Q·K is that of
// the unrotated vectors up to rounding), and rotates V's attention output
// back (src/llama-graph.cpp:2928-2930), which is the rotated-back V
// weighted by the same probabilities. kvlib's reconstruction, which an
// unmodified attention reads, is the cache dequantized and then rotated
// back with the same kernel (the orthonormal Hadamard matrix is its own
// inverse): mathematically what the engine's attention sees; in floating
// point, a dot product with the rotated-back K, or the weighted sum of the
// rotated-back V, can differ from the engine's rotated-space result in the
// last bits of float32 (a few ulps), never by a quantization step.
//
// The read: dequantize_row_* of ggml/src/ggml-quants.c (the type's
// to_float): products in float32, rounded, then the minimum added; no FMA
// (ggml-base is compiled without -march flags).
//
// Where the C converts a float to an 8-bit integer the result is what the
// x86 build computes (cvttss2si: NaN and values beyond int32 give
// 0x80000000, then its low byte), which only blocks whose largest |x| is
// below 2^-125 reach (their reciprocal scale overflows to Inf).
var llamaCpp = &engine{
	name:      "llama.cpp",
	version:   "llama.cpp 0c1e57098 (ggml 0.25.3) via llama-cpp-python 0.3.36",
	flag:      "-ctk %s -ctv %s",
	blockRule: "llama.cpp refuses %[1]s for head_dim %[2]d: its blocks of %[3]d must divide head_dim (src/llama-context.cpp:3851-3871)",
	detail:    llamaEvidenceDetail,
	formats: []*engineFormat{
		{name: "f16", bits: 16, elems: 1, bytes: 2, evidence: EvidenceExecuted,
			source:   "ggml/src/ggml-cpu/ggml-cpu.c:3480-3511 (ggml_cpu_fp32_to_fp16, F16C)",
			quantize: llamaQuantizeF16, dequantize: llamaDequantizeF16,
			encodeAll: (*tensorJob).encodeF16All, decodeAll: (*tensorJob).decodeF16All},
		{name: "q8_0", bits: 8, elems: GGMLBlock, bytes: 34, rotates: true, evidence: EvidenceExecuted,
			source:   "ggml/src/ggml-cpu/arch/x86/quants.c:302-398 (quantize_row_q8_0, AVX2); ggml/src/ggml-quants.c:553-567",
			quantize: llamaQuantizeQ8_0, dequantize: ggmlDequantizer(Q8_0)},
		{name: "q5_1", bits: 5, elems: GGMLBlock, bytes: 24, rotates: true, evidence: EvidenceExecuted,
			source:   "ggml/src/ggml-quants.c:231-274 (quantize_row_q5_1_ref), 526-551",
			quantize: llamaQuantizeQ5_1, dequantize: ggmlDequantizer(Q5_1)},
		{name: "q5_0", bits: 5, elems: GGMLBlock, bytes: 22, rotates: true, evidence: EvidenceExecuted,
			source:   "ggml/src/ggml-quants.c:187-229 (quantize_row_q5_0_ref), 500-524",
			quantize: llamaQuantizeQ5_0, dequantize: ggmlDequantizer(Q5_0)},
		{name: "q4_1", bits: 4, elems: GGMLBlock, bytes: 20, rotates: true, evidence: EvidenceExecuted,
			source:   "ggml/src/ggml-quants.c:150-185 (quantize_row_q4_1_ref), 479-498",
			quantize: llamaQuantizeQ4_1, dequantize: ggmlDequantizer(Q4_1)},
		{name: "q4_0", bits: 4, elems: GGMLBlock, bytes: 18, rotates: true, evidence: EvidenceExecuted,
			source:   "ggml/src/ggml-quants.c:113-148 (quantize_row_q4_0_ref), 459-477",
			quantize: llamaQuantizeQ4_0, dequantize: ggmlDequantizer(Q4_0)},
		{name: "iq4_nl", bits: 4, elems: GGMLBlock, bytes: 18, rotates: true, evidence: EvidenceExecuted,
			source:   "ggml/src/ggml-quants.c:4937-5046, 5071-5084 (quantize_row_iq4_nl_ref), 2725-2741",
			quantize: llamaQuantizeIQ4NL, dequantize: llamaDequantizeIQ4NL,
			quantizeRun: llamaQuantizeIQ4NLRun, dequantizeRun: llamaDequantizeIQ4NLRun},
	},
}

// llamaEvidenceDetail says what ran against what for a format's evidence.
func llamaEvidenceDetail(f *engineFormat) string {
	const harness = "tests/test_engine_formats.py: the engine's C (verbatim excerpts in tests/engine_harness, " +
		"compiled with the engine's flags) on the same bytes; with LLAMA_CPP_DIR, the built libggml's set_rows graph, rotation included"
	switch f.name {
	case "q8_0":
		return harness + "; gguf.quants' Q8_0 is the _ref rounding (half away from zero), which differs on ties: both are tested"
	case "f16", "iq4_nl":
		return harness
	}
	return harness + "; and gguf.quants (llama.cpp's quantizers in NumPy, by its authors)"
}

// LlamaCppFormats lists llama.cpp's cache types, in the menu order of
// common/arg.cpp:304-314 (f32 and bf16 aside).
func LlamaCppFormats() []string {
	names := make([]string, len(llamaCpp.formats))
	for i, f := range llamaCpp.formats {
		names[i] = f.name
	}
	return names
}

func llamaFormat(name string) *engineFormat {
	for _, f := range llamaCpp.formats {
		if f.name == name {
			return f
		}
	}
	return nil
}

// LlamaCppBlockBytes is the size of one block of format (32 elements; f16: 1).
func LlamaCppBlockBytes(format string) int { return llamaFormat(format).bytes }

// LlamaCppQuantize writes llama.cpp's cache bytes of x for format (f16,
// q8_0, q5_1, q5_0, q4_1, q4_0, iq4_nl) into dst: len(x) a multiple of the
// block, dst LlamaCppBlockBytes per block. Any input is taken (NaN, Inf,
// overflow), and gives what the engine stores.
func LlamaCppQuantize(format string, x []float32, dst []byte) {
	f := llamaFormat(format)
	for b := 0; b+f.elems <= len(x); b += f.elems {
		f.quantize(x[b:b+f.elems], dst[b/f.elems*f.bytes:])
	}
}

// LlamaCppDequantize is the engine's read of LlamaCppQuantize's bytes.
func LlamaCppDequantize(format string, src []byte, dst []float32) {
	f := llamaFormat(format)
	for b := 0; b+f.elems <= len(dst); b += f.elems {
		f.dequantize(src[b/f.elems*f.bytes:], dst[b:b+f.elems])
	}
}

// LlamaCppRotate applies llama.cpp's Hadamard rotation of size n (a power
// of two, at least 8) to each run of n values of x (len(x) a multiple of
// n), as ggml_compute_forward_fwht_impl does on the CPU
// (ggml/src/ggml-cpu/ops.cpp:12256-12330): every value times
// 1.0f/sqrtf(n) first, then for len = 1, 2, ..., n/2 the butterflies
// v[j], v[j+len] = v[j] + v[j+len], v[j] - v[j+len] (the SIMD stages
// compute the difference as fma(v, -1, u), which is exact). That is
// H·x/sqrt(n) with H the Sylvester-order Hadamard matrix the engine builds
// (src/llama-kv-cache.cpp:21-59): no random signs, no permutation. It is
// its own inverse.
func LlamaCppRotate(x []float32, n int) {
	x = x[:len(x)/n*n]
	scale(x, llamaHadamardScale(n))
	hadamard8(x)
	for h := 8; h < n; h *= 2 {
		hadamardStage(x, h)
	}
}

// llamaHadamardScale is 1.0f / sqrtf((float)n): the square root rounded
// to float32 (a float64 root rounded to float32 is the correctly rounded
// float32 root), then the float32 quotient.
func llamaHadamardScale(n int) float32 { return 1 / float32(math.Sqrt(float64(n))) }

// fp16F16C is VCVTPS2PH with rounding mode 0, the conversion of the
// F16C build (ggml_cpu_fp32_to_fp16, ggml/src/ggml-cpu/ggml-cpu.c:3480-3511,
// and GGML_CPU_FP32_TO_FP16, simd-mappings.h:61-64): round to nearest
// even, overflow to Inf, and a NaN keeps its sign and the top 10 bits of
// its payload, quieted. (GGML_FP32_TO_FP16 of ggml-quants.c, which the
// _ref quantizers use for their scales, gives sign | 0x7e00 for every NaN:
// safetensors.Float32ToFP16.)
func fp16F16C(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16)&0x8000 | 0x7e00 | uint16(b>>13)&0x3ff
	}
	return safetensors.Float32ToFP16(f)
}

// llamaQuantizeF16 is an f16 cache's from_float, value by value.
func llamaQuantizeF16(x []float32, dst []byte) bool {
	for i, v := range x {
		binary.LittleEndian.PutUint16(dst[2*i:], fp16F16C(v))
	}
	return firstNonFinite(x) >= 0
}

// llamaDequantizeF16 is ggml_fp16_to_fp32_row: exact.
func llamaDequantizeF16(src []byte, dst []float32) {
	for i := range dst {
		dst[i] = safetensors.FP16ToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

// cCvt is (int32_t)(float) as x86's cvttss2si: truncation toward zero;
// a NaN or a value beyond int32 gives INT32_MIN (0x80000000).
func cCvt(v float32) int32 {
	if !(v >= -(1<<31) && v < 1<<31) {
		return math.MinInt32
	}
	return int32(v)
}

// cInt8 is (int8_t)(float) of the x86 build: the low byte of cCvt.
func cInt8(v float32) int8 { return int8(cCvt(v)) }

// cSignedExtreme is the quantizers' search for the first element of
// largest |x|, as `if (amax < fabsf(v)) { amax = fabsf(v); max = v; }`
// from amax = max = 0 (ggml-quants.c:121-130): a NaN never wins, and an
// all-zero block keeps +0 whatever the signs of its zeros.
func cSignedExtreme(x []float32) float32 {
	var amax, mx float32
	for _, v := range x {
		if a := float32(math.Abs(float64(v))); amax < a {
			amax, mx = a, v
		}
	}
	return mx
}

// signedExtreme is cSignedExtreme, by the block kernel where the block is
// finite and not all zero; nonFinite reports a NaN or Inf in x.
func signedExtreme(x []float32) (mx float32, nonFinite bool) {
	imax, abits := argAbsMax32(x)
	if abits == 0 || abits >= 0x7f800000 {
		return cSignedExtreme(x), abits >= 0x7f800000
	}
	return x[imax], false
}

// cMinMax is `if (v < min) min = v; if (v > max) max = v;` from FLT_MAX
// and -FLT_MAX (ggml-quants.c:157-165): a NaN is skipped, and of equal
// extremes (-0 and +0) the first stays.
func cMinMax(x []float32) (lo, hi float32) {
	lo, hi = math.MaxFloat32, -math.MaxFloat32
	for _, v := range x {
		if v < lo {
			lo = v
		}
		if v > hi {
			hi = v
		}
	}
	return lo, hi
}

// llamaMinMax is cMinMax, by the block kernel where the block is finite
// and its extremes are not zero (whose sign the kernel orders); nonFinite
// reports a NaN or Inf in x.
func llamaMinMax(x []float32) (lo, hi float32, nonFinite bool) {
	lo, hi, abits := minMax(x)
	if abits >= 0x7f800000 || lo == 0 || hi == 0 {
		lo, hi = cMinMax(x)
	}
	return lo, hi, abits >= 0x7f800000
}

// offsetCodes is the codes of the q4/q5 quantizers, (int8_t)(x*id + off)
// (q4_1, q5_1: (x - min)*id + off), clamped to qmax: the block kernel
// while id is finite (|x*id| stays within the format's range, where the
// kernel's truncation is the C cast), else the C cast value by value.
// clamp is false for q5_1, which stores (uint8_t)(x0 + 0.5f) unclamped.
func offsetCodes(q *[GGMLBlock]uint8, x []float32, lo, id, off float32, qmax uint8, clamp bool) {
	if math.Abs(float64(id)) <= math.MaxFloat32 {
		offsetCodes32(q, x, lo, id, off, qmax)
		return
	}
	for i, v := range x[:GGMLBlock] {
		c := int(cInt8(float32(float32(v-lo)*id) + off))
		if clamp {
			c = min(int(qmax), c)
		}
		q[i] = uint8(c)
	}
}

// llamaQuantizeQ4_0 is quantize_row_q4_0_ref (ggml-quants.c:113-148):
// d = max/-8 with max the first element of largest |x|, id = d ? 1/d : 0
// from the float32 d, q = MIN(15, (int8_t)(x*id + 8.5f)), d stored as FP16.
func llamaQuantizeQ4_0(x []float32, dst []byte) bool {
	mx, nonFinite := signedExtreme(x)
	d := mx / -8
	var q [GGMLBlock]uint8
	offsetCodes(&q, x, 0, recip(d), 8.5, 15, true)
	writeBlock(Q4_0, dst, safetensors.Float32ToFP16(d), 0, &q)
	return nonFinite
}

// llamaQuantizeQ5_0 is quantize_row_q5_0_ref (ggml-quants.c:187-229):
// d = max/-16, q = MIN(31, (int8_t)(x*id + 16.5f)), bit 4 of code j in bit j of qh.
func llamaQuantizeQ5_0(x []float32, dst []byte) bool {
	mx, nonFinite := signedExtreme(x)
	d := mx / -16
	var q [GGMLBlock]uint8
	offsetCodes(&q, x, 0, recip(d), 16.5, 31, true)
	writeBlock(Q5_0, dst, safetensors.Float32ToFP16(d), 0, &q)
	return nonFinite
}

// llamaQuantizeQ4_1 is quantize_row_q4_1_ref (ggml-quants.c:150-185):
// d = (max-min)/15, q = MIN(15, (int8_t)((x-min)*id + 0.5f)), d and min as FP16.
func llamaQuantizeQ4_1(x []float32, dst []byte) bool {
	lo, hi, nonFinite := llamaMinMax(x)
	d := (hi - lo) / 15
	var q [GGMLBlock]uint8
	offsetCodes(&q, x, lo, recip(d), 0.5, 15, true)
	writeBlock(Q4_1, dst, safetensors.Float32ToFP16(d), safetensors.Float32ToFP16(lo), &q)
	return nonFinite
}

// llamaQuantizeQ5_1 is quantize_row_q5_1_ref (ggml-quants.c:231-274):
// d = (max-min)/31, q = (uint8_t)((x-min)*id + 0.5f), unclamped.
func llamaQuantizeQ5_1(x []float32, dst []byte) bool {
	lo, hi, nonFinite := llamaMinMax(x)
	d := (hi - lo) / 31
	var q [GGMLBlock]uint8
	offsetCodes(&q, x, lo, recip(d), 0.5, 31, false)
	writeBlock(Q5_1, dst, safetensors.Float32ToFP16(d), safetensors.Float32ToFP16(lo), &q)
	return nonFinite
}

// maxps is MAXPS on one lane: a > b ? a : b (a NaN in either gives b).
func maxps(a, b float32) float32 {
	if a > b {
		return a
	}
	return b
}

// q8_0AbsMaxX86 is the max|x| reduction of the x86 quantize_row_q8_0
// (arch/x86/quants.c:318-330), lane by lane in MAXPS's order: equal to
// max|x| for a block without NaN; which NaN survives depends on its lane.
// nonFinite reports a NaN or Inf in x.
func q8_0AbsMaxX86(x []float32) (amax float32, nonFinite bool) {
	if abits := absMaxBits(x); abits <= 0x7f800000 {
		return math.Float32frombits(abits), abits == 0x7f800000
	}
	var lane [8]float32
	for i := range lane {
		lane[i] = float32(math.Abs(float64(x[i])))
		for k := 1; k < 4; k++ {
			lane[i] = maxps(lane[i], float32(math.Abs(float64(x[8*k+i]))))
		}
	}
	var m4 [4]float32
	for i := range m4 {
		m4[i] = maxps(lane[4+i], lane[i]) // _mm_max_ps(extractf128(maxAbs, 1), castps256_ps128(maxAbs))
	}
	m0, m1 := maxps(m4[0], m4[2]), maxps(m4[1], m4[3]) // _mm_movehl_ps
	return maxps(m0, m1), true                         // _mm_max_ss with _mm_movehdup_ps
}

// llamaQuantizeQ8_0 is the x86 AVX/AVX2 quantize_row_q8_0
// (ggml/src/ggml-cpu/arch/x86/quants.c:302-398), which a q8_0 cache's
// set_rows runs on x86 (it is not quantize_row_q8_0_ref): d = amax/127
// stored with F16C, id = 127.f/amax (not 1/d), codes x*id rounded half to
// even (_mm256_round_ps, not roundf), converted with _mm256_cvtps_epi32
// (NaN: INT32_MIN) and packed with signed saturation to int8. It differs
// from the _ref (and gguf.quants) by one code where x*id falls on a half,
// or where 127/amax and 1/(amax/127) differ in the last bit across one.
func llamaQuantizeQ8_0(x []float32, dst []byte) bool {
	x = x[:GGMLBlock]
	amax, nonFinite := q8_0AbsMaxX86(x)
	binary.LittleEndian.PutUint16(dst, fp16F16C(amax/127))
	var id float32
	if amax != 0 {
		id = 127 / amax
	}
	rneCodes32(dst[2:2+GGMLBlock], x, id)
	return nonFinite
}

// rneCodes32 writes the x86 q8_0 codes of 32 values: int8 saturation of
// the int32 conversion of x*id rounded half to even, where the conversion
// of a NaN or of a value beyond int32 is 0x80000000 (so -128).
func rneCodes32(q []uint8, x []float32, id float32) {
	q, x = q[:GGMLBlock], x[:GGMLBlock]
	if useSIMD {
		rneCodes32AVX2(q, x, id)
		return
	}
	for i, v := range x {
		t := float32(v * id)
		if !(t > -(1<<31) && t < 1<<31) { // NaN, or beyond int32 (an Inf id)
			q[i] = 0x80
			continue
		}
		r := int32((t + roundMagic) - roundMagic) // |t| <= 127.00002 here: round half to even
		q[i] = uint8(int8(min(max(r, -128), 127)))
	}
}

// kvaluesIQ4NL is iq4_nl's codebook (ggml/src/ggml-common.h:1120-1122).
var kvaluesIQ4NL = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// iq4nlValues is the codebook as float32s.
var iq4nlValues = func() (v [16]float32) {
	for i, k := range kvaluesIQ4NL {
		v[i] = float32(k)
	}
	return v
}()

// iq4nlEmptyCode is the code kvlib writes for every element of an iq4_nl
// block whose largest |x| is below 1e-15: the engine never writes the
// codes of such a block (quantize_row_iq4_nl_impl's `continue` at
// ggml-quants.c:4968-4971 skips the loop that sets L, and 5040-5044 packs
// whatever L held: the previous block's codes, or stack contents), so its
// bytes are not reproducible; its scale is 0 and it restores to zeros
// either way. Code 8 (+1) restores +0.
const iq4nlEmptyCode = 8

// bestIndexIQ4NL is best_index_int8(16, kvalues_iq4nl, x)
// (ggml-quants.c:28-37): the nearest codebook entry, the upper on a tie;
// 0 at or below -127, 15 at or above 113 and for a NaN. The C's float
// comparison x - v[k] < v[k+1] - x is exact near each midpoint (both
// differences are multiples of x's ulp below 2^24 of them), so the index
// is the number of midpoints m_k = (v[k] + v[k+1])/2 <= x; the midpoints
// are multiples of 1/2, so that is a table of floor(2x).
func bestIndexIQ4NL(x float32) int {
	if x != x {
		return 15
	}
	t := float64(x)*2 + 256 // exact; floor(2x) + 255 is int(t) - 1 where t > 1
	switch {
	case t < 1:
		return 0
	case t >= 483:
		return 15
	}
	return int(iq4nlIndex[int(t)-1])
}

// iq4nlMids are the 15 midpoints (v[k] + v[k+1])/2 of the codebook (exact
// in float32: multiples of 1/2).
var iq4nlMids = func() (m [15]float32) {
	for k := range m {
		m[k] = float32(int(kvaluesIQ4NL[k])+int(kvaluesIQ4NL[k+1])) / 2
	}
	return m
}()

// iq4nlIndex[k+255] is the number of iq4_nl midpoints m with 2m <= k.
var iq4nlIndex = func() (t [482]uint8) {
	for k := range t {
		for j := 0; j < 15; j++ {
			if int(kvaluesIQ4NL[j])+int(kvaluesIQ4NL[j+1]) <= k-255 {
				t[k]++
			}
		}
	}
	return t
}()

// bestIndexIQ4NLC is best_index_int8 as the C writes it: bestIndexIQ4NL's
// definition, which the tests hold it to.
func bestIndexIQ4NLC(x float32) int {
	if x <= float32(kvaluesIQ4NL[0]) {
		return 0
	}
	if x >= float32(kvaluesIQ4NL[15]) {
		return 15
	}
	ml, mu := 0, 15
	for mu-ml > 1 {
		mav := (ml + mu) / 2
		if x < float32(kvaluesIQ4NL[mav]) {
			mu = mav
		} else {
			ml = mav
		}
	}
	if float32(x-float32(kvaluesIQ4NL[mu-1])) < float32(float32(kvaluesIQ4NL[mu])-x) {
		return mu - 1
	}
	return mu
}

// llamaQuantizeIQ4NL is quantize_row_iq4_nl_ref (ggml-quants.c:5071-5084),
// which is quantize_row_iq4_nl_impl (4937-5046) with a super-block of one
// block of 32, no importance weights and ntry = -1 (no scale search):
// weights w = x²; max the first element of largest |x| (`ax > amax`); a
// block with amax < 1e-15 gets d = 0 (see iq4nlEmptyCode); else d0 =
// max/-127, each code the entry nearest x/d0 (x times 1/d0), and
// d = sumqx/sumq2 with sumqx = Σ w·q·x, sumq2 = Σ w·q·q in float32, in
// element order, each product rounded left to right (no FMA: ggml-base is
// compiled without -march), stored with GGML_FP32_TO_FP16. The codes stay
// those of d0.
func llamaQuantizeIQ4NL(x []float32, dst []byte) bool {
	x = x[:GGMLBlock]
	var amax, mx float32
	imax, abits := argAbsMax32(x) // the first largest |x|: the loop's for finite x, where bits order as values
	if abits < 0x7f800000 {
		amax, mx = math.Float32frombits(abits), x[imax]
	} else {
		for _, v := range x {
			if a := math.Float32frombits(math.Float32bits(v) &^ (1 << 31)); a > amax {
				amax, mx = a, v
			}
		}
	}
	var q [GGMLBlock]uint8
	var d float32
	if amax < 1e-15 {
		for i := range q {
			q[i] = iq4nlEmptyCode
		}
	} else {
		id := 1 / (mx / float32(kvaluesIQ4NL[0]))
		if useSIMD && abits < 0x7f800000 {
			// all finite, so is each id·v: its index is the count of the
			// midpoints <= it (bestIndexIQ4NL), 8 a compare; the same
			// products as below, 8 at a time, and the sums in element
			// order (iq4nlQuantAVX2)
			sumqx, sumq2 := iq4nlQuantAVX2((*[GGMLBlock / 2]byte)(dst[2:2+GGMLBlock/2]), (*[GGMLBlock]float32)(x), id)
			iq4nlPutScale(dst, sumqx, sumq2)
			return false
		}
		for j, v := range x {
			q[j] = uint8(bestIndexIQ4NL(float32(id * v)))
		}
		sumqx, sumq2 := iq4nlSums(x, &q)
		if sumq2 > 0 {
			d = sumqx / sumq2
		}
	}
	binary.LittleEndian.PutUint16(dst, safetensors.Float32ToFP16(d))
	for j := 0; j < 16; j++ {
		dst[2+j] = q[j] | q[j+16]<<4
	}
	return abits >= 0x7f800000
}

// llamaDequantizeIQ4NL is dequantize_row_iq4_nl (ggml-quants.c:2725-2741):
// d * kvalues_iq4nl[code].
func llamaDequantizeIQ4NL(src []byte, dst []float32) {
	d := safetensors.FP16ToFloat32(binary.LittleEndian.Uint16(src))
	dst = dst[:GGMLBlock]
	if useSIMD {
		iq4nlDecAVX2((*[GGMLBlock]float32)(dst), (*[GGMLBlock / 2]byte)(src[2:2+GGMLBlock/2]), d)
		return
	}
	for j, b := range src[2 : 2+16] {
		dst[j] = d * iq4nlValues[b&0xf]
		dst[j+16] = d * iq4nlValues[b>>4]
	}
}

// llamaQuantizeIQ4NLRun and llamaDequantizeIQ4NLRun are llamaQuantizeIQ4NL
// and llamaDequantizeIQ4NL over whole consecutive blocks (engineFormat's
// runs; k unused).
func llamaQuantizeIQ4NLRun(x []float32, dst []byte, _ blockRun) (nonFinite bool, _ int) {
	i, nb := 0, len(x)/GGMLBlock
	if useSIMD {
		// two blocks a kernel where both take llamaQuantizeIQ4NL's kernel:
		// the same arithmetic, the two blocks' sums added side by side
		for ; i+2 <= nb; i += 2 {
			a, b := x[i*GGMLBlock:(i+1)*GGMLBlock], x[(i+1)*GGMLBlock:(i+2)*GGMLBlock]
			ida, oka := iq4nlID(a)
			idb, okb := iq4nlID(b)
			if !oka || !okb {
				nonFinite = llamaQuantizeIQ4NL(a, dst[i*18:(i+1)*18]) || nonFinite
				nonFinite = llamaQuantizeIQ4NL(b, dst[(i+1)*18:(i+2)*18]) || nonFinite
				continue
			}
			d := dst[i*18 : (i+2)*18]
			s := iq4nlQuant2AVX2(&d[2], (*[2 * GGMLBlock]float32)(x[i*GGMLBlock:(i+2)*GGMLBlock]), ida, idb)
			iq4nlPutScale(d, s[0], s[1])
			iq4nlPutScale(d[18:], s[2], s[3])
		}
	}
	for ; i < nb; i++ {
		nonFinite = llamaQuantizeIQ4NL(x[i*GGMLBlock:(i+1)*GGMLBlock], dst[i*18:(i+1)*18]) || nonFinite
	}
	return nonFinite, 0
}

// iq4nlSums are a block's weighted sums of its codes q: w = x², sumqx =
// Σ w·q·x, sumq2 = Σ w·q·q, in float32 in element order.
func iq4nlSums(x []float32, q *[GGMLBlock]uint8) (sumqx, sumq2 float32) {
	for j, v := range x[:GGMLBlock] {
		qv := iq4nlValues[q[j]&15]
		w := float32(v * v)
		wq := float32(w * qv)
		sumqx += float32(wq * v) // the conversions keep the compiler from fusing
		sumq2 += float32(wq * qv)
	}
	return sumqx, sumq2
}

// iq4nlID is a block's id = 1/d0 where it takes the kernel (finite, amax
// >= 1e-15), as llamaQuantizeIQ4NL computes it.
func iq4nlID(x []float32) (id float32, ok bool) {
	imax, abits := argAbsMax32(x)
	if abits >= 0x7f800000 || !(math.Float32frombits(abits) >= 1e-15) {
		return 0, false
	}
	return 1 / (x[imax] / float32(kvaluesIQ4NL[0])), true
}

// iq4nlPutScale stores d = sumqx/sumq2 (0 unless sumq2 > 0) as fp16.
func iq4nlPutScale(dst []byte, sumqx, sumq2 float32) {
	var d float32
	if sumq2 > 0 {
		d = sumqx / sumq2
	}
	binary.LittleEndian.PutUint16(dst, safetensors.Float32ToFP16(d))
}

func llamaDequantizeIQ4NLRun(src []byte, dst []float32, _ blockRun) {
	for i := 0; i < len(dst)/GGMLBlock; i++ {
		llamaDequantizeIQ4NL(src[i*18:(i+1)*18], dst[i*GGMLBlock:(i+1)*GGMLBlock])
	}
}

// ggmlDequantizer is dequantize_row_* of a block type kvlib already has:
// the same arithmetic as DequantizeBlockGGML, for any scale, including
// the Inf or NaN an overflowing block stores (the engine reads them too).
func ggmlDequantizer(m Method) func(src []byte, dst []float32) {
	return func(src []byte, dst []float32) { dequantBlock(m, src, dst) }
}

// encodeEngine and decodeEngine are the engine formats' entries: block
// gi of the job's codes.
func (j *tensorJob) encodeEngine(x []float32, _ []int8, gi int) error {
	f, bb := j.l.q.engine, j.l.blockBytes
	nonFinite, n := f.quantizeBlock(x, j.codes[gi*bb:(gi+1)*bb], j.blockRun())
	if n > 0 {
		j.saturated.Add(int64(n))
	}
	if nonFinite && j.l.rot == 0 {
		return ErrNotFinite // the engine would store it; kv-compress refuses a cache with NaN or Inf
	}
	return nil // after the rotation, an Inf its sums made: stored as the engine stores it
}

func (j *tensorJob) decodeEngine(y []float32, _ []int8, gi int) error {
	f, bb := j.l.q.engine, j.l.blockBytes
	f.dequantizeBlock(j.codes[gi*bb:(gi+1)*bb], y, j.blockRun())
	return nil
}

// encodeF16All and decodeF16All run an f16 cache's conversion over a
// whole chunk (the pipeline has refused NaN already; for every other
// value safetensors' conversion is fp16F16C's).
func (j *tensorJob) encodeF16All(x []float32, qlo, qhi int) {
	safetensors.EncodeFloat32s(j.codes[2*qlo:2*qhi], x, safetensors.F16)
}

func (j *tensorJob) decodeF16All(y []float32, qlo, qhi int) {
	safetensors.DecodeFloat32s(y, j.codes[2*qlo:2*qhi], safetensors.F16)
}
