package compression

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"

	"kvlib/pkg/safetensors"
)

// vLLM 0.33.0's TurboQuant presets (--kv-cache-dtype turboquant_k8v4,
// turboquant_4bit_nc, turboquant_k3v4_nc, turboquant_3bit_nc): each pairs
// a K format with a V format (model_executor/layers/quantization/
// turboquant/config.py:20-41), so kv-compress has them as the engine's
// combos of five formats that are one role's half each:
//
//	turboquant_k8v4     K turboquant_k8     V turboquant_v4
//	turboquant_4bit_nc  K turboquant_k4_nc  V turboquant_v4
//	turboquant_k3v4_nc  K turboquant_k3_nc  V turboquant_v4
//	turboquant_3bit_nc  K turboquant_k3_nc  V turboquant_v3
//
// The writer is the default (AoS) store of the TURBOQUANT backend
// (v1/attention/backends/turboquant_attn.py:677-718, do_kv_cache_update):
// triton_turboquant_store (v1/attention/ops/triton_turboquant_store.py),
// one slot per token and KV head, [K | V], the slot rounded up to an even
// size (config.py:159-175; no padding for the head sizes taken here). On
// gfx950 with FlyDSL vLLM writes a struct-of-arrays layout instead
// (turboquant_soa/), not modelled.
//
// K, MSE presets (turboquant_k4_nc, turboquant_k3_nc; store.py:412-447,
// _tq_fused_store_mse:220-342): ||k|| = norm(k.float()), x̂ = k / (||k|| +
// 1e-8), y = x̂ @ PiT with PiT = H/√D the orthonormal Sylvester Hadamard
// (turboquant_attn.py:116-120: H of ±1 divided by math.sqrt(D) in float32,
// entries ±float32(1/float32(√D))), the same for every layer and with no
// random signs (turboquant_attn.py:409-416); each y_i's index is the count
// of Lloyd–Max midpoints <= y_i (the kernel's binary search, :278-293:
// ties go to the upper centroid); the midpoints are float32 (c_k +
// c_k+1)/2 of the sorted float32 centroids (turboquant_attn.py:467-472).
// Stored: the indices (4-bit: two a byte, even index low; 3-bit: 8 in 24
// bits, index k at bit 3k, 3 bytes little-endian), then fp16(||k||)
// (round to nearest even), ceil(3D/8 or D/2) + 2 bytes. The centroids are
// vLLM's Lloyd–Max solution for N(0, 1/D) (turboquant/centroids.py:31-80:
// float64 trapezoidal integration, then float32), embedded as the solver
// prints them (tqCentroidTables).
//
// Where vLLM leaves the order of a sum to the platform (torch's norm
// reduction and cuBLAS's float32 GEMM, VLLM_FLOAT32_MATMUL_PRECISION
// "highest": no TF32) kv-compress fixes one: ||k||² summed in float32 in
// index order (each square rounded) and a correctly rounded square root;
// y = fl(c·B(x̂)) with B the float32 butterfly (sylvesterButterfly, the
// one int4_per_token_head uses) and c the float32 entry of PiT. Another
// order moves y and ||k|| by an ulp or so, which changes a stored index
// only where y_i lies within such an ulp of a midpoint, and the stored
// norm only where ||k|| lies that close to an fp16 rounding boundary.
//
// The read (kv-compress's reconstruction; triton_turboquant_decode.py:
// 177-224 decode, 379-409 _tq_full_dequant_kv) with norm correction, which
// every MSE preset has (_nc): c̃ = c·(1/sqrt(Σc² + 1e-16)) (the centroid
// vector renormalised), z = fp16(||k||)·c̃, in the rotated basis that
// attention scores against q @ PiT (decode.py:519-528); kv-compress
// restores k̂ = PiT·z = c·B(z) (float32, Σc² in index order) in the model's
// basis, the same scores up to float32 rounding.
//
// K, turboquant_k8 (_tq_fused_store_fp8:144-211): k.float() cast to
// float8 e4m3 with no scale, as Triton's fp32 → fp8e4nv conversion
// compiles on SM90+ (cvt.rn.satfinite: round to nearest even, beyond 448
// the largest, counted as saturated). On SM89 Triton rounds through fp16
// first and below SM89 vLLM writes float8e4b15 (_use_fp8_e4b15,
// decode.py:25-35), neither modelled. Read: the e4m3 value.
//
// V, every preset (_store_quantized_value:25-136), per head vector in
// float32: vmin, vmax, scale = (vmax - vmin)/(2^b - 1) floored at 1e-8
// (where(scale > 1e-8, scale, 1e-8)), q = clamp(int(trunc((v - vmin)/scale
// + 0.5)), 0, 2^b - 1) (a NaN gives 0, as the GPU's conversion does),
// packed as the K indices, then fp16(scale) and fp16(vmin) (round to
// nearest even, each little-endian): ceil(bD/8) + 4 bytes. Read: q·scale +
// vmin with the fp16 values (decode.py:270, 299, 428, 450). The divisions
// are IEEE here and in Triton's interpreter; the GPU's div.full.f32 may
// differ from them by up to 2 ulp, which moves a code across a rounding
// boundary only there.
//
// Head sizes: the MSE keys need a power-of-two head_dim (PiT is
// next_pow2(D) wide, turboquant_attn.py:116-120, and x̂ @ PiT fails on any
// other), 3-bit codes whole groups of 8 (the kernels store D/8 groups,
// store.py:304-315), kv-compress's centroid tables head_dim 16 to 512;
// turboquant_v4 an even head_dim (kv-compress refuses an odd one: the
// kernel's last byte would take a code of a padding lane); turboquant_k8
// any. vLLM's backend takes fp16 and bf16 models (turboquant_attn.py:131-
// 134); an F32 cache goes through the same float32 arithmetic here, as the
// kernels would on those values.
//
// Layers: a TurboQuant cache keeps the first and last two layers of a
// dense model unquantized (the boundary rule, withEngineSkips).

