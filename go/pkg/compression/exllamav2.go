package compression

import (
	"encoding/binary"
	"math"

	"kvlib/pkg/safetensors"
)

// ExLlamaV2's quantized caches, as ExLlamaV2 0.3.2 writes them (the wheel
// exllamav2-0.3.2-py3-none-any, which ships the CUDA sources it compiles
// on first import; v2/ is exllamav2/exllamav2_ext/). The model runs in
// fp16, so each value is first rounded to fp16 (round to nearest even).
//
// FP8 (ExLlamaV2Cache_8bit): the top byte of each fp16, a truncation
// toward zero, not a rounding (v2/cuda/cache.cu:25-37, 56-62; the
// docstring "compressed to FP8 (e5m2) format by truncation",
// exllamav2/cache.py:306-309); the read puts the byte back on top of a
// zero byte.
//
// Q4 and Q8 (ExLlamaV2Cache_Q4, _Q8; Q6 is K at 8 bits and V at 4,
// cache.cu:259-260): per 64-element chunk, two interleaved 32-point groups
// (elements 2l and 2l+1) through the unnormalised Sylvester Hadamard, every
// butterfly stage rounded to fp16 (v2/cuda/cache_q.cuh:21-35); then per
// contiguous 32 of the rotated values an fp16 scale RN16(amax · 2^-3) (Q4)
// or RN16(amax · 2^-7) (Q8) (:37-45, 65, 96), codes
// q = clamp(rint(RN16(RN16(w/amax)·M + M)), 0, 2M-1) with M = 8 or 128 (a
// NaN, from an all-zero group, gives 0), element 2k in the low nibble for
// Q4 (:59-64, 90-95). The read (:111-185): RN16((q-M)·scale), the same
// butterfly, RN16(· 2^-5). The division is __h2div, whose rcp.approx
// equals the correctly rounded quotient used here whenever the hardware
// reciprocal is correctly rounded (docs/research/exllama-kv-formats.md
// A5: 23 divisor significands would differ by one fp16 ulp if it is not).
// kv-compress keeps a block within one head vector: a chunk of 64 is one
// head's when head_dim % 64 == 0, which it requires. Not modelled: when
// heads × head_dim is not a multiple of 512, ExLlamaV2 re-encodes a unit's
// earlier tokens from their decoded values at every store (A6), so its
// bytes depend on the store sequence; kv-compress encodes each token once,
// as a single prefill does. ExLlamaV2 attends over the step's own K/V
// unquantized (A0): prefix mode is the measure closest to it.
var exllamaV2 = &engine{
	name:    "exllamav2",
	version: "ExLlamaV2 0.3.2 (wheel; its CUDA sources)",
	flag:    "ExLlamaV2Cache_%s",
	blockRule: "kvlib refuses ExLlamaV2's %[1]s for head_dim %[2]d: its Hadamard chunks of %[3]d run along each token's " +
		"[heads × head_dim] row (v2/cuda/cache_q.cuh:21-35) and would straddle two heads",
	detail: func(*engineFormat) string {
		return "read: from the wheel's CUDA sources (files cited) and the compiled kernels' SASS (no fused multiply-add); " +
			"tests/exllama_reference.py, a NumPy reference written from them, pins the codec bit for bit; ExLlamaV2's " +
			"kernels have not run on these bytes (they need CUDA)"
	},
	formats: []*engineFormat{
		{name: "fp8", bits: 8, elems: 1, bytes: 1, evidence: EvidenceRead, flags: "ExLlamaV2Cache_8bit",
			source:    "v2/cuda/cache.cu:25-37 (ExLlamaV2Cache_8bit: the top byte of each fp16)",
			encodeAll: encodeEXL2FP8All, decodeAll: decodeEXL2FP8All},
		{name: "q4", flags: "ExLlamaV2Cache_Q4", bits: 4, elems: exl2Chunk, bytes: exl2Chunk/2 + 4, evidence: EvidenceRead,
			source:   "v2/cuda/cache_q.cuh:4-185 (fp16_to_q4 / q4_to_fp16; ExLlamaV2Cache_Q4)",
			quantize: exl2Quantizer(4), dequantize: exl2Dequantizer(4)},
		{name: "q8", flags: "ExLlamaV2Cache_Q8", bits: 8, elems: exl2Chunk, bytes: exl2Chunk + 4, evidence: EvidenceRead,
			source:   "v2/cuda/cache_q.cuh:4-185 (fp16_to_q8 / q8_to_fp16; ExLlamaV2Cache_Q8, and Q6's keys)",
			quantize: exl2Quantizer(8), dequantize: exl2Dequantizer(8)},
	},
	combos: []engineCombo{{name: "q6", flag: "ExLlamaV2Cache_Q6", key: "q8", value: "q4",
		why: "ExLlamaV2Cache_Q6 is 8-bit keys and 4-bit values (v2/cuda/cache.cu:259-260, 308-313)"}},
}

