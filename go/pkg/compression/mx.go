package compression

import (
	"math"
)

// The OCP Microscaling formats (OCP MX v1.0; its conversion rule, the
// section the research note could not pin, docs/research/tensorrt-llm-1.2.1-kv-formats.md 4):
// blocks of 32 elements sharing one E8M0 scale X = 2^e,
// e = floor(log2(amax)) - emax_elem (emax 8 for FP8 E4M3, 2 for FP4 E2M1),
// clamped to [-127, 127] (an all-zero block takes -127), stored as the
// byte e + 127; each element V/X rounded to nearest even in the element
// format and saturated at its largest normal (448, 6), since V/X can reach
// 2^(emax+1). The read is element × X. No serving engine writes a KV cache
// in MX at the releases kvlib follows (TensorRT-LLM 1.2.1 uses MX only for
// weights and activations, and rounds its shared exponent up, not down:
// docs/research/tensorrt-llm-1.2.1-kv-formats.md section 4), so these are
// a format of their own, as the OCP specification defines it.
var ocpMX = &engine{
	name:    "ocp",
	version: "OCP Microscaling Formats (MX) v1.0 (the specification's conversion rule)",
	flag:    "(no engine flag: the OCP MX %s format)",
	blockRule: "kvlib refuses %[1]s for head_dim %[2]d: an MX block of %[3]d elements shares one scale and would " +
		"straddle two heads",
	detail: func(*engineFormat) string {
		return "read: from the OCP MX v1.0 specification's conversion rule; tests/mx_reference.py pins the codec bit for " +
			"bit, its element casts and E8M0 scales checked against ml_dtypes'"
	},
	formats: []*engineFormat{
		{name: "mxfp8_e4m3", bits: 8, elems: mxBlock, bytes: mxBlock + 1, evidence: EvidenceRead,
			source:   "OCP MX v1.0: MXFP8 E4M3 (emax 8, largest normal 448) and the conversion rule",
			quantize: mxQuantizer(mxFP8), dequantize: mxDequantizer(mxFP8)},
		{name: "mxfp4", bits: 4, elems: mxBlock, bytes: mxBlock/2 + 1, evidence: EvidenceRead,
			source:   "OCP MX v1.0: MXFP4 E2M1 (emax 2, largest normal 6) and the conversion rule",
			quantize: mxQuantizer(mxFP4), dequantize: mxDequantizer(mxFP4)},
	},
}

const mxBlock = 32

// An mxElement is an MX element format: its largest exponent, its codes
// and their values.
type mxElement struct {
	emax   int
	encode func(float64) uint8 // round to nearest even, saturating
	decode func(uint8) float32
	nibble bool // two codes per byte, element 2i in the low nibble
	// table, for a byte element, is decode as a table (the read's loop
	// indexes it rather than call decode a value)
	table *[256]float32
}

var (
	mxFP8 = mxElement{emax: 8, nibble: false,
		encode: func(v float64) uint8 { return fp8E4M3.encode(float32(v)) }, // |v| < 2^9: exact in float32
		decode: func(c uint8) float32 { return fp8E4M3.decode[c] }, table: fp8E4M3.decode}
	mxFP4 = mxElement{emax: 2, nibble: true, encode: e2m1RNE,
		decode: func(c uint8) float32 {
			v := e2m1Values[c&7]
			if c&8 != 0 {
				v = -v
			}
			return v
		}}
)

// e2m1RNE is E2M1 of v, round to nearest even, saturating at 6; a value
// that rounds to zero keeps its sign; ±Inf and NaN saturate. v is a
// float32 times a power of two (mxQuantizer), within float32's range in a
// finite block, so its comparisons are its float32's; branch-free,
// counting the bounds reached as kvfp4Code does.
func e2m1RNE(v float64) uint8 {
	u := math.Float32bits(float32(v))
	a := u &^ 0x80000000
	c := uint8(u >> 31 << 3)
	for _, b := range e2m1RNEBounds {
		c += uint8((b - 1 - a) >> 31) // a >= b
	}
	return c
}