// tqBoundary is TurboQuantConfig.get_boundary_skip_layers's n (config.py:180).
const tqBoundary = 2

// tqPairs names the presets in the refusal of a half in the other role.
const tqPairs = "TurboQuant presets (turboquant_k8v4, turboquant_4bit_nc, turboquant_k3v4_nc, turboquant_3bit_nc)"

const tqSource = "model_executor/layers/quantization/turboquant/config.py:20-41, 177-213 (presets, boundary layers), " +
	"centroids.py:31-80 (Lloyd-Max); v1/attention/ops/triton_turboquant_store.py:25-447; " +
	"v1/attention/backends/turboquant_attn.py:116-120, 409-473, 677-718; v1/attention/ops/triton_turboquant_decode.py:177-224, 321-455"

var (
	tqKeyFP8 = &engineFormat{name: "turboquant_k8", role: KeyRole, pairs: tqPairs, bits: 8, elems: 1, bytes: 1,
		evidence: EvidenceRead, source: tqSource, boundary: tqBoundary,
		encodeAll: encodeTQKeyFP8, decodeAll: decodeTQKeyFP8}
	tqKey4 = tqKeyFormat("turboquant_k4_nc", 4)
	tqKey3 = tqKeyFormat("turboquant_k3_nc", 3)
	tqVal4 = tqValueFormat("turboquant_v4", 4)
	tqVal3 = tqValueFormat("turboquant_v3", 3)
)

// tqCombos are the four presets, in config.py's order.
var tqCombos = []engineCombo{
	{name: "turboquant_k8v4", flag: "--kv-cache-dtype turboquant_k8v4", key: "turboquant_k8", value: "turboquant_v4",
		why: "turboquant_k8v4 is FP8 keys and 4-bit values (config.py:21-25)"},
	{name: "turboquant_4bit_nc", flag: "--kv-cache-dtype turboquant_4bit_nc", key: "turboquant_k4_nc", value: "turboquant_v4",
		why: "turboquant_4bit_nc is 4-bit Lloyd-Max keys with norm correction and 4-bit values (config.py:26-30)"},
	{name: "turboquant_k3v4_nc", flag: "--kv-cache-dtype turboquant_k3v4_nc", key: "turboquant_k3_nc", value: "turboquant_v4",
		why: "turboquant_k3v4_nc is 3-bit Lloyd-Max keys with norm correction and 4-bit values (config.py:31-35)"},
	{name: "turboquant_3bit_nc", flag: "--kv-cache-dtype turboquant_3bit_nc", key: "turboquant_k3_nc", value: "turboquant_v3",
		why: "turboquant_3bit_nc is 3-bit Lloyd-Max keys with norm correction and 3-bit values (config.py:36-40)"},
}

