package compression

import (
	"encoding/binary"
	"fmt"
	"math"

	"kvlib/pkg/safetensors"
)

// ExLlamaV3's quantized cache (CacheLayer_quant, K and V bits 2 to 8 set
// apart: -cq K,V), as ExLlamaV3 1.6.5 writes it (the wheel
// exllamav3-1.6.5-py3-none-any, which ships the CUDA sources it compiles
// with -O3 --use_fast_math; v3/ is exllamav3/exllamav3_ext/).
//
// quant_block_x4 (v3/cache/q_cache_kernels.cuh:61-156), per group of 32
// contiguous elements of a token's [heads × head_dim] vector (kvlib keeps
// groups within a head: head_dim % 32 == 0, which ExLlamaV3's attention
// needs too, modules/attention_fn/dispatch.py:127): the model's fp16
// values, the unnormalised Sylvester Hadamard of 32 in float32 (natural
// order, no signs), times float32(1/√32) (0x3E3504F3); s = max|v| + 1e-10
// in float32; t = v × (1/s); y = t·m + m (m = 2^(bits-1), one rounding);
// q = clamp(floor(y), 0, 2^bits - 1), NaN 0: a midpoint grid with no exact
// zero. The scale is stored as fp16 RN16(s), the codes as bit planes of
// widths 8, 4, 2, 1 (those set in bits, the first holding the top bits; a
// plane of width w takes w little-endian 32-bit words, value j at word
// (j·w)/32, bit (j·w)%32; :130-152; the header comment at :15-17 says
// otherwise for 3, 5, 6 and 7 bits, and is wrong: the Triton unpacker
// agrees with the code). The read, dequant_block_x4 (:160-236):
// sf = fp16 scale × (1/√32), sm = sf × 2^-(bits-1), v = (q - (m - ½)) × sm,
// the same butterfly, then RN16. Under --use_fast_math the kernel's 1/s
// is MUFU.RCP, within an ulp of the IEEE reciprocal computed here: a code
// whose t·m lands within an ulp of an integer may differ (about 5e-7 of
// codes at 2 and 4 bits, docs/research/exllama-kv-formats.md B3).
var exllamaV3 = &engine{
	name:    "exllamav3",
	version: "ExLlamaV3 1.6.5 (wheel; its CUDA sources)",
	flag:    "-cq %s,%s",
	blockRule: "kvlib refuses ExLlamaV3's %[1]s-bit cache for head_dim %[2]d: its groups of %[3]d run along each token's " +
		"[heads × head_dim] vector (v3/cache/q_cache.cu:211-212) and would straddle two heads",
	formats: exl3Formats(),
	detail: func(*engineFormat) string {
		return "read: from the wheel's CUDA sources (files cited) and the compiled kernels' SASS; tests/exllama_reference.py, " +
			"a NumPy reference written from them, pins the codec bit for bit; the GPU's approximate reciprocal (MUFU.RCP) " +
			"is the IEEE one here, and ExLlamaV3's kernels have not run on these bytes (they need CUDA)"
	},
}

// exl3Formats are the widths 2 to 8, each a format named by its bits.
func exl3Formats() []*engineFormat {
	var out []*engineFormat
	for bits := 2; bits <= 8; bits++ {
		out = append(out, &engineFormat{
			name: fmt.Sprint(bits), bits: bits, elems: exl3Group, bytes: 4*bits + 2, evidence: EvidenceRead,
			flags:    fmt.Sprintf("-cq %d,%d (CacheLayer_quant, k_bits=%d, v_bits=%d)", bits, bits, bits, bits),
			source:   "v3/cache/q_cache_kernels.cuh:61-156 (quant_block_x4), 160-236 (dequant_block_x4); exllamav3/cache/quant.py",
			quantize: exl3Quantizer(bits), dequantize: exl3Dequantizer(bits),
		})
	}
	return out
}

const exl3Group = 32

var exl3R32 = math.Float32frombits(0x3E3504F3) // float32(1/√32)

// exl3Hadamard is the float32 butterfly of 32 in natural order, in place.
func exl3Hadamard(v *[exl3Group]float32) {
	for h := 1; h < exl3Group; h <<= 1 {
		for base := 0; base < exl3Group; base += 2 * h { // the pairs (i, i|h): i&h == 0
			for i := base; i < base+h; i++ {
				a, c := v[i], v[i+h]
				v[i], v[i+h] = a+c, a-c
			}
		}
	}
}

