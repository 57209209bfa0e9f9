package compression

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand"
	"strings"
	"testing"

	"kvlib/pkg/safetensors"
)

// fmaBig is a*b + c computed exactly and rounded once to float32.
func fmaBig(a, b, c float32) float32 {
	x := new(big.Float).SetPrec(1000).SetFloat64(float64(a))
	x.Mul(x, new(big.Float).SetPrec(1000).SetFloat64(float64(b)))
	x.Add(x, new(big.Float).SetPrec(1000).SetFloat64(float64(c)))
	f, _ := x.Float32()
	return f
}

// fma32 rounds once: against exact arithmetic on random operands and on
// products that are float32 ties nudged by a c too small for float64 to
// keep (where rounding to float64 first would round the tie to even).
func TestFMA32IsOneRounding(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	type op struct{ a, b, c float32 }
	var ops []op
	finite := func() float32 { // any finite float32 bit pattern
		for {
			if v := math.Float32frombits(r.Uint32()); !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) {
				return v
			}
		}
	}
	for i := 0; i < 200000; i++ {
		ops = append(ops, op{finite(), finite(), finite()},
			op{float32(r.NormFloat64()), float32(r.NormFloat64()), float32(r.NormFloat64() * 1e-6)})
	}
	for _, e := range []int{-149, -140, -126, -80, -40, 0, 40, 90} {
		// (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24: halfway between two float32 values
		a := float32(1 + math.Ldexp(1, -12))
		for _, c := range []float64{math.Ldexp(1, -80), -math.Ldexp(1, -80), math.Ldexp(1, -60), 0} {
			s := float32(math.Ldexp(1, e/2))
			ops = append(ops, op{a * s, a * s, float32(c * math.Ldexp(1, 2*(e/2)))})
		}
	}
	ops = append(ops, op{math.MaxFloat32, 2, -math.MaxFloat32}, op{0, 0, -0})
	if got := fma32(1, 1, float32(math.Inf(-1))); !math.IsInf(float64(got), -1) {
		t.Errorf("fma32(1, 1, -Inf) = %g", got)
	}
	n := 0
	for _, o := range ops {
		want := fmaBig(o.a, o.b, o.c)
		got := fma32(o.a, o.b, o.c)
		if math.Float32bits(got) != math.Float32bits(want) && !(got == 0 && want == 0) {
			t.Fatalf("fma32(%g, %g, %g) = %g, exact rounding %g", o.a, o.b, o.c, got, want)
		}
		if float32(float64(o.a)*float64(o.b)+float64(o.c)) != want {
			n++
		}
	}
	if n == 0 {
		t.Error("no operand where rounding to float64 first differs: the tie cases do not test anything")
	}
}

// rcp.approx.ftz: subnormal inputs flush to ±0 (±Inf out), subnormal
// results flush to ±0, powers of two are exact.
func TestRcpApproxFTZ(t *testing.T) {
	sub := math.Float32frombits(0x00400000)
	for _, tc := range []struct{ in, want float32 }{
		{1, 1}, {0.25, 4}, {-8, -0.125}, {sub, float32(math.Inf(1))}, {-sub, float32(math.Inf(-1))},
		{0, float32(math.Inf(1))}, {float32(math.Inf(1)), 0}, {math.MaxFloat32, 0}, {float32(math.Ldexp(1, -126)), float32(math.Ldexp(1, 126))},
	} {
		got := rcpApproxFTZ(tc.in)
		if math.Float32bits(got) != math.Float32bits(tc.want) {
			t.Errorf("rcp(%g) = %g, want %g", tc.in, got, tc.want)
		}
	}
	if math.Float32bits(rcpApproxFTZ(float32(math.Copysign(0, -1)))) != math.Float32bits(float32(math.Inf(-1))) {
		t.Error("rcp(-0)")
	}
}

// The constant vLLM 0.33.0's SM100 binary multiplies the block max by
// (cuobjdump -sass: FMUL R, R, 0.16666667163372039795, encoding 0x3e2aaaab).
func TestNVFP4Rcp6IsTheBinarysConstant(t *testing.T) {
	if math.Float32bits(nvfp4Rcp6) != 0x3e2aaaab {
		t.Errorf("rcp(6) = %#x", math.Float32bits(nvfp4Rcp6))
	}
}