func tqKeyFormat(name string, b int) *engineFormat {
	return &engineFormat{name: name, role: KeyRole, pairs: tqPairs, bits: b, perHead: true, evidence: EvidenceExecuted,
		source: tqSource, boundary: tqBoundary,
		headSize:    func(d int) int { return (d*b+7)/8 + 2 },
		headRule:    func(d int) error { return tqKeyRule(name, b, d) },
		quantize:    func(x []float32, dst []byte) bool { return tqKeyQuantize(b, x, dst) },
		dequantize:  func(src []byte, dst []float32) { tqKeyDequantize(b, src, dst) },
		quantizeRun: tqKeyQuantizeRun(b), dequantizeRun: tqKeyDequantizeRun(b)}
}

func tqValueFormat(name string, b int) *engineFormat {
	return &engineFormat{name: name, role: ValueRole, pairs: tqPairs, bits: b, perHead: true, evidence: EvidenceExecuted,
		source: tqSource, boundary: tqBoundary,
		headSize:    func(d int) int { return (d*b+7)/8 + 4 },
		headRule:    func(d int) error { return tqValueRule(name, b, d) },
		quantize:    func(x []float32, dst []byte) bool { return tqValueQuantize(b, x, dst) },
		dequantize:  func(src []byte, dst []float32) { tqValueDequantize(b, src, dst) },
		quantizeRun: tqValueQuantizeRun(b), dequantizeRun: tqValueDequantizeRun(b)}
}

// tqKeyRule refuses the head sizes vLLM's MSE key store cannot write.
func tqKeyRule(name string, b, d int) error {
	switch {
	case !isPow2(d):
		return fmt.Errorf("vLLM refuses %s for head_dim %d: its Hadamard PiT is next_pow2(head_dim) wide "+
			"(v1/attention/backends/turboquant_attn.py:116-120) and x_hat @ PiT fails on any other head_dim "+
			"(triton_turboquant_store.py:417)", name, d)
	case tqCentroids(d, b) == nil:
		return fmt.Errorf("kvlib refuses vLLM's %s for head_dim %d: it holds vLLM's Lloyd-Max centroids "+
			"(turboquant/centroids.py) for head_dim 16 to 512", name, d)
	}
	return nil
}

// tqValueRule refuses the head sizes whose codes vLLM's value store does
// not write whole.
func tqValueRule(name string, b, d int) error {
	switch {
	case b == 3 && d%8 != 0:
		return fmt.Errorf("vLLM refuses %s for head_dim %d: its 3-bit codes go in whole groups of 8 and the "+
			"store writes only head_dim/8 of them (triton_turboquant_store.py:44-79)", name, d)
	case b == 4 && d%2 != 0:
		return fmt.Errorf("kvlib refuses vLLM's %s for head_dim %d: its 4-bit codes go two a byte and the "+
			"store would fill the last nibble from a padding lane (triton_turboquant_store.py:97-120)", name, d)
	}
	return nil
}

// tqHadamardEntry is |PiT[i][j]| as vLLM builds it: the float32 1.0 of H
// divided by math.sqrt(d) (torch's CPU division of a float32 tensor by a
// Python float, in float32).
func tqHadamardEntry(d int) float32 {
	return float32(1) / float32(math.Sqrt(float64(d)))
}

// tqRotate applies PiT (its own inverse) to a power-of-two run in place:
// c·B(x) in float32.
func tqRotate(x []float32) {
	sylvesterButterfly(x)
	scale(x, tqHadamardEntry(len(x)))
}

// tqKeyQuantize writes one head vector's MSE indices and fp16 norm.
func tqKeyQuantize(b int, x []float32, dst []byte) bool {
	var buf [512]float32
	var kbuf [512]int8
	y, ks := buf[:], kbuf[:]
	if len(x) > len(buf) {
		y, ks = make([]float32, len(x)), make([]int8, len(x))
	}
	return tqKeyQuantizeNorm(b, x, dst, tqSumSquares(x), y, ks)
}

// tqSumSquares is ||x||² as tqKeyQuantize takes it: each square rounded,
// then summed in index order.
func tqSumSquares(x []float32) float32 {
	var ss float32
	for _, v := range x {
		ss += float32(v * v)
	}
	return ss
}

