package compression

import (
	"encoding/binary"
	"math"
	"math/bits"
	"sync"

	"kvlib/pkg/safetensors"
)

// vLLM 0.33.0's int4_per_token_head (v1/attention/ops/int4_per_token_head.py).
//
// The write, reshape_and_cache_int4 (:856-879): each head vector through a
// randomised Hadamard transform, key.float() times seeded signs, then the
// unnormalised Sylvester Hadamard (fast_hadamard_transform, :1075-1122),
// block-diagonal in blocks of the largest power of two dividing head_dim
// (the same signs in every block, :1146-1167), cast back to the cache's
// dtype (:867-868); the signs are 2·bernoulli(0.5) - 1 under
// torch.Generator().manual_seed(0x9E3779B9) (:1132-1143): -1 where bit 23
// of the i-th MT19937 output is set (torch's CPU Bernoulli:
// u = (x & 0xFFFFFF)·2^-24 < 0.5 gives 1). The Hadamard here is vLLM's
// float32 butterfly (:1114-1122), exact up to float32 rounding; which one
// a GPU runs (:1075-1112): hadacore on NVIDIA SM80+ and the Triton MMA
// kernel for 16 <= d <= 128 elsewhere, both through bfloat16 (hadacore's
// internal rounding was not read: docs/research/vllm-0.33.0-kv-formats.md
// 2b), and this butterfly only for d < 16 or d > 128 without hadacore: on
// the usual GPU the rotated values can differ from these by a bf16 step.
//
// Then the Triton kernel _reshape_cache_int4_kernel (:64-255), per token
// and head on the rotated values widened to float32: scale =
// max((max - min)/15, 1e-6), zero point zp = clamp(round_half_away(-min /
// scale), 0, 15), q = clamp(round_half_away(x·(1/scale) + zp), 0, 15);
// element 2j in the low nibble; the scale stored as float32 with zp in its
// low four mantissa bits ((bits &^ 0xF) | zp, :158-162). The read (:549-554)
// takes zp from those bits and the truncated scale and folds them into its
// dot products (:573-574, 606-609), in the rotated basis; attention rotates
// the query the same way and its output back (:917-951). kv-compress
// restores the equivalent cache in the model's basis, its own form of
// that arithmetic: x̂ = (q - zp)·scale, then signs ⊙ H(x̂)/block (float32).
// Not modelled: the query's rotation rounded to the model's dtype.
// Divisions are IEEE here, div.full.f32 on the GPU (within 2 ulp); the
// code's x·inv + zp is one fused rounding, as Triton compiles it by
// default (Triton's interpreter, which tests/vllm_triton_harness.py runs
// the write path in, computes it unfused: 2 codes of the vectors differ
// there, and the test pins both). An odd head_dim is refused, as vLLM
// asserts (:273).
var vllmInt4 = &engineFormat{name: "int4_per_token_head", bits: 4, perHead: true, evidence: EvidenceExecuted,
	source:     "v1/attention/ops/int4_per_token_head.py:64-255 (_reshape_cache_int4_kernel), 856-879 (reshape_and_cache_int4), 1075-1167 (the RHT)",
	quantizeDT: vllmInt4Quantize, dequantize: vllmInt4Dequantize,
	quantizeRun: vllmInt4QuantizeRun, dequantizeRun: vllmInt4DequantizeRun}

// vllmSignSeed is the RHT's generator seed, 0x9E3779B9 + round_idx·0x517CC1B7 with round_idx 0.
const vllmSignSeed = 0x9E3779B9

// vllmSignCache holds the signs of each power-of-two block size, made
// once: every head vector of a cache takes the same ones.
var vllmSignCache [32]struct {
	once  sync.Once
	signs []bool
}

// vllmSignsOf are vllmSigns(b) for a power of two b, cached.
func vllmSignsOf(b int) []bool {
	c := &vllmSignCache[bits.TrailingZeros(uint(b))]
	c.once.Do(func() { c.signs = vllmSigns(b) })
	return c.signs
}

// vllmSignMaskCache holds vllmSignsOf(b) as float32 sign bits (0x80000000
// where the sign is -1): XORed in, the negation with no branch on a sign
// that is -1 about half the time at random.
var vllmSignMaskCache [32]struct {
	once  sync.Once
	masks []uint32
}

// vllmSignMasksOf are vllmSignsOf(b) as sign bits, cached.
func vllmSignMasksOf(b int) []uint32 {
	c := &vllmSignMaskCache[bits.TrailingZeros(uint(b))]
	c.once.Do(func() {
		c.masks = make([]uint32, b)
		for i, neg := range vllmSignsOf(b) {
			if neg {
				c.masks[i] = 0x80000000
			}
		}
	})
	return c.masks
}

