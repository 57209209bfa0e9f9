package compression

import (
	"math"
	"math/rand"
	"slices"
	"testing"

	"kvlib/pkg/safetensors"
)

// Every finite float8 value converts to its own code; a value halfway
// between two neighbours goes to the even code; beyond the largest
// finite value, and at ±Inf, the largest (satfinite).
func TestFP8EncodeIsRoundToNearestEvenSaturating(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    *fp8Format
		top  float32
	}{{"e4m3", fp8E4M3, 448}, {"e5m2", fp8E5M2, 57344}} {
		if tc.f.decode[tc.f.maxCode] != tc.top {
			t.Fatalf("%s: largest %g", tc.name, tc.f.decode[tc.f.maxCode])
		}
		for c := 0; c <= int(tc.f.maxCode); c++ {
			for _, sign := range []uint8{0, 0x80} {
				code := uint8(c) | sign
				if got := tc.f.encode(tc.f.decode[code]); got != code {
					t.Errorf("%s: %g encodes to %#x, not %#x", tc.name, tc.f.decode[code], got, code)
				}
				if c == int(tc.f.maxCode) {
					continue
				}
				lo, hi := tc.f.decode[c], tc.f.decode[c+1]
				mid := lo + (hi-lo)/2 // exact in float32
				want := uint8(c)
				if c&1 == 1 {
					want = uint8(c + 1)
				}
				if got := tc.f.encode(mid); got != want {
					t.Errorf("%s: midpoint %g of %#x and %#x encodes to %#x", tc.name, mid, c, c+1, got)
				}
			}
		}
		for _, v := range []float32{tc.top * 1.5, float32(math.Inf(1)), math.MaxFloat32} {
			if tc.f.encode(v) != tc.f.maxCode || tc.f.encode(-v) != 0x80|tc.f.maxCode {
				t.Errorf("%s: %g does not saturate", tc.name, v)
			}
		}
		if tc.f.encode(float32(math.NaN())) != 0x7f {
			t.Errorf("%s: NaN", tc.name)
		}
	}
}

// fp8RoundedStep strides the float32 magnitudes TestFP8RoundedMatchesFloat64
// covers (1 checks all 2^31, about a minute).
const fp8RoundedStep = 61

// The branch-free rounding gives, for every finite float32 magnitude on a
// stride, the code of the value rounded to nearest even in float64
// arithmetic: the mantissa scaled to mant bits (a carry moves the
// exponent), or a subnormal's multiple of the smallest subnormal.
func TestFP8RoundedMatchesFloat64(t *testing.T) {
	for _, f := range []*fp8Format{fp8E4M3, fp8E5M2} {
		ref := func(a uint32) uint32 {
			v := float64(math.Float32frombits(a))
			_, e := math.Frexp(v)         // v = m * 2^e, m in [0.5, 1)
			if v == 0 || e-1 < 1-f.bias { // zero, or below the smallest normal
				return uint32(math.RoundToEven(math.Ldexp(v, f.bias-1+f.mant)))
			}
			q := uint32(math.RoundToEven(math.Ldexp(v, f.mant-(e-1)))) // in [2^mant, 2^(mant+1)]
			return uint32(e-1+f.bias)<<f.mant + q - 1<<f.mant
		}
		bad := 0
		for a := uint32(0); a < 0x7f800000 && bad < 5; a += fp8RoundedStep {
			if got, want := f.rounded(a), ref(a); got != want {
				t.Errorf("mant %d: rounded(%g) = %#x, want %#x", f.mant, math.Float32frombits(a), got, want)
				bad++
			}
		}
		for _, a := range []uint32{f.minNormal - 1, f.minNormal, 0x7f7fffff} { // the path boundary, the largest
			if got, want := f.rounded(a), ref(a); got != want {
				t.Errorf("mant %d: rounded(%g) = %#x, want %#x", f.mant, math.Float32frombits(a), got, want)
			}
		}
	}
}

// With scale 1, keys beyond ±448 are counted and stored as ±448; a
// calibrated scale saturates none.
func TestFP8SaturationIsReported(t *testing.T) {
	x := make([]float32, 2*4*64)
	beyond := int64(0)
	for i := range x {
		x[i] = float32(i%97) * 7 * float32(1-2*(i%2)) // up to ±672
		if x[i] > 448 || x[i] < -448 {
			beyond++
		}
	}
	src := randomCache(1, 1, 2, 4, 64)
	src.Tensors[0].Data = bitsOf(x)
	for spec, want := range map[string]int64{"vllm:fp8_e4m3": beyond, "vllm:fp8_e4m3/scale1.5": 0, "vllm:fp8_e5m2": 0} {
		s, err := ParseSpec(spec)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Compress(src, Config{Spec: s, Thresholds: DefaultThresholds})
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Report.Tensors[0].Saturated; got != want || want == 0 && spec == "vllm:fp8_e4m3" {
			t.Errorf("%s: %d saturated, want %d", spec, got, want)
		}
	}
}