// Blocks whose bytes follow from the definitions by hand: E4M3(1.0) is
// 0x38 (exponent 7, bias 7), E4M3(448) 0x7e; E2M1 codes 0..7 are 0, 0.5,
// 1, 1.5, 2, 3, 4, 6, sign in bit 3; ties go to the even code.
func TestNVFP4Blocks(t *testing.T) {
	ties := []float32{6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5, -6}
	// 6·rcp(6) = 1 + 2^-25, which rounds to 1: scale 1.0, output scale 1
	tieCodes := []uint8{7, 0, 2, 2, 4, 4, 6, 6, 8, 10, 10, 12, 12, 14, 14, 15}
	tieBack := []float32{6, 0, 1, 1, 2, 2, 4, 4, 0, -1, -1, -2, -2, -4, -4, -6}
	tiny := append([]float32{1e-3, -1e-3, 5e-4}, make([]float32, 13)...) // SF = 1e-3/6 < 2^-10: rounds to E4M3 zero
	sat := append([]float32{6000, 1}, make([]float32, 14)...)            // SF = 1000 > 448: scale 448, 6000/448 > 6
	fours := []float32{4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}
	sixThree := append([]float32{6, 3}, make([]float32, 14)...)
	rep := func(c uint8, n int) []uint8 { return bytes.Repeat([]byte{c}, n) }
	for _, tc := range []struct {
		name  string
		w     nvfp4Writer
		x     []float32
		k     float32
		codes []uint8 // one per element
		sf    uint8
		back  []float32
		sat   int
	}{
		{"ties vllm", nvfp4VLLM, ties, 1, tieCodes, 0x38, tieBack, 0},
		{"ties trtllm", nvfp4TRTLLM, ties, 1, tieCodes, 0x38, tieBack, 0},
		// k = 2: g = 0.5, SF = 0.5 (0x30), rcp(g) = 2, output scale 1: the same codes, read times 0.5·2
		{"ties k=2", nvfp4VLLM, ties, 2, tieCodes, 0x30, tieBack, 0},
		{"zeros vllm", nvfp4VLLM, make([]float32, 16), 1, rep(0, 16), 0, make([]float32, 16), 0},
		{"zeros trtllm", nvfp4TRTLLM, make([]float32, 16), 1, rep(0, 16), 0, make([]float32, 16), 0},
		{"zeros 4over6", nvfp4VLLM4over6, make([]float32, 16), 1, rep(0, 16), 0, make([]float32, 16), 0},
		// vLLM: float(sf) == 0, output scale 0, codes ±0; TensorRT-LLM: output scale rcp(0) = Inf,
		// ±6 for the nonzero values and NaN (0x7) for the zeros; both read back as 0
		{"tiny vllm", nvfp4VLLM, tiny, 1, append([]uint8{0, 8, 0}, rep(0, 13)...), 0, make([]float32, 16), 0},
		{"tiny trtllm", nvfp4TRTLLM, tiny, 1, append([]uint8{7, 15, 7}, rep(7, 13)...), 0, make([]float32, 16), 0},
		// 1/448 = 0.00223: 1 → 0; 6000/448 = 13.4 → 6, clamped
		{"saturated", nvfp4VLLM, sat, 1, append([]uint8{7}, rep(0, 15)...), 0x7e, append([]float32{2688}, make([]float32, 15)...), 1},
		// /6: SF 4/6 → 0.6875 (0x33: 0.5 × 1.375), 4/0.6875 = 5.8 → 6, error 16·(6·0.6875 - 4)^2 = 0.25; /4: SF 1, exact: /4 wins
		{"fours 4over6", nvfp4VLLM4over6, fours, 1, rep(6, 16), 0x38, fours, 0},
		{"fours nvfp4", nvfp4VLLM, fours, 1, rep(7, 16), 0x33, bytes32(4.125, 16), 0},
		// /6 exact (SF 1) and /4 exact (SF 1.5, 6 → 4, 3 → 2): a tie keeps /6
		{"tie keeps /6", nvfp4VLLM4over6, sixThree, 1, append([]uint8{7, 5}, rep(0, 14)...), 0x38, sixThree, 0},
	} {
		dst := make([]byte, nvfp4Bytes)
		nonFinite, n := tc.w.quantize(tc.x, dst, tc.k)
		var want []byte
		for i := 0; i < 16; i += 2 {
			want = append(want, tc.codes[i]|tc.codes[i+1]<<4)
		}
		want = append(want, tc.sf)
		if nonFinite || !bytes.Equal(dst, want) || n != tc.sat {
			t.Errorf("%s: % x (saturated %d), want % x (%d)", tc.name, dst, n, want, tc.sat)
			continue
		}
		back := make([]float32, 16)
		nvfp4Dequantize(dst, back, tc.k)
		for i := range back {
			if back[i] != tc.back[i] {
				t.Errorf("%s: read %v, want %v", tc.name, back, tc.back)
				break
			}
		}
	}
}