// tqSumSquares4 is tqSumSquares of the four head vectors of d values in x,
// in one loop: four chains of dependent additions side by side, each in
// its vector's index order.
func tqSumSquares4(x []float32, d int, ss *[4]float32) {
	x0, x1, x2, x3 := x[:d], x[d:2*d], x[2*d:3*d], x[3*d:4*d]
	var s0, s1, s2, s3 float32
	for i, v := range x0 {
		s0 += float32(v * v)
		s1 += float32(x1[i] * x1[i])
		s2 += float32(x2[i] * x2[i])
		s3 += float32(x3[i] * x3[i])
	}
	*ss = [4]float32{s0, s1, s2, s3}
}

// tqKeyQuantizeNorm is tqKeyQuantize given ||x||² (ss), with scratch y and
// ks of at least len(x) each.
func tqKeyQuantizeNorm(b int, x []float32, dst []byte, ss float32, y []float32, ks []int8) bool {
	d := len(x)
	norm := float32(math.Sqrt(float64(ss))) // correctly rounded (a float64 root rounds to the float32 one)
	den := norm + 1e-8
	y = append(y[:0], x...)
	n := simdLen(d)
	if n > 0 {
		divAVX2(y[:n], den) // IEEE division, 8 at a time
	}
	for i := n; i < d; i++ {
		y[i] /= den
	}
	tqRotate(y)
	mid := tqTableOf(d, b).mids
	codes := dst[:(d*b+7)/8]
	ks = ks[:d]
	m := 0
	if useSIMD {
		m = d &^ 31
		if m > 0 {
			tqCodesAVX2(ks[:m], y[:m], mid) // the count of midpoints <= v, 8 values a compare
		}
	}
	for i, v := range y[m:] {
		i += m
		// the count of midpoints <= v (a NaN counts none): they are sorted
		// and 2^b - 1, so a binary search finds it, each step a conditional
		// move (a branch on v would be mispredicted half the time)
		k := 0
		for step := (len(mid) + 1) / 2; step > 0; step >>= 1 {
			t := 0
			if v >= mid[k+step-1] {
				t = step
			}
			k += t
		}
		ks[i] = int8(k)
	}
	tqPack(codes, b, ks)
	binary.LittleEndian.PutUint16(dst[len(codes):], safetensors.Float32ToFP16(norm))
	return firstNonFinite(x) >= 0
}

// tqKeyQuantizeRun is tqKeyQuantize over a run of whole head vectors of d
// values (quantizeRun): their norms four at a time (tqSumSquares4), one
// scratch for the run.
func tqKeyQuantizeRun(b int) func(x []float32, dst []byte, _ blockRun) (bool, int) {
	return func(x []float32, dst []byte, r blockRun) (nonFinite bool, _ int) {
		d := r.elems
		hs := r.bytes
		y, ks := make([]float32, d), make([]int8, d)
		var ss [4]float32
		for h := 0; h < len(x)/d; h += 4 {
			m := min(4, len(x)/d-h)
			if m == 4 {
				tqSumSquares4(x[h*d:(h+4)*d], d, &ss)
			}
			for v := h; v < h+m; v++ {
				if m < 4 {
					ss[v-h] = tqSumSquares(x[v*d : (v+1)*d])
				}
				nonFinite = tqKeyQuantizeNorm(b, x[v*d:(v+1)*d], dst[v*hs:(v+1)*hs], ss[v-h], y, ks) || nonFinite
			}
		}
		return nonFinite, 0
	}
}

// tqPut stores code k of a head vector: 4-bit two a byte, even index low;
// 3-bit index i at bit 3(i%8) of its group's 24 little-endian bits.
func tqPut(codes []byte, b, i int, k uint32) {
	if b == 4 {
		codes[i/2] |= byte(k << (4 * (i & 1)))
		return
	}
	bit := 24*(i/8) + 3*(i%8)
	codes[bit/8] |= byte(k << (bit % 8))
	if bit%8 > 5 {
		codes[bit/8+1] |= byte(k >> (8 - bit%8))
	}
}