// e2m1RNEBounds are the least float32 magnitudes of codes 1 to 7: past
// each midpoint between neighbours, or on it where the tie goes to the
// even (upper) code: > 0.25, >= 0.75, > 1.25, >= 1.75, > 2.5, >= 3.5, > 5.
var e2m1RNEBounds = [7]uint32{0x3e800001, 0x3f400000, 0x3fa00001, 0x3fe00000, 0x40200001, 0x40600000, 0x40a00001}

// mxExponent is the shared exponent of a block of largest |x| amax.
func mxExponent(amax float32, emax int) int {
	if amax == 0 {
		return -127
	}
	_, exp := math.Frexp(float64(amax)) // amax = f × 2^exp, f in [0.5, 1): floor(log2) = exp - 1
	return min(max(exp-1-emax, -127), 127)
}

func mxQuantizer(el mxElement) func(x []float32, dst []byte) bool {
	return func(x []float32, dst []byte) bool {
		top := absMaxBits(x[:mxBlock])
		nonFinite := top >= 0x7f800000
		e := mxExponent(math.Float32frombits(top), el.emax)
		n := mxBlock
		if el.nibble {
			n = mxBlock / 2
			clear(dst[:n])
		}
		if el.nibble && useSIMD && !nonFinite {
			// E2M1 of x·2^-e with nvfp4's kernel: the float32 product is the
			// float64 one rounded once, as 2^-e (|e| <= 127) is a float32
			inv32 := float32(math.Ldexp(1, -e))
			nvfp4CodesAVX2((*[nvfp4Block / 2]byte)(dst[:8]), (*[nvfp4Block]float32)(x[:16]), inv32)
			nvfp4CodesAVX2((*[nvfp4Block / 2]byte)(dst[8:16]), (*[nvfp4Block]float32)(x[16:32]), inv32)
			dst[n] = uint8(e + 127)
			return false
		}
		if !el.nibble && useSIMD { // the one 8-bit element, E4M3 (mxFP8)
			// E4M3 of x·2^-e with the kernel: the float32 product is the float64
			// one rounded once, as 2^-e (|e| <= 127) is a float32
			e4m3Encode(dst[:mxBlock], x[:mxBlock], float32(math.Ldexp(1, -e)))
			dst[n] = uint8(e + 127)
			return nonFinite
		}
		inv := math.Ldexp(1, -e)
		for i, v := range x[:mxBlock] {
			c := el.encode(float64(v) * inv) // exact: a power of two, |e| <= 127 inside float64's normals
			if !el.nibble {
				dst[i] = c
			} else {
				dst[i/2] |= c << (4 * (i & 1))
			}
		}
		dst[n] = uint8(e + 127)
		return nonFinite
	}
}

func mxDequantizer(el mxElement) func(src []byte, dst []float32) {
	return func(src []byte, dst []float32) {
		n := mxBlock
		if el.nibble {
			n = mxBlock / 2
		}
		scale := float32(math.Ldexp(1, int(src[n])-127))
		if src[n] == 0xff { // E8M0's NaN (only hostile bytes carry it)
			scale = float32(math.NaN())
		}
		if el.nibble && useSIMD { // E2M1 value · scale · 1: nvfp4's read
			nvfp4DecAVX2((*[nvfp4Block]float32)(dst[:16]), (*[nvfp4Block / 2]byte)(src[:8]), scale, 1)
			nvfp4DecAVX2((*[nvfp4Block]float32)(dst[16:32]), (*[nvfp4Block / 2]byte)(src[8:16]), scale, 1)
			return
		}
		if el.table != nil {
			for i, c := range src[:mxBlock] {
				dst[i] = el.table[c] * scale
			}
			return
		}
		for i := range dst[:mxBlock] {
			var c uint8
			if el.nibble {
				c = src[i/2] >> (4 * (i & 1)) & 0xf
			} else {
				c = src[i]
			}
			dst[i] = el.decode(c) * scale
		}
	}
}