func bytes32(v float32, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// nvfp4Oracle is a transliteration of the engines' CUDA, independent of
// the production helpers: every single float32 operation in float64 and
// then rounded (innocuous for one operation: 53 >= 2·24 + 2), the
// multiply-adds exact in big.Float, E4M3 and E2M1 by nearest-value search
// with ties to the even code.
func nvfp4Oracle(w nvfp4Writer, x []float32, k float32) []byte {
	f := func(v float64) float32 { return float32(v) }
	rcp := func(a float32) float32 {
		if a != 0 && math.Abs(float64(a)) < math.Ldexp(1, -126) {
			a = 0 * a
		}
		r := f(1 / float64(a))
		if r != 0 && math.Abs(float64(r)) < math.Ldexp(1, -126) {
			r = 0 * r
		}
		return r
	}
	e4m3 := func(c int) float64 {
		if c>>3 == 0 {
			return math.Ldexp(float64(c&7), -9)
		}
		return math.Ldexp(float64(8+c&7), c>>3-10)
	}
	toE4M3 := func(v float32) (uint8, float32) {
		best := 0x7e
		if float64(v) < 448 {
			for c := 0; c < 0x7e; c++ {
				d, db := math.Abs(e4m3(c)-float64(v)), math.Abs(e4m3(best)-float64(v))
				if d < db || d == db && c%2 == 0 {
					best = c
				}
			}
		}
		return uint8(best), float32(e4m3(best))
	}
	grid := []float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}
	toE2M1 := func(v float32) uint8 {
		if v != v {
			return 7
		}
		var sign uint8
		if math.Signbit(float64(v)) {
			sign = 8
		}
		a, best := math.Abs(float64(v)), 7
		for c := 6; c >= 0 && a < 6; c-- {
			d, db := math.Abs(grid[c]-a), math.Abs(grid[best]-a)
			if d < db || d == db && c%2 == 0 {
				best = c
			}
		}
		return sign | uint8(best)
	}
	val := func(c uint8) float32 {
		if c&8 != 0 {
			return float32(-grid[c&7])
		}
		return float32(grid[c&7])
	}
	var vecMax float32
	for _, v := range x {
		vecMax = max(vecMax, float32(math.Abs(float64(v))))
	}
	g := f(1 / float64(k))
	cand := func(rden float32) (float32, uint8, float32) {
		sf := f(float64(g) * float64(f(float64(vecMax)*float64(rden))))
		b, narrow := toE4M3(sf)
		var os float32
		if w.guardVecMax && vecMax != 0 || !w.guardVecMax && narrow != 0 {
			os = rcp(f(float64(narrow) * float64(rcp(g))))
		}
		return sf, b, os
	}
	errOf := func(os float32) float32 {
		var dq, sum float32
		if os != 0 {
			dq = rcp(os)
		}
		for i := 0; i < 16; i += 2 {
			a, b := x[i], x[i+1]
			var e float32
			if os == 0 {
				e = fmaBig(a, a, f(float64(b)*float64(b)))
			} else {
				da := fmaBig(val(toE2M1(f(float64(a)*float64(os)))), dq, -a)
				db := fmaBig(val(toE2M1(f(float64(b)*float64(os)))), dq, -b)
				e = fmaBig(da, da, f(float64(db)*float64(db)))
			}
			sum = f(float64(sum) + float64(e))
		}
		return sum
	}
	_, b, os := cand(f(1.0 / 6))
	if w.fourOverSix {
		if _, b4, os4 := cand(0.25); errOf(os4) < errOf(os) {
			b, os = b4, os4
		}
	}
	out := make([]byte, 9)
	for i, v := range x {
		out[i/2] |= toE2M1(f(float64(v)*float64(os))) << (4 * (i & 1))
	}
	out[8] = b
	return out
}

