package compression

import "math"

// SGLang's fp4_e2m1 KV cache ("KVFP4", --kv-cache-dtype fp4_e2m1), as
// SGLang 0.5.10.post1 writes it: KVFP4QuantizeUtil.batched_quantize and
// batched_dequantize (srt/layers/quantization/kvfp4_tensor.py:32-112, the
// whole file; pure torch under @torch.compile), called by
// MHATokenToKVPoolFP4 (srt/mem_cache/memory_pool.py:1084-1225).
//
// Blocks of 16 consecutive elements of a token's [heads × head_dim] row
// (view(b, m*n//16, 16), line 46; kvlib keeps blocks within a head and
// refuses head_dim % 16 != 0, where SGLang's would straddle two heads).
// One scale byte per block, sf = e + 127 with
// e = ceil(log2(max(amax/6, 1e-10))) (lines 48-50): a power of two that
// maps the block's max to at most 6, not OCP MXFP4's floor rule. Each
// element scaled = x / 2^e (float32) gets sign bit (scaled < 0) << 3 and
// a magnitude index counting the E2M1 bounds {0.25, 0.75, 1.25, 1.75, 2.5,
// 3.5, 5} it reaches (lines 54-64): round to nearest with ties away from
// zero (1.25 → 1.5, 2.5 → 3, 5 → 6), beyond 5 saturated at 6; a negative
// value that rounds to 0 keeps its sign (0x8) unless its quotient
// underflowed to -0. Element 2i in the low nibble (line 68). The read:
// E2M1 value × 2^(sf-127) in float32, then .to(bfloat16) whatever the
// model's dtype (lines 89-112): exact for BF16 and F32 caches, as an E2M1
// value times a power of two is a bfloat16; an F16 cache holds it rounded
// to f16 (a value past 65504, or below f16's subnormals, differs from the
// bf16 SGLang reads). With a checkpoint's KV scales SGLang first divides
// the cache by them (srt/mem_cache/memory_pool.py, set_kv_buffer) and
// never multiplies back; kvlib models the unscaled write.
//
// Numerics: SGLang compiles the quantizer (Inductor on CUDA, which turns
// amax/6 into amax × float32(1/6) and keeps float32 through log2 and
// ceil); kv-compress computes that product and then the exact
// ceil(log2), which is what the compiled kernel gives for every bf16 and
// f16 amax (their amax/6 is never within a few ulp of a power of two); a
// float32 amax within a few ulp above 6·2^k may round the other way in
// CUDA's log2f [unverified]. A block holding a NaN or an Inf gets scale
// byte 0 and every code 0 on this CPU torch (tests/make_engine_vectors.py
// runs SGLang's file); kv-compress refuses such caches before they reach
// the format. The stored block here is [8 code bytes | scale byte]; SGLang
// keeps the same bytes in two buffers (k_buffer, k_scale_buffer).
const (
	kvfp4Block = 16                 // elements per scale
	kvfp4Bytes = kvfp4Block/2 + 1   // 8 bytes of nibbles, 1 scale byte
	kvfp4Sixth = float32(1.0 / 6.0) // Inductor's reciprocal of the constant 6 (div_prim)
)

// e2m1Values are the E2M1 magnitudes by code (the low three bits).
var e2m1Values = [8]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6}

// kvfp4Exponent is e = ceil(log2(max(p, 1e-10))) for p = amax × (1/6),
// exactly: the smallest e with 2^e >= p, at least -33 (1e-10's).
func kvfp4Exponent(amax float32) int {
	p := float64(amax * kvfp4Sixth)
	if p <= 1e-10 {
		return -33
	}
	frac, exp := math.Frexp(p) // p = frac × 2^exp, frac in [0.5, 1)
	if frac == 0.5 {
		return exp - 1 // p is a power of two
	}
	return exp
}

// kvfp4Code is one element's 4-bit code: x / 2^e compared with the bounds.
// The quotient is rounded to float32 as torch's division rounds it: a tiny
// negative value in a block of large ones underflows to -0, which is not
// < 0 and gets sign bit 0 (SGLang's own code agrees, tests/test_sglang_formats.py).
// inv is 2^-e (e in [-33, 127]: x·inv never leaves float64's normal
// range). Branch-free: the quotient's float32 bits order as magnitudes,
// so each bound reached adds one by an unsigned borrow.
func kvfp4Code(x float32, inv float64) uint8 {
	u := math.Float32bits(float32(float64(x) * inv)) // exact in float64, then one rounding
	a := u &^ 0x80000000
	c := uint8(u >> 31 & (-a >> 31) << 3) // the sign bit of a quotient < 0 (not of -0)
	for _, b := range kvfp4Bounds {
		c += uint8((b - 1 - a) >> 31) // a >= b
	}
	return c
}

// kvfp4Bounds are the float32 bits of the E2M1 bounds SGLang counts,
// {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5} (a value on a bound rounds up).
var kvfp4Bounds = [7]uint32{0x3e800000, 0x3f400000, 0x3fa00000, 0x3fe00000, 0x40200000, 0x40600000, 0x40a00000}

// sglangQuantizeFP4 writes one block of 16 values.
func sglangQuantizeFP4(x []float32, dst []byte) bool {
	top := absMaxBits(x[:kvfp4Block])
	if top >= 0x7f800000 { // NaN or Inf: scale byte 0, codes 0, as CPU torch stores it
		clear(dst[:kvfp4Bytes])
		return true
	}
	e := kvfp4Exponent(math.Float32frombits(top))
	inv := math.Ldexp(1, -e)
	if useSIMD { // the float32 product is the float64 one rounded once: 2^-e (e in [-33, 127]) is a float32
		kvfp4CodesAVX2((*[kvfp4Block / 2]byte)(dst[:kvfp4Block/2]), (*[kvfp4Block]float32)(x[:kvfp4Block]), float32(inv))
		dst[kvfp4Block/2] = uint8(e + 127)
		return false
	}
	for i := 0; i < kvfp4Block; i += 2 {
		dst[i/2] = kvfp4Code(x[i], inv) | kvfp4Code(x[i+1], inv)<<4
	}
	dst[kvfp4Block/2] = uint8(e + 127)
	return false
}

// sglangDequantizeFP4 is batched_dequantize of one block: the E2M1 value,
// signed, times 2^(sf-127) in float32 (sf 253 with code 6: +Inf).
func sglangDequantizeFP4(src []byte, dst []float32) {
	scale := float32(math.Ldexp(1, int(src[kvfp4Block/2])-127))
	if useSIMD { // (±v)·scale·1 has the bits of v·scale with the sign set: scale is > 0 (or +Inf)
		nvfp4DecAVX2((*[nvfp4Block]float32)(dst[:kvfp4Block]), (*[nvfp4Block / 2]byte)(src[:kvfp4Block/2]), scale, 1)
		return
	}
	for i := 0; i < kvfp4Block; i++ {
		c := src[i/2] >> (4 * (i & 1)) & 0xf
		dst[i] = math.Float32frombits(math.Float32bits(e2m1Values[c&7]*scale) | uint32(c&8)<<28) // c&8: negative
	}
}