// tqPack stores the codes k of a head vector as tqPut does one by one
// (codes zeroed first): 4-bit a byte per pair, 3-bit three bytes per 8.
func tqPack(codes []byte, b int, k []int8) {
	switch {
	case b == 4 && len(k)%2 == 0:
		pack4(codes, k) // two a byte, the first low (its AVX2 kernel 32 at a time)
	case b == 3 && len(k)%8 == 0:
		for g := 0; g < len(k)/8; g++ {
			q := k[8*g : 8*g+8]
			w := uint32(q[0]) | uint32(q[1])<<3 | uint32(q[2])<<6 | uint32(q[3])<<9 |
				uint32(q[4])<<12 | uint32(q[5])<<15 | uint32(q[6])<<18 | uint32(q[7])<<21 // each 0..7
			codes[3*g], codes[3*g+1], codes[3*g+2] = byte(w), byte(w>>8), byte(w>>16)
		}
	default:
		clear(codes)
		for i, c := range k {
			tqPut(codes, b, i, uint32(uint8(c)))
		}
	}
}

// tqUnpack reads the d codes of a head vector into k (tqGet of each).
func tqUnpack(k []int8, codes []byte, b int) {
	switch {
	case b == 4 && len(k)%2 == 0:
		for i, c := range codes[:len(k)/2] {
			k[2*i], k[2*i+1] = int8(c&15), int8(c>>4)
		}
	case b == 3 && len(k)%8 == 0:
		for g := 0; g < len(k)/8; g++ {
			w := uint32(codes[3*g]) | uint32(codes[3*g+1])<<8 | uint32(codes[3*g+2])<<16
			q := k[8*g : 8*g+8]
			for j := range q {
				q[j] = int8(w >> (3 * j) & 7)
			}
		}
	default:
		for i := range k {
			k[i] = int8(tqGet(codes, b, i))
		}
	}
}

// tqGet reads code i (the decode kernels' raw16 >> shift & mask).
func tqGet(codes []byte, b, i int) int {
	bit := b * i
	raw := uint32(codes[bit/8])
	if bit/8+1 < len(codes) {
		raw |= uint32(codes[bit/8+1]) << 8
	}
	return int(raw >> (bit % 8) & (1<<b - 1))
}

// tqKeyDequantize reads one head vector back into the model's basis.
func tqKeyDequantize(b int, src []byte, dst []float32) {
	d := len(dst)
	cents := tqCentroids(d, b)
	var kbuf [512]int8
	ks := kbuf[:0]
	if d > len(kbuf) {
		ks = make([]int8, d)
	}
	ks = ks[:d]
	tqUnpack(ks, src[:(d*b+7)/8], b)
	var ss float32
	for i, k := range ks {
		c := cents[k]
		dst[i] = c
		ss += float32(c * c)
	}
	tqKeyFinish(b, src, dst, ss)
}

// tqKeyFinish is the rest of tqKeyDequantize once dst holds the
// centroids and ss their sum of squares (index order): the norm
// correction, the stored norm, the rotation back.
func tqKeyFinish(b int, src []byte, dst []float32, ss float32) {
	n := (len(dst)*b + 7) / 8
	inv := 1 / float32(math.Sqrt(float64(ss+1e-16)))
	norm := safetensors.FP16ToFloat32(binary.LittleEndian.Uint16(src[n:]))
	scale(dst, inv)  // c·inv
	scale(dst, norm) // norm·(c·inv)
	tqRotate(dst)
}

// tqKeyDequantizeRun is tqKeyDequantize over a run of whole head vectors of
// d values (dequantizeRun): the centroids' sums of squares four vectors at
// a time, each in index order.
func tqKeyDequantizeRun(b int) func(src []byte, dst []float32, _ blockRun) {
	return func(src []byte, dst []float32, r blockRun) {
		d := r.elems
		hs, nb := r.bytes, (d*b+7)/8
		cents := tqCentroids(d, b)
		ks := make([]int8, 4*d)
		for h := 0; h < len(dst)/d; h += 4 {
			if h+4 > len(dst)/d {
				for v := h; v < len(dst)/d; v++ {
					tqKeyDequantize(b, src[v*hs:(v+1)*hs], dst[v*d:(v+1)*d])
				}
				break
			}
			for v := 0; v < 4; v++ {
				tqUnpack(ks[v*d:(v+1)*d], src[(h+v)*hs:(h+v)*hs+nb], b)
			}
			y0, y1, y2, y3 := dst[h*d:(h+1)*d], dst[(h+1)*d:(h+2)*d], dst[(h+2)*d:(h+3)*d], dst[(h+3)*d:(h+4)*d]
			k1, k2, k3 := ks[d:2*d], ks[2*d:3*d], ks[3*d:4*d]
			var s0, s1, s2, s3 float32
			for i, k := range ks[:d] {
				c0, c1, c2, c3 := cents[k], cents[k1[i]], cents[k2[i]], cents[k3[i]]
				y0[i], y1[i], y2[i], y3[i] = c0, c1, c2, c3
				s0 += float32(c0 * c0)
				s1 += float32(c1 * c1)
				s2 += float32(c2 * c2)
				s3 += float32(c3 * c3)
			}
			for v, ss := range [4]float32{s0, s1, s2, s3} {
				tqKeyFinish(b, src[(h+v)*hs:(h+v+1)*hs], dst[(h+v)*d:(h+v+1)*d], ss)
			}
		}
	}
}