var nvfp4Writers = []nvfp4Writer{nvfp4VLLM, nvfp4VLLM4over6, nvfp4TRTLLM}

// The writers equal the transliteration on blocks of every scale, k
// included: Gaussian, heavy-tailed, tiny, huge, with zeros and ties.
func TestNVFP4MatchesTransliteration(t *testing.T) {
	r := rand.New(rand.NewSource(4))
	x := make([]float32, 16)
	dst := make([]byte, nvfp4Bytes)
	for i := 0; i < 30000; i++ {
		mag := math.Ldexp(1, r.Intn(60)-40)
		for j := range x {
			switch r.Intn(6) {
			case 0:
				x[j] = 0
			case 1:
				x[j] = float32(float64(r.Intn(13)-6) * 0.25 * mag) // on or between E2M1 ties
			default:
				x[j] = float32(r.NormFloat64() * mag * math.Exp(r.NormFloat64()))
			}
		}
		k := float32(math.Ldexp(1+r.Float64(), r.Intn(20)-14))
		if r.Intn(3) == 0 {
			k = 1
		}
		w := nvfp4Writers[i%3]
		w.quantize(x, dst, k)
		if want := nvfp4Oracle(w, x, k); !bytes.Equal(dst, want) {
			t.Fatalf("%+v k=%g x=%v:\n got % x\nwant % x", w, k, x, dst, want)
		}
	}
}

// FuzzNVFP4Block: any 16 finite float32 and any scale whose reciprocal is
// finite give the transliteration's bytes in every writer, and read back
// as E2M1 × E4M3 × k.
func FuzzNVFP4Block(f *testing.F) {
	f.Add(bytes.Repeat([]byte{0, 0, 0x80, 0x3f}, 16), uint32(0x3f800000), uint8(0))
	f.Add(bytes.Repeat([]byte{0x6f, 0x12, 0x83, 0x3a}, 16), uint32(0x3f800000), uint8(2))
	f.Add(bytes.Repeat([]byte{0, 0, 0xc0, 0x40, 0, 0, 0x40, 0x40}, 8), uint32(0x3dcccccd), uint8(1))
	f.Add(bytes.Repeat([]byte{0xff, 0xff, 0x7f, 0x7f}, 16), uint32(0x00000001), uint8(1))
	f.Fuzz(func(t *testing.T, raw []byte, kBits uint32, which uint8) {
		buf := make([]byte, 64)
		copy(buf, raw)
		x := make([]float32, 16)
		for i := range x {
			x[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
			if math.IsNaN(float64(x[i])) || math.IsInf(float64(x[i]), 0) {
				x[i] = 0 // kv-compress refuses non-finite caches before the format
			}
		}
		k := math.Float32frombits(kBits &^ (1 << 31))
		if !(k > 0) || math.IsInf(float64(k), 0) || math.IsInf(float64(1/k), 0) {
			k = 1
		}
		w := nvfp4Writers[int(which)%len(nvfp4Writers)]
		dst := make([]byte, nvfp4Bytes)
		if nonFinite, _ := w.quantize(x, dst, k); nonFinite {
			t.Fatal("finite input reported non-finite")
		}
		if want := nvfp4Oracle(w, x, k); !bytes.Equal(dst, want) {
			t.Fatalf("%+v k=%g x=%v:\n got % x\nwant % x", w, k, x, dst, want)
		}
		back := make([]float32, 16)
		nvfp4Dequantize(dst, back, k)
		sf := fp8E4M3.decode[dst[8]]
		for i, v := range back {
			c := dst[i/2] >> (4 * (i & 1)) & 0xf
			if want := e2m1Value(c) * sf * k; math.Float32bits(v) != math.Float32bits(want) {
				t.Fatalf("element %d reads %g, want %g", i, v, want)
			}
		}
	})
}

// The refusals: head_dim not a multiple of 16 (a *TensorError naming the
// engine's reason), a scale whose reciprocal overflows, NaN and Inf.
func TestNVFP4Refusals(t *testing.T) {
	for spec, want := range map[string]string{
		"vllm:nvfp4":        "vLLM refuses nvfp4 for head_dim 40: its blocks of 16 elements must divide head_size",
		"vllm:nvfp4_4over6": `"head_size must be divisible by 16 for NVFP4 KV cache"`,
		"trtllm:nvfp4":      "kvlib refuses TensorRT-LLM's nvfp4 for head_dim 40: its blocks of 16 elements",
	} {
		s, err := ParseSpec(spec)
		if err != nil {
			t.Fatal(err)
		}
		src := randomCache(1, 1, 2, 3, 40)
		_, err = Compress(src, Config{Spec: s, Thresholds: DefaultThresholds})
		var te *TensorError
		if err == nil || !errors.As(err, &te) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s on head_dim 40: %v, want a *TensorError containing %q", spec, err, want)
		}
		if _, err := Compress(randomCache(1, 1, 2, 3, 48), Config{Spec: s, Thresholds: DefaultThresholds}); err != nil {
			t.Errorf("%s on head_dim 48: %v", spec, err)
		}
		for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(-1))} {
			src := randomCache(1, 1, 1, 2, 32)
			x := make([]float32, 64)
			x[7] = bad
			src.Tensors[0].Data = bitsOf(x)
			if _, err := Compress(src, Config{Spec: s, Thresholds: DefaultThresholds}); !errors.Is(err, ErrNotFinite) {
				t.Errorf("%s with %g: %v", spec, bad, err)
			}
		}
	}
	for _, tc := range []struct{ spec, want string }{
		{"vllm:nvfp4/scale1e-39", "vllm:nvfp4 takes a scale whose reciprocal, the engine's global scale 1/k_scale, is a finite float32"},
		{"trtllm:nvfp4/scale0", "trtllm:nvfp4 takes a positive finite float32 scale"},
		{"vllm:nvfp4_4over6/g32", "vllm:nvfp4_4over6 is the engine's 4-bit format in blocks of 16 along head_dim, got bits 4 group 32"},
		{"vllm:nvfp4/rot", "never rotated"},
	} {
		if _, err := ParseSpec(tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.spec, err, tc.want)
		}
	}
	if s, err := ParseSpec("vllm:nvfp4/scale1e-38"); err != nil || s.String() != "vllm:nvfp4/scale1e-38" {
		t.Errorf("the smallest scales with a finite reciprocal: %v %v", s, err)
	}
}