func BenchmarkVLLMFormats(b *testing.B) {
	for _, spec := range []string{"vllm:fp8_e4m3", "vllm:int8_per_token_head", "vllm:fp8_per_token_head"} {
		s, _ := ParseSpec(spec)
		src := randomCache(3, 8, 8, 512, 128)
		b.Run(spec, func(b *testing.B) {
			b.SetBytes(int64(len(src.Tensors[0].Data) * len(src.Tensors)))
			for i := 0; i < b.N; i++ {
				if _, err := Compress(src, Config{Spec: s, Thresholds: DefaultThresholds}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// torch's cast, which SGLang's write calls: round to nearest even, and
// past the range NaN (e4m3fn) or Inf (e5m2), signed; e4m3's 464 is a tie
// that goes to 448.
func TestTorchFP8CastIsNotSaturating(t *testing.T) {
	for _, tc := range []struct {
		f    *fp8Format
		x    float32
		want uint8
	}{
		{fp8E4M3, 448, 0x7e}, {fp8E4M3, 464, 0x7e}, {fp8E4M3, 464.5, 0x7f}, {fp8E4M3, -500, 0xff},
		{fp8E4M3, float32(math.Inf(1)), 0x7f}, {fp8E4M3, float32(math.NaN()), 0x7f},
		{fp8E5M2, 57344, 0x7b}, {fp8E5M2, 61439, 0x7b}, {fp8E5M2, 61440, 0x7c}, {fp8E5M2, -1e6, 0xfc},
		{fp8E5M2, float32(math.Inf(-1)), 0xfc},
	} {
		if got := tc.f.encodeTorch(tc.x); got != tc.want {
			t.Errorf("encodeTorch(%g) = %#x, want %#x", tc.x, got, tc.want)
		}
	}
	for c := 0; c < 0x7f; c++ { // every finite value is its own code, as with the saturating cast
		for _, f := range []*fp8Format{fp8E4M3, fp8E5M2} {
			if c <= int(f.maxCode) && f.encodeTorch(f.decode[c]) != uint8(c) {
				t.Errorf("%g", f.decode[c])
			}
		}
	}
}

// The per-tensor FP8 conversions of a chunk (vLLM's and SGLang's
// encodeFP8All, TensorRT-LLM's, LMCache's) store the codes and count the
// saturated values of the engine's arithmetic element by element, on both
// code paths,
// for scale 1 and calibrated scales, float32 and float16 caches, NaN, Inf,
// values past the range, subnormals, and lengths not a multiple of 32.
func TestFP8AllKernelMatchesScalar(t *testing.T) {
	defer func() { useSIMD = haveSIMD }()
	r := rand.New(rand.NewSource(8))
	// each conversion, and its value before the cast, element by element
	type conv struct {
		f     *fp8Format
		all   func(j *tensorJob, x []float32, qlo, qhi int)
		y     func(v float32, scale float64, dt safetensors.DType) float32
		torch bool // torch's cast (encodeTorch), which counts nothing
	}
	torchY := func(v float32, k float64, dt safetensors.DType) float32 {
		if k == 1 {
			return v
		}
		round := dtypeRounding(dt)
		return round(v / round(float32(k)))
	}
	convs := map[string]conv{
		"vllm e4m3": {fp8E4M3, encodeFP8All(fp8E4M3), func(v float32, k float64, _ safetensors.DType) float32 { return v / float32(k) }, false},
		"vllm e5m2": {fp8E5M2, encodeFP8All(fp8E5M2), func(v float32, k float64, _ safetensors.DType) float32 { return v / float32(k) }, false},
		"trtllm": {fp8E4M3, encodeTRTFP8All, func(v float32, k float64, dt safetensors.DType) float32 {
			round := dtypeRounding(dt)
			return round(v * round(float32(1)/float32(k)))
		}, false},
		"lmcache":     {fp8E4M3, encodeLMCacheFP8All, func(v float32, _ float64, _ safetensors.DType) float32 { return v }, false},
		"sglang e4m3": {fp8E4M3, encodeTorchFP8All(fp8E4M3), torchY, true},
		"sglang e5m2": {fp8E5M2, encodeTorchFP8All(fp8E5M2), torchY, true},
	}
	for name, c := range convs {
		for _, dt := range []safetensors.DType{safetensors.F32, safetensors.F16, safetensors.BF16} {
			for _, scale := range []float64{1, 0.37, 3.1, 1e-3} {
				for _, n := range []int{31, 32, 1000, 1024, 2100} {
					x := make([]float32, n)
					for i := range x {
						x[i] = float32(r.NormFloat64() * []float64{1, 300, 1e-6}[i%3])
						x[i] = dtypeRounding(dt)(x[i]) // a cache of that dtype holds its own values
					}
					x[n/2], x[n/3], x[n-1] = float32(math.NaN()), float32(math.Inf(-1)), 6e4
					x[n/4], x[n/5] = -float32(math.NaN()), float32(math.Inf(1))
					x[n/6], x[n/7], x[n/8] = 464, 463.9, -464.1           // torch's cast: 448, 448, NaN at scale 1
					x[n/9], x[n/10], x[n/11] = 61440, -61439.99, 61440.01 // e5m2: Inf, -57344, Inf
					want, wantSat := make([]byte, n), int64(0)
					top := c.f.decode[c.f.maxCode]
					for i, v := range x {
						y := c.y(v, scale, dt)
						if c.torch {
							want[i] = c.f.encodeTorch(y)
							continue
						}
						if y > top || y < -top {
							wantSat++
						}
						want[i] = c.f.encode(y)
					}
					for _, simd := range []bool{false, haveSIMD} {
						useSIMD = simd
						j := &tensorJob{dtype: dt, l: &layout{s: Scheme{Scale: scale}}, codes: make([]byte, n)}
						c.all(j, x, 0, n)
						if sat := j.saturated.Load(); !slices.Equal(j.codes, want) || sat != wantSat {
							t.Errorf("%s %s scale %v n %d simd %v: other codes, or %d saturated, not %d",
								name, dt, scale, n, simd, sat, wantSat)
						}
					}
				}
			}
		}
	}
}