// tqValueQuantize writes one head vector's uniform codes, fp16 scale and zero.
func tqValueQuantize(b int, x []float32, dst []byte) bool {
	var y [512]float32
	var q [512]uint8
	if len(x) > len(y) {
		return tqValueQuantizeInto(b, x, dst, make([]float32, len(x)), make([]uint8, len(x)))
	}
	return tqValueQuantizeInto(b, x, dst, y[:], q[:])
}

// tqValueQuantizeRun is tqValueQuantize over a run of whole head vectors of
// d values (quantizeRun), one scratch for the run.
func tqValueQuantizeRun(b int) func(x []float32, dst []byte, _ blockRun) (bool, int) {
	return func(x []float32, dst []byte, r blockRun) (nonFinite bool, _ int) {
		d := r.elems
		hs := r.bytes
		y, q := make([]float32, d), make([]uint8, d)
		for v := 0; v < len(x)/d; v++ {
			nonFinite = tqValueQuantizeInto(b, x[v*d:(v+1)*d], dst[v*hs:(v+1)*hs], y, q) || nonFinite
		}
		return nonFinite, 0
	}
}

// tqValueQuantizeInto is tqValueQuantize with scratch y and q of at least
// len(x) each.
func tqValueQuantizeInto(b int, x []float32, dst []byte, y []float32, q []uint8) bool {
	// min and max of x as Go's min and max give them, -0 below +0: minMax
	// (its AVX2 kernel) unless x holds a NaN, which the builtins propagate
	lo, hi, abits := minMax(x)
	if abits > 0x7f800000 {
		lo, hi = float32(math.Inf(1)), float32(math.Inf(-1))
		for _, v := range x {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	top := float32(int(1)<<b - 1)
	scale := (hi - lo) / top
	if !(scale > 1e-8) {
		scale = 1e-8
	}
	n := (len(x)*b + 7) / 8
	codes := dst[:n]
	ks := codesOf(q[:len(x)])
	m := 0
	if useSIMD && len(x)%GGMLBlock == 0 {
		// (v-lo)/scale by the IEEE division kernel, then offsetCodes32's
		// truncCode(float32(y·1) + 0.5, top): y·1 is y, the rest as below
		y = y[:len(x)]
		for i, v := range x {
			y[i] = v - lo
		}
		divAVX2(y, scale)
		for g := 0; g < len(x); g += GGMLBlock {
			offsetCodes32AVX2(q[g:g+GGMLBlock], y[g:g+GGMLBlock], 0, 1, 0.5, top)
		}
		m = len(x)
	}
	for i, v := range x[m:] {
		i += m
		q := float32(float32((v-lo)/scale) + 0.5)
		// clamp(trunc(q), 0, top), and 0 for a NaN (the GPU's float-to-int
		// conversion of it): a NaN (never else below 0.5) is 0, then the
		// clamp and the truncation, with no branch on q's value
		if !(q >= 0) {
			q = 0
		}
		ks[i] = int8(min(q, top))
	}
	tqPack(codes, b, ks)
	binary.LittleEndian.PutUint16(dst[n:], safetensors.Float32ToFP16(scale))
	binary.LittleEndian.PutUint16(dst[n+2:], safetensors.Float32ToFP16(lo))
	return abits >= 0x7f800000 // a NaN or an Inf
}

// tqValueDequantize is the read: q·scale + zero with the fp16 scale and zero.
func tqValueDequantize(b int, src []byte, dst []float32) {
	n := (len(dst)*b + 7) / 8
	scale := safetensors.FP16ToFloat32(binary.LittleEndian.Uint16(src[n:]))
	zero := safetensors.FP16ToFloat32(binary.LittleEndian.Uint16(src[n+2:]))
	var kbuf [512]int8
	ks := kbuf[:]
	if len(dst) > len(kbuf) {
		ks = make([]int8, len(dst))
	}
	ks = ks[:len(dst)]
	tqUnpack(ks, src[:n], b)
	dequantAsym(dst, ks, 0xff, scale, zero) // float32(float32(q)·scale) + zero: q·scale is exact, one rounding
}

// tqValueDequantizeRun is tqValueDequantize over a run of whole head
// vectors of d values (dequantizeRun).
func tqValueDequantizeRun(b int) func(src []byte, dst []float32, _ blockRun) {
	return func(src []byte, dst []float32, r blockRun) {
		d := r.elems
		hs := r.bytes
		for v := 0; v < len(dst)/d; v++ {
			tqValueDequantize(b, src[v*hs:(v+1)*hs], dst[v*d:(v+1)*d])
		}
	}
}

// encodeTQKeyFP8 and decodeTQKeyFP8 are turboquant_k8's conversion of a
// whole chunk: e4m3 with no scale, saturating (counted).
func encodeTQKeyFP8(j *tensorJob, x []float32, qlo, qhi int) {
	codes := j.codes[qlo:qhi]
	n := int64(0)
	for _, v := range x[:len(codes)] {
		if v > 448 || v < -448 {
			n++
		}
	}
	m := e4m3Encode(codes, x[:len(codes)], 1) // v·1 is v (a NaN stays one: encode gives its NaN code)
	for i, v := range x[m:len(codes)] {
		codes[m+i] = fp8E4M3.encode(v)
	}
	j.saturated.Add(n)
}

func decodeTQKeyFP8(j *tensorJob, y []float32, qlo, qhi int) {
	for i, c := range j.codes[qlo:qhi] {
		y[i] = fp8E4M3.decode[c]
	}
}

// tqCentroids is vLLM's centroid table for head_dim d and b bits (nil: none held).
func tqCentroids(d, b int) []float32 {
	return tqTableOf(d, b).values
}

// tqTableOf is tqCentroidTables[{d, b}] (zero: none held), read from
// tqTableIndex, as each head vector looks its table up (no map hash).
func tqTableOf(d, b int) *tqTable {
	k := bits.Len(uint(d)) - 5 // d = 16 ... 512: 0 ... 5
	if b < 3 || b > 4 || k < 0 || k >= len(tqTableIndex) || d != 16<<k {
		t := tqCentroidTables[[2]int{d, b}] // none: the zero table
		return &t
	}
	return &tqTableIndex[k][b-3]
}

// tqTableIndex holds tqCentroidTables by log2(d) - 4 and b - 3.
var tqTableIndex = func() (t [6][2]tqTable) {
	for k := range t {
		for b := range t[k] {
			t[k][b] = tqCentroidTables[[2]int{16 << k, b + 3}]
		}
	}
	return t
}()

// A tqTable is one centroid table, sorted, and its float32 midpoints
// (c_k + c_k+1)/2, as turboquant_attn.py:471-472 computes them.
type tqTable struct{ values, mids []float32 }

// tqCentroidTables are get_centroids(d, b) of vLLM 0.33.0
// (turboquant/centroids.py:31-87, solve_lloyd_max: a float64 CPython
// solver, then torch.float32), as float32 bits: the output of that code
// run verbatim under CPython 3.11 (tests/third_party/vllm_turboquant_centroids.py),
// recorded in tests/vectors/vllm_turboquant_engine.json; tests/test_vllm_formats.py
// runs the solver again and compares every bit with that file, and
// TestTurboQuantCentroidTables compares these tables with it.
var tqCentroidTables = buildTQTables(map[[2]int][]uint32{
	{16, 3}:  {0xbf099f54, 0xbeabed53, 0xbe4171fc, 0xbd7adcfb, 0x3d7adcfb, 0x3e4171fc, 0x3eabed53, 0x3f099f54},
	{16, 4}:  {0xbf2ec76e, 0xbf046170, 0xbecf16c0, 0xbea0cd0c, 0xbe71444a, 0xbe282948, 0xbdc6b9ff, 0xbd03828a, 0x3d03828a, 0x3dc6b9ff, 0x3e282948, 0x3e71444a, 0x3ea0cd0c, 0x3ecf16c0, 0x3f046170, 0x3f2ec76e},
	{32, 3}:  {0xbec2a09f, 0xbe73243d, 0xbe08c955, 0xbd316317, 0x3d316317, 0x3e08c955, 0x3e73243d, 0x3ec2a09f},
	{32, 4}:  {0xbef72cc4, 0xbebb36e7, 0xbe926f17, 0xbe63682b, 0xbe2a99f2, 0xbdedd0e1, 0xbd8c8559, 0xbcb9fbae, 0x3cb9fbae, 0x3d8c8559, 0x3dedd0e1, 0x3e2a99f2, 0x3e63682b, 0x3e926f17, 0x3ebb36e7, 0x3ef72cc4},
	{64, 3}:  {0xbe899f54, 0xbe2bed53, 0xbdc171fc, 0xbcfadcfb, 0x3cfadcfb, 0x3dc171fc, 0x3e2bed53, 0x3e899f54},
	{64, 4}:  {0xbeaec76e, 0xbe846170, 0xbe4f16c0, 0xbe20cd0c, 0xbdf1444a, 0xbda82948, 0xbd46b9ff, 0xbc83828a, 0x3c83828a, 0x3d46b9ff, 0x3da82948, 0x3df1444a, 0x3e20cd0c, 0x3e4f16c0, 0x3e846170, 0x3eaec76e},
	{128, 3}: {0xbe42a09f, 0xbdf3243d, 0xbd88c955, 0xbcb16317, 0x3cb16317, 0x3d88c955, 0x3df3243d, 0x3e42a09f},
	{128, 4}: {0xbe772cc4, 0xbe3b36e7, 0xbe126f17, 0xbde3682b, 0xbdaa99f2, 0xbd6dd0e1, 0xbd0c8559, 0xbc39fbae, 0x3c39fbae, 0x3d0c8559, 0x3d6dd0e1, 0x3daa99f2, 0x3de3682b, 0x3e126f17, 0x3e3b36e7, 0x3e772cc4},
	{256, 3}: {0xbe099f54, 0xbdabed53, 0xbd4171fc, 0xbc7adcfb, 0x3c7adcfb, 0x3d4171fc, 0x3dabed53, 0x3e099f54},
	{256, 4}: {0xbe2ec76e, 0xbe046170, 0xbdcf16c0, 0xbda0cd0c, 0xbd71444a, 0xbd282948, 0xbcc6b9ff, 0xbc03828a, 0x3c03828a, 0x3cc6b9ff, 0x3d282948, 0x3d71444a, 0x3da0cd0c, 0x3dcf16c0, 0x3e046170, 0x3e2ec76e},
	{512, 3}: {0xbdc2a09f, 0xbd73243d, 0xbd08c955, 0xbc316317, 0x3c316317, 0x3d08c955, 0x3d73243d, 0x3dc2a09f},
	{512, 4}: {0xbdf72cc4, 0xbdbb36e7, 0xbd926f17, 0xbd63682b, 0xbd2a99f2, 0xbcedd0e1, 0xbc8c8559, 0xbbb9fbae, 0x3bb9fbae, 0x3c8c8559, 0x3cedd0e1, 0x3d2a99f2, 0x3d63682b, 0x3d926f17, 0x3dbb36e7, 0x3df72cc4},
})

func buildTQTables(bits map[[2]int][]uint32) map[[2]int]tqTable {
	out := make(map[[2]int]tqTable, len(bits))
	for k, u := range bits {
		v := make([]float32, len(u))
		for i, w := range u {
			v[i] = math.Float32frombits(w)
		}
		m := make([]float32, len(v)-1)
		for i := range m {
			m[i] = (v[i] + v[i+1]) / 2
		}
		out[k] = tqTable{values: v, mids: m}
	}
	return out
}

// ultraquantUnavailable is why kv-compress has no vllm:ultraquant_4bit.
const ultraquantUnavailable = "vllm:ultraquant_4bit is not available in kv-compress: vLLM 0.33.0 runs it on ROCm only " +
	"(platforms/rocm.py:567, the ULTRAQUANT backend) and its stored bytes depend on the GPU: each group's UE8M0 scale " +
	"is 2^floor(tl.log2(0.156*absmax) + 0.5) with the hardware's approximate log2 (v1/attention/ops/ultraquant/" +
	"triton_store.py:184-191), which decides the exponent of a group whose scale lies near 2^(k-1/2)"