const exl2Chunk = 64 // a Hadamard chunk: two interleaved groups of 32, two scales

// rn16 rounds to fp16 and back: a value an fp16 register holds. It is
// safetensors.Float32ToFP16 then FP16ToFloat32 (the same on all 2^32
// float32 inputs, checked once; TestRN16IsTheFP16RoundTrip keeps a stride
// of them), branch-free on the float32 bits, as the
// engines' fp16 arithmetic emulated step by step calls it many times an
// element: a normal fp16 keeps 10 mantissa bits (ties to even, a carry
// moves the exponent); below 2^-14 the fp16 subnormals are the multiples
// of 2^-24, which adding and taking off 0.5 rounds to in float32; past
// 65504 (65520 on) Inf; a NaN the quiet NaN, with its sign.
func rn16(v float32) float32 {
	u := math.Float32bits(v)
	a := u & 0x7fffffff
	r := (a + 0xfff + (a >> 13 & 1)) &^ 0x1fff
	if a < 0x38800000 {
		r = math.Float32bits(float32(math.Float32frombits(a)+0.5) - 0.5)
	}
	if r > 0x477fe000 {
		r = 0x7f800000
	}
	if a > 0x7f800000 {
		r = 0x7fc00000
	}
	return math.Float32frombits(u&0x80000000 | r)
}

// rn16of64 rounds an exact float64 to fp16 without double rounding:
// first to float32 rounding to odd, then to fp16 (24 >= 11 + 2 bits).
func rn16of64(v float64) float32 {
	f := float32(v)
	if float64(f) != v && math.Float32bits(f)&1 == 0 {
		f = math.Nextafter32(f, float32(math.Copysign(math.Inf(1), v-float64(f))))
	}
	return rn16(f)
}

// encodeEXL2FP8All and decodeEXL2FP8All: the top byte of each fp16. The
// encode converts 256 values at a time with safetensors' F16 conversion
// (F16C where the CPU has it, Float32ToFP16's bits for every input) and
// keeps each half's high byte; the read looks the 256 values up.
func encodeEXL2FP8All(j *tensorJob, x []float32, qlo, qhi int) {
	codes := j.codes[qlo:qhi]
	var half [2 * 256]byte
	for lo := 0; lo < len(codes); lo += 256 {
		c := codes[lo:min(lo+256, len(codes))]
		h := half[:2*len(c)]
		safetensors.EncodeFloat32s(h, x[lo:lo+len(c)], safetensors.F16)
		for i := range c {
			c[i] = h[2*i+1] // little-endian: the high byte
		}
	}
}

// exl2FP8Values are the values of the 256 codes: FP16ToFloat32(c << 8).
var exl2FP8Values = func() (t [256]float32) {
	for c := range t {
		t[c] = safetensors.FP16ToFloat32(uint16(c) << 8)
	}
	return t
}()

func decodeEXL2FP8All(j *tensorJob, y []float32, qlo, qhi int) {
	for i, c := range j.codes[qlo:qhi] {
		y[i] = exl2FP8Values[c]
	}
}

// exl2Hadamard runs the fp16 butterfly over the two interleaved groups of
// a chunk in place (encode and decode use the same one).
func exl2Hadamard(w *[exl2Chunk]float32) {
	for h := 2; h < exl2Chunk; h <<= 1 { // lanes l and l|h of group p are w[2l+p] and w[2l+p+2h]
		for base := 0; base < exl2Chunk; base += 2 * h {
			for i := base; i < base+h; i++ { // both groups' pairs of this stage at once
				a, b := w[i], w[i+h]
				w[i], w[i+h] = rn16(a+b), rn16(a-b)
			}
		}
	}
}

// exl2Quantizer writes one chunk of 64: its codes, then two fp16 scales.
func exl2Quantizer(bits int) func(x []float32, dst []byte) bool {
	m := float64(int(1) << (bits - 1))
	qmax := 2*m - 1
	ci := float32(math.Ldexp(1, 1-bits)) // 2^-3 or 2^-7
	return func(x []float32, dst []byte) bool {
		if useSIMD && haveF16C {
			return exl2QuantizeAVX2(bits, x, dst)
		}
		var w [exl2Chunk]float32
		nonFinite := false
		for i, v := range x[:exl2Chunk] {
			w[i] = rn16(v)
			nonFinite = nonFinite || math.IsNaN(float64(v)) || math.IsInf(float64(v), 0)
		}
		exl2Hadamard(&w)
		codeBytes := exl2Chunk * bits / 8
		for g := 0; g < 2; g++ {
			group := w[32*g : 32*g+32]
			var amax float32
			for _, v := range group {
				if a := float32(math.Abs(float64(v))); a > amax { // max.f16: a NaN never wins
					amax = a
				}
			}
			binary.LittleEndian.PutUint16(dst[codeBytes+2*g:], safetensors.Float32ToFP16(amax*ci))
			for i, v := range group {
				qf := rn16(v / amax)
				z := rn16of64(float64(qf)*m + m)
				q := 0.0
				if !math.IsNaN(float64(z)) {
					q = min(max(math.RoundToEven(float64(z)), 0), qmax)
				}
				e := 32*g + i
				if bits == 8 {
					dst[e] = uint8(q)
				} else if e&1 == 0 {
					dst[e/2] = uint8(q)
				} else {
					dst[e/2] |= uint8(q) << 4
				}
			}
		}
		return nonFinite
	}
}