// exl3Planes are the bit-plane widths of a code of the given bits, the
// first holding the top bits.
func exl3Planes(bits int) []int {
	var out []int
	for _, w := range []int{8, 4, 2, 1} {
		if bits&w != 0 {
			out = append(out, w)
		}
	}
	return out
}

// exl3Quantizer writes one group of 32: 4·bits bytes of bit planes, then
// the fp16 scale.
func exl3Quantizer(bits int) func(x []float32, dst []byte) bool {
	m := float32(int(1) << (bits - 1))
	qmax := float64(int(1)<<bits - 1)
	planes := exl3Planes(bits)
	return func(x []float32, dst []byte) bool {
		if useSIMD && haveF16C {
			s, top := exl3EncAVX2(&dst[0], (*[exl3Group]float32)(x[:exl3Group]), m, int32(qmax), bits)
			binary.LittleEndian.PutUint16(dst[4*bits:4*bits+2], safetensors.Float32ToFP16(s))
			return top != 0
		}
		var v [exl3Group]float32
		nonFinite := false
		for i, e := range x[:exl3Group] {
			v[i] = rn16(e)                                                        // the model's fp16 values
			nonFinite = nonFinite || math.Float32bits(e)&0x7f800000 == 0x7f800000 // NaN or ±Inf
		}
		exl3Hadamard(&v)
		var amax float32
		for i := range v {
			v[i] = float32(v[i] * exl3R32)
			if a := float32(math.Abs(float64(v[i]))); a > amax { // fmaxf: a NaN never wins
				amax = a
			}
		}
		s := float32(amax + 1e-10)
		inv := 1 / s
		var q [exl3Group]uint32
		for i := range v {
			t := float32(v[i] * inv)
			y := float64(float32(t*m + m)) // t·m is exact: one rounding, fused or not
			if !math.IsNaN(y) {
				q[i] = uint32(min(max(math.Floor(y), 0), qmax))
			}
		}
		wb, rem := 0, bits
		for _, w := range planes { // plane of width w: 32/w fields a word, w words
			rem -= w
			per := 32 / w
			for k := 0; k < w; k++ {
				var word uint32
				for j := per*k + per - 1; j >= per*k; j-- {
					word = word<<w | q[j]>>rem&(1<<w-1)
				}
				binary.LittleEndian.PutUint32(dst[4*(wb+k):], word)
			}
			wb += w
		}
		binary.LittleEndian.PutUint16(dst[4*bits:], safetensors.Float32ToFP16(s))
		return nonFinite
	}
}

// exl3Dequantizer is dequant_block_x4 of one group.
func exl3Dequantizer(bits int) func(src []byte, dst []float32) {
	m := float32(int(1) << (bits - 1))
	planes := exl3Planes(bits)
	return func(src []byte, dst []float32) {
		if useSIMD && haveF16C {
			sf := float32(safetensors.FP16ToFloat32(binary.LittleEndian.Uint16(src[4*bits:4*bits+2])) * exl3R32)
			sm := float32(sf * float32(math.Ldexp(1, 1-bits)))
			exl3DecAVX2((*[exl3Group]float32)(dst[:exl3Group]), &src[0], sm, m-0.5, bits)
			return
		}
		var q [exl3Group]uint32
		wb := 0
		for _, w := range planes {
			per := 32 / w
			for k := 0; k < w; k++ {
				word := binary.LittleEndian.Uint32(src[4*(wb+k):])
				for j := per * k; j < per*k+per; j++ {
					q[j] = q[j]<<w | word&(1<<w-1)
					word >>= w
				}
			}
			wb += w
		}
		sf := float32(safetensors.FP16ToFloat32(binary.LittleEndian.Uint16(src[4*bits:])) * exl3R32)
		sm := float32(sf * float32(math.Ldexp(1, 1-bits)))
		var v [exl3Group]float32
		for j := range q {
			v[j] = float32((float32(q[j]) - (m - 0.5)) * sm)
		}
		exl3Hadamard(&v)
		for j := range v {
			dst[j] = rn16(v[j])
		}
	}
}