// Through kv-compress: 4.5 bits per element, the spec round-trips, the
// static scale divides and multiplies, scale 1 clamps keys past 2688
// (counted where the block scale passes 464, past rounding to 448), a calibrated scale (amax / 2688) clamps none, and F16 and
// BF16 caches hold the read rounded to their dtype.
func TestNVFP4Compress(t *testing.T) {
	for _, name := range []string{"vllm:nvfp4", "vllm:nvfp4_4over6", "trtllm:nvfp4"} {
		x := make([]float32, 2*4*64)
		r := rand.New(rand.NewSource(8))
		amax, beyond := float32(0), 0
		for i := range x {
			x[i] = float32(r.NormFloat64() * 300)
			if i%64 == 5 {
				x[i] *= 20 // an outlier channel, past 2688
			}
			amax = max(amax, float32(math.Abs(float64(x[i]))))
			if x[i] > 2688 || x[i] < -2688 {
				beyond++
			}
		}
		for _, dt := range []safetensors.DType{safetensors.F32, safetensors.F16, safetensors.BF16} {
			tn, _ := safetensors.NewFloatTensor("layer_0_key", dt, []int{1, 2, 4, 64}, x)
			src := &safetensors.File{Tensors: []safetensors.Tensor{tn}}
			xs := floatsOf(&tn)
			top := float32(0)
			for _, v := range xs {
				top = max(top, float32(math.Abs(float64(v))))
			}
			calibrated := top / nvfp4ScaleMax
			for _, spec := range []string{name, fmt.Sprintf("%s/scale%s", name, formatScale(calibrated))} {
				s, err := ParseSpec(spec)
				if err != nil || s.String() != spec {
					t.Fatalf("%s: %v %v", spec, s, err)
				}
				res, err := Compress(src, Config{Spec: s, Thresholds: DefaultThresholds})
				if err != nil {
					t.Fatal(err)
				}
				if res.Report.BitsPerElement != 4.5 {
					t.Errorf("%s: %g bits per element", spec, res.Report.BitsPerElement)
				}
				sat := res.Report.Tensors[0].Saturated
				if spec == name && (beyond == 0 || sat == 0 || sat > int64(beyond)) || spec != name && sat != 0 {
					// scale 1: some of the values past 2688 (those in blocks whose scale passes 464); calibrated: none
					t.Errorf("%s %s: %d saturated (%d values past 2688)", spec, dt, sat, beyond)
				}
				codes := res.Compressed.Tensor("layer_0_key" + CodesSuffix).Data
				want := make([]float32, 16)
				got := floatsOf(&res.Restored.Tensors[0])
				for b := 0; b < len(xs)/16; b++ {
					nvfp4Dequantize(codes[b*nvfp4Bytes:], want, float32(s.Key.Scale))
					for i, v := range want {
						if r := dtypeRounding(dt)(v); got[16*b+i] != r {
							t.Fatalf("%s %s: restored %g, want %g", spec, dt, got[16*b+i], r)
						}
					}
				}
			}
		}
	}
}

