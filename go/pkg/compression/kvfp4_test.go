package compression

import (
	"math"
	"testing"
)

// The KVFP4 block exponent: the smallest e with 6·2^e >= amax (through
// amax × float32(1/6)), at least -33.
func TestKVFP4Exponent(t *testing.T) {
	for _, tc := range []struct {
		amax float32
		want int
	}{
		{6, 0}, {3, -1}, {6.0001, 1}, {12, 1}, {48, 3}, {48.25, 4}, {5.9999, 0}, {0, -33}, {6e-10, -33},
		{1e-9, -32}, {math.MaxFloat32, 126}, {math.Nextafter32(24, 30), 3},
	} {
		if got := kvfp4Exponent(tc.amax); got != tc.want {
			t.Errorf("amax %g: e %d, want %d", tc.amax, got, tc.want)
		}
	}
}

// Codes: round to nearest, ties away from zero, saturating at 6; a
// negative value rounding to 0 keeps its sign; element 2i low.
func TestKVFP4Block(t *testing.T) {
	x := []float32{6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -1.25, -2.5, -5, -0.1, 0.2499, 4.99, float32(math.Copysign(0, -1))}
	dst := make([]byte, kvfp4Bytes)
	if sglangQuantizeFP4(x, dst) {
		t.Fatal("finite block reported non-finite")
	}
	want := []byte{0x17, 0x32, 0x54, 0x76, 0xb9, 0xfd, 0x08, 0x06, 127}
	for i := range want {
		if dst[i] != want[i] {
			t.Fatalf("bytes %x, want %x", dst, want)
		}
	}
	y := make([]float32, kvfp4Block)
	sglangDequantizeFP4(dst, y)
	wantY := []float32{6, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -1.5, -3, -6, 0, 0, 4, 0}
	for i := range y {
		if y[i] != wantY[i] {
			t.Fatalf("restored %v, want %v", y, wantY)
		}
	}
	if !math.Signbit(float64(y[12])) {
		t.Error("-0.1 should read back as -0")
	}
	x[3] = float32(math.NaN())
	if !sglangQuantizeFP4(x, dst) || dst[8] != 0 || dst[0] != 0 {
		t.Errorf("a NaN block: %x", dst)
	}
}

// ExLlamaV3's bit planes: 6 bits are q>>2 in words 0-3 (2 bits each) and
// q&3 in words 4-5, not 6-bit fields; every width reads back its codes.
func TestExLlamaV3BitPlanes(t *testing.T) {
	if got := exl3Planes(7); len(got) != 3 || got[0] != 4 || got[1] != 2 || got[2] != 1 {
		t.Fatalf("planes of 7: %v", got)
	}
	for bits := 2; bits <= 8; bits++ {
		x := make([]float32, exl3Group)
		for i := range x {
			x[i] = float32(i%7) - 3
		}
		dst := make([]byte, 4*bits+2)
		exl3Quantizer(bits)(x, dst)
		y := make([]float32, exl3Group)
		exl3Dequantizer(bits)(dst, y)
		var worst float64
		for i := range x {
			worst = max(worst, math.Abs(float64(y[i]-x[i])))
		}
		if step := 3 * math.Sqrt(32) / math.Ldexp(1, bits-1) * 2; worst > step {
			t.Errorf("%d bits: error %g beyond %g", bits, worst, step)
		}
	}
}

// vLLM's RHT signs: torch.bernoulli(0.5) under manual_seed(0x9E3779B9),
// as docs/research/vllm-0.33.0-kv-formats.md 2b lists them (checked there
// against torch), from kvlib's own MT19937.
func TestVLLMSigns(t *testing.T) {
	want := []uint32{0x9a8ca6f2, 0x7f7fca4e, 0x59bbc293, 0x9480abc7, 0xb55b747e, 0x54503bbe, 0xcdf467b7, 0x05dfbc5f}
	s := vllmSigns(256)
	for w, mask := range want {
		for b := 0; b < 32; b++ {
			if s[32*w+b] != (mask>>b&1 == 1) {
				t.Fatalf("sign %d: %v, want mask %08x", 32*w+b, s[32*w+b], mask)
			}
		}
	}
	// std::mt19937(5489)'s 10000th output is 4123659995 (the C++ standard's check).
	m := newMT19937(5489)
	var v uint32
	for i := 0; i < 10000; i++ {
		v = m.next()
	}
	if v != 4123659995 {
		t.Errorf("mt19937 10000th output %d", v)
	}
}

// e2m1Step strides the float32 bit patterns the E2M1 code tests cover
// (1 checks all 2^32).
const e2m1Step = 97

// The branch-free E2M1 codes are the bound comparisons they replace, on a
// stride of every float32 (both signs, zeros, NaN) and on each bound:
// SGLang's count of the bounds reached (ties away from zero; -0 and a
// quotient that underflows to it unsigned), and OCP's round to nearest
// even, signed zeros kept.
func TestE2M1CodesCountTheirBounds(t *testing.T) {
	sglang := func(x float32, inv float64) uint8 {
		s := float64(float32(float64(x) * inv))
		var c uint8
		if s < 0 {
			c = 8
		}
		for _, b := range [7]float64{0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5} {
			if math.Abs(s) >= b {
				c++
			}
		}
		return c
	}
	ocp := func(v float64) uint8 {
		var sign uint8
		if math.Signbit(v) {
			sign = 8
		}
		a := math.Abs(v)
		for i, b := range [7]float64{0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5} {
			if a < b || a == b && i%2 == 0 { // a tie goes to the even code
				return sign | uint8(i)
			}
		}
		return sign | 7
	}
	bad := 0
	check := func(u uint32) {
		x := math.Float32frombits(u)
		if x != x {
			if got := e2m1RNE(float64(x)); got != uint8(u>>31<<3)|7 { // saturated, its sign kept
				t.Errorf("e2m1RNE(NaN %#08x) = %#x", u, got)
			}
			return
		}
		for _, inv := range []float64{1, 0.25, 1 << 33} {
			if got, want := kvfp4Code(x, inv), sglang(x, inv); got != want && bad < 5 {
				t.Errorf("kvfp4Code(%g, %g) = %#x, want %#x", x, inv, got, want)
				bad++
			}
		}
		if got, want := e2m1RNE(float64(x)), ocp(float64(x)); got != want && bad < 5 {
			t.Errorf("e2m1RNE(%g) = %#x, want %#x", x, got, want)
			bad++
		}
	}
	for u := uint64(0); u < 1<<32; u += e2m1Step {
		check(uint32(u))
	}
	for _, b := range []float32{0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6, 0} {
		for _, v := range []float32{b, math.Nextafter32(b, 0), math.Nextafter32(b, 10)} {
			check(math.Float32bits(v))
			check(math.Float32bits(-v))
		}
	}
}