// vllmSigns are the first n signs of the RHT: true where the sign is -1.
func vllmSigns(n int) []bool {
	mt := newMT19937(vllmSignSeed)
	out := make([]bool, n)
	for i := range out {
		out[i] = mt.next()&(1<<23) != 0
	}
	return out
}

// vllmRHT rotates a head vector in place as vLLM's CPU path does: signs,
// then the float32 butterfly in blocks of the largest power of two
// dividing len(x); inverse additionally divides by the block size (the
// transform is its own inverse up to that factor).
func vllmRHT(x []float32, inverse bool) {
	d := len(x)
	b := d & -d
	signs := vllmSignMasksOf(b) // a negation is the sign bit flipped, NaN included
	for lo := 0; lo < d; lo += b {
		blk := x[lo : lo+b]
		n := simdLen(b) // the AVX2 kernels' share, 8 at a time
		if !inverse {
			if n > 0 {
				xorBitsAVX2(blk[:n], signs[:n])
			}
			for i, m := range signs[n:] {
				blk[n+i] = math.Float32frombits(math.Float32bits(blk[n+i]) ^ m)
			}
		}
		sylvesterButterfly(blk)
		if inverse {
			inv := float32(1) / float32(b) // a power of two: exact
			if n > 0 {
				scaleXorBitsAVX2(blk[:n], signs[:n], inv)
			}
			for i, m := range signs[n:] {
				blk[n+i] = math.Float32frombits(math.Float32bits(blk[n+i]*inv) ^ m)
			}
		}
	}
}

// sylvesterButterfly is the unnormalised Sylvester Hadamard transform of
// a power-of-two run in place, in float32, stride 1 first (vLLM's PyTorch
// butterfly, int4_per_token_head.py:1114-1122): (a+b, a-b) at strides 1, 2,
// 4, ...; its output i is the sum over j of (-1)^popcount(i&j) x[j].
func sylvesterButterfly(blk []float32) {
	b := len(blk)
	if useSIMD && b >= simdBlock {
		// the same stages: hadamard8 runs h = 1, 2, 4 on each block of 8,
		// and hadamardStage each wider one, a+b and a-b as here
		hadamard8(blk)
		for h := simdBlock; h < b; h <<= 1 {
			hadamardStage(blk, h)
		}
		return
	}
	for h := 1; h < b; h <<= 1 {
		for i := 0; i < b; i += 2 * h {
			for j := i; j < i+h; j++ {
				a, c := blk[j], blk[j+h]
				blk[j], blk[j+h] = a+c, a-c
			}
		}
	}
}

// roundHalfAway is the kernel's where(v >= 0, trunc(v + 0.5), trunc(v - 0.5)).
func roundHalfAway(v float32) float32 {
	if v >= 0 {
		return float32(math.Trunc(float64(float32(v + 0.5))))
	}
	return float32(math.Trunc(float64(float32(v - 0.5))))
}

// vllmInt4Quantize writes one head vector of a cache of dtype dt: d/2
// bytes of nibbles, then the float32 scale carrying the zero point.
func vllmInt4Quantize(x []float32, dst []byte, dt safetensors.DType) bool {
	var buf [512]float32 // head_dim <= 512 without an allocation
	if len(x) > len(buf) {
		return vllmInt4QuantizeInto(x, dst, dt, make([]float32, len(x)))
	}
	return vllmInt4QuantizeInto(x, dst, dt, buf[:])
}

// vllmInt4QuantizeRun is vllmInt4Quantize over a run of whole head vectors
// (quantizeRun), one scratch for the run.
func vllmInt4QuantizeRun(x []float32, dst []byte, r blockRun) (nonFinite bool, _ int) {
	d, hs := r.elems, r.bytes
	y := make([]float32, d)
	for v := 0; v < len(x)/d; v++ {
		nonFinite = vllmInt4QuantizeInto(x[v*d:(v+1)*d], dst[v*hs:(v+1)*hs], r.dtype, y) || nonFinite
	}
	return nonFinite, 0
}