func formatScale(v float32) string { return fmt.Sprint(v) }

func floatsOf(tn *safetensors.Tensor) []float32 {
	out := make([]float32, len(tn.Data)/tn.DType.Size())
	safetensors.DecodeFloat32s(out, tn.Data, tn.DType)
	return out
}

// The engines' menus list the formats with their release, flags, evidence
// and the largest value a static scale of 1 holds.
func TestNVFP4InEngineReport(t *testing.T) {
	for _, tc := range []struct{ engine, format, flags, version string }{
		{"vllm", "nvfp4", "--kv-cache-dtype nvfp4", "0.33.0"},
		{"vllm", "nvfp4_4over6", "--kv-cache-dtype nvfp4_4over6", "0.33.0"},
		{"trtllm", "nvfp4", "kv_cache_config.dtype=nvfp4 (or a checkpoint's kv_cache_quant_algo NVFP4)", "1.2.1"},
	} {
		rows, err := EngineReport(tc.engine)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, r := range rows {
			if r.Format != tc.format {
				continue
			}
			found = true
			if r.Flags != tc.flags || !strings.Contains(r.EngineVersion, tc.version) || r.Evidence != EvidenceRead ||
				r.ScaleMax != 2688 || r.SharedScale || r.KeyBits != 4.5 || !strings.Contains(r.Source, ".cu") ||
				!strings.Contains(r.EvidenceDetail, "[unverified]") {
				t.Errorf("%s:%s: %+v", tc.engine, tc.format, r)
			}
		}
		if !found {
			t.Errorf("%s has no %s", tc.engine, tc.format)
		}
	}
}

// fma32's fast path is the full computation (fma32Slow) on random
// float32s, the products of small codes, and around float32 midpoints,
// subnormals and the overflow threshold.
func TestFMA32FastPath(t *testing.T) {
	r := rand.New(rand.NewSource(8))
	check := func(a, b, c float32) {
		p, cc := float64(a)*float64(b), float64(c)
		if got, want := fma32(a, b, c), fma32Slow(p, cc, p+cc); math.Float32bits(got) != math.Float32bits(want) && got == got {
			t.Fatalf("fma32(%g, %g, %g) = %g, want %g", a, b, c, got, want)
		}
		if got, ok := fma32Fast(a, b, c); ok && math.Float32bits(got) != math.Float32bits(fma32(a, b, c)) && got == got {
			t.Fatalf("fma32Fast(%g, %g, %g) = %g, want %g", a, b, c, got, fma32(a, b, c))
		}
	}
	for i := 0; i < 2e6; i++ {
		check(math.Float32frombits(r.Uint32()), math.Float32frombits(r.Uint32()), math.Float32frombits(r.Uint32()))
		a := float32(r.Intn(13)-6) / 2
		b := math.Float32frombits(r.Uint32()&0x807fffff | uint32(100+r.Intn(60))<<23)
		c := math.Float32frombits(r.Uint32()&0x807fffff | uint32(100+r.Intn(60))<<23)
		check(a, b, c)
		check(a, b, -a*b+c*0x1p-30)
		m := math.Float32frombits(r.Uint32()&0x807fffff | uint32(1+r.Intn(3))<<23) // near the subnormals
		check(a, m, -m)
		check(1, math.MaxFloat32, math.Float32frombits(r.Uint32()&0x7fffffff|0x73000000))
	}
}