// exl2Dequantizer is the engine's read of one chunk.
func exl2Dequantizer(bits int) func(src []byte, dst []float32) {
	m := 1 << (bits - 1)
	return func(src []byte, dst []float32) {
		if useSIMD && haveF16C {
			exl2DequantizeAVX2(bits, src, dst)
			return
		}
		var w [exl2Chunk]float32
		codeBytes := exl2Chunk * bits / 8
		for g := 0; g < 2; g++ {
			scale := safetensors.FP16ToFloat32(binary.LittleEndian.Uint16(src[codeBytes+2*g:]))
			for i := 0; i < 32; i++ {
				e := 32*g + i
				var q int
				if bits == 8 {
					q = int(src[e])
				} else {
					q = int(src[e/2]>>(4*(e&1))) & 0xf
				}
				w[e] = rn16(float32(q-m) * scale)
			}
		}
		exl2Hadamard(&w)
		for i := range w {
			dst[i] = rn16(w[i] * (1.0 / 32))
		}
	}
}

// exl2QuantizeAVX2 is exl2Quantizer's chunk with the AVX2 and F16C
// kernels: the same operations lane by lane (the butterfly's rn16 is
// VCVTPS2PH and back, a NaN made sign | 0x7fc00000; rn16of64(qf·m + m) is
// rn16 of the float32 sum, as that sum is exact whenever |qf| >= 2^-13
// and rounds to m in fp16 otherwise, before and after a float32 rounding).
func exl2QuantizeAVX2(bits int, x []float32, dst []byte) bool {
	var w [exl2Chunk]float32
	a0, a1, top := exl2EncRotAVX2(&w, (*[exl2Chunk]float32)(x[:exl2Chunk]))
	m := float32(int(1) << (bits - 1))
	ci := float32(math.Ldexp(1, 1-bits))
	codeBytes := exl2Chunk * bits / 8
	binary.LittleEndian.PutUint16(dst[codeBytes:], safetensors.Float32ToFP16(a0*ci))
	binary.LittleEndian.PutUint16(dst[codeBytes+2:], safetensors.Float32ToFP16(a1*ci))
	g0, g1 := (*[32]float32)(w[:32]), (*[32]float32)(w[32:])
	qmax := int32(2*m - 1)
	if bits == 8 {
		exl2Codes8AVX2((*[32]uint8)(dst[:32]), g0, a0, m, qmax)
		exl2Codes8AVX2((*[32]uint8)(dst[32:64]), g1, a1, m, qmax)
	} else {
		exl2Codes4AVX2((*[16]uint8)(dst[:16]), g0, a0, m, qmax)
		exl2Codes4AVX2((*[16]uint8)(dst[16:32]), g1, a1, m, qmax)
	}
	return top != 0
}

// exl2DequantizeAVX2 is exl2Dequantizer's chunk with the AVX2 and F16C
// kernels.
func exl2DequantizeAVX2(bits int, src []byte, dst []float32) {
	codeBytes := exl2Chunk * bits / 8
	s0 := safetensors.FP16ToFloat32(binary.LittleEndian.Uint16(src[codeBytes:]))
	s1 := safetensors.FP16ToFloat32(binary.LittleEndian.Uint16(src[codeBytes+2:]))
	out := (*[exl2Chunk]float32)(dst[:exl2Chunk])
	if bits == 8 {
		exl2Dec8AVX2(out, (*[exl2Chunk]uint8)(src[:exl2Chunk]), s0, s1, 128)
	} else {
		exl2Dec4AVX2(out, (*[exl2Chunk / 2]uint8)(src[:exl2Chunk/2]), s0, s1, 8)
	}
}

// rn16s is rn16 of every element of x, in place.
func rn16s(x []float32) {
	n := 0
	if useSIMD && haveF16C {
		n = simdLen(len(x))
		if n > 0 {
			rn16sAVX2(x[:n])
		}
	}
	for i := n; i < len(x); i++ {
		x[i] = rn16(x[i])
	}
}