// vllmInt4QuantizeInto is vllmInt4Quantize with a scratch of at least
// len(x) values.
func vllmInt4QuantizeInto(x []float32, dst []byte, dt safetensors.DType, scratch []float32) bool {
	d := len(x)
	y := append(scratch[:0], x...)
	vllmRHT(y, false)
	if dt != safetensors.F32 { // an F32 cache's rounding is the identity
		round := dtypeRounding(dt)
		for i, v := range y {
			y[i] = round(v)
		}
	}
	lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
	nonFinite := absMaxBits(x) >= 0x7f800000 // a NaN or an Inf
	m := 0
	if n := simdLen(d); n > 0 {
		// the same least and largest but for the sign of a zero, which the
		// scale and zero point below do not see ((hi - lo)/15 of zeros is a
		// zero, floored at 1e-6; -lo/scale of a zero rounds to code 0)
		lo, hi = minMaxNumAVX2(y[:n])
		m = n
	}
	for _, v := range y[m:] {
		if v < lo { // tl.min and tl.max skip a NaN, as these comparisons do
			lo = v
		}
		if v > hi {
			hi = v
		}
	}
	scale := (hi - lo) / 15
	if !(scale > 1e-6) { // tl.maximum(., 1e-6)
		scale = 1e-6
	}
	zp := clampNibble(roundHalfAway(-lo / scale))
	inv := 1 / scale
	codes := dst[:d/2]
	// k * inv_k + k_zp_f (:137-138): one use of the product, and Triton fuses by default
	// (enable_fp_fusion): one rounding, as the GPU most likely computes it. Here
	// float32(math.FMA(v, inv, zp)) in float64, written as a product and a sum: the
	// float64 product of two float32s is exact, so the sum is the fused one's rounding.
	inv64, zp64 := float64(inv), float64(zp)
	n := 0
	if useSIMD {
		n = d &^ 7
		if n > 0 {
			int4CodesAVX2(codes[:n/2], y[:n], inv, zp) // the same, 8 codes at a time
		}
	}
	for i := n; i+1 < d; i += 2 {
		q0 := vllmNibble(float32(float64(y[i])*inv64 + zp64))
		q1 := vllmNibble(float32(float64(y[i+1])*inv64 + zp64))
		codes[i/2] = q0 | q1<<4
	}
	binary.LittleEndian.PutUint32(dst[d/2:], math.Float32bits(scale)&^0xF|uint32(zp))
	return nonFinite
}

// vllmNibble is clampNibble(roundHalfAway(t)) as a code: 0 for a NaN and
// below 0 (t - 0.5 truncates to 0 or less), else trunc(float32(t + 0.5))
// up to 15.
func vllmNibble(t float32) uint8 {
	if !(t >= 0) {
		return 0
	}
	u := t + 0.5
	if u >= 15 {
		return 15
	}
	return uint8(u)
}

// clampNibble is clamp(v, 0, 15), and 0 for a NaN (a rotation past
// float32's range; the GPU's conversion of it is not specified).
func clampNibble(v float32) float32 {
	if v != v {
		return 0
	}
	return min(max(v, 0), 15)
}

// vllmInt4Dequantize reads one head vector back into the model's basis.
func vllmInt4Dequantize(src []byte, dst []float32) {
	d := len(dst)
	bits := binary.LittleEndian.Uint32(src[d/2:])
	zp, scale := float32(bits&0xF), math.Float32frombits(bits&^0xF)
	var t [16]float32 // (code - zp)·scale of each code, as the loop would compute it
	for k := range t {
		t[k] = (float32(k) - zp) * scale
	}
	for i := 0; i+1 < d; i += 2 {
		c := src[i/2]
		dst[i], dst[i+1] = t[c&0xF], t[c>>4]
	}
	vllmRHT(dst, true)
}

// vllmInt4DequantizeRun is vllmInt4Dequantize over a run of whole head
// vectors (dequantizeRun).
func vllmInt4DequantizeRun(src []byte, dst []float32, r blockRun) {
	d, hs := r.elems, r.bytes
	for v := 0; v < len(dst)/d; v++ {
		vllmInt4Dequantize(src[v*hs:(v+1)*hs], dst[v*d:(v+1)*d])
	}
}

// An mt19937 is the 32-bit Mersenne Twister (std::mt19937, which torch's
// CPU generator is), seeded as std::mt19937(seed).
type mt19937 struct {
	state [624]uint32
	i     int
}

func newMT19937(seed uint32) *mt19937 {
	m := &mt19937{i: 624}
	m.state[0] = seed
	for k := 1; k < 624; k++ {
		p := m.state[k-1]
		m.state[k] = 1812433253*(p^p>>30) + uint32(k)
	}
	return m
}

func (m *mt19937) next() uint32 {
	if m.i >= 624 {
		for k := 0; k < 624; k++ {
			y := m.state[k]&0x80000000 | m.state[(k+1)%624]&0x7fffffff
			v := m.state[(k+397)%624] ^ y>>1
			if y&1 != 0 {
				v ^= 0x9908b0df
			}
			m.state[k] = v
		}
		m.i = 0
	}
	y := m.state[m.i]
	m.i++
	y ^= y >> 11
	y ^= y << 7 & 0x9d2c5680
	y ^= y << 15 & 0xefc60000
	return y ^ y>>18
}
