package safetensors

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"kvlib/pkg/cpu"
)

// portable runs f with the assembly conversions off.
func portable(f func()) {
	prev := SetSIMD(false)
	defer SetSIMD(prev)
	f()
}

// decodeBoth decodes src (count values of dt) on both paths.
func decodeBoth(src []byte, dt DType) (simd, ref []float32) {
	n := len(src) / 2
	simd, ref = make([]float32, n), make([]float32, n)
	DecodeFloat32s(simd, src, dt)
	portable(func() { DecodeFloat32s(ref, src, dt) })
	return simd, ref
}

func encodeBoth(src []float32, dt DType) (simd, ref []byte) {
	simd, ref = make([]byte, 2*len(src)), make([]byte, 2*len(src))
	EncodeFloat32s(simd, src, dt)
	portable(func() { EncodeFloat32s(ref, src, dt) })
	return simd, ref
}

func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: value %d: %#08x, portable %#08x", what, i, math.Float32bits(got[i]), math.Float32bits(want[i]))
		}
	}
}

func sameBytes(t *testing.T, what string, got, want []byte, src []float32) {
	t.Helper()
	for i := 0; i+1 < len(want); i += 2 {
		if got[i] != want[i] || got[i+1] != want[i+1] {
			t.Fatalf("%s: value %d (%#08x): %#04x, portable %#04x", what, i/2, math.Float32bits(src[i/2]),
				binary.LittleEndian.Uint16(got[i:]), binary.LittleEndian.Uint16(want[i:]))
		}
	}
}

// Every one of the 65536 half and bfloat16 bit patterns, NaN payloads and
// subnormals included, decodes to the portable code's bits.
func TestDecodeEveryPatternMatchesPortable(t *testing.T) {
	src := make([]byte, 2*65536)
	for h := range 65536 {
		binary.LittleEndian.PutUint16(src[2*h:], uint16(h))
	}
	for _, dt := range []DType{F16, BF16} {
		simd, ref := decodeBoth(src, dt)
		sameBits(t, string(dt), simd, ref)
	}
}

// Float32s around every boundary the conversions round at: each half's
// value and its neighbours, the midpoints between halves (ties go to
// even), ±65504 and the overflow threshold 65520, the subnormal range and
// below it, ±0, ±Inf, quiet and signalling NaNs with payloads.
func edgeFloats() []float32 {
	var xs []float32
	add := func(b uint32) { xs = append(xs, math.Float32frombits(b)) }
	for h := range 0x7c00 {
		f := math.Float32bits(FP16ToFloat32(uint16(h)))
		for _, s := range []uint32{0, 0x80000000} {
			for d := uint32(0); d < 3; d++ {
				add(s | (f + d))
				add(s | (f - d))
			}
			add(s | (f + 0x1000)) // the midpoint to the next half (for normals)
		}
	}
	for _, b := range []uint32{0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001,
		0xff800001, 0x7fbfffff, 0x7fc12345, 0x00000001, 0x807fffff, 0x477fe000, 0x477fefff, 0x477ff000,
		0xc77ff000, 0x477fffff, 0x47800000, 0x7f7fffff, 0x33000000, 0x33000001, 0x32ffffff, 0x3f807fff,
		0x3f808000, 0x3f818000, 0x7f7f8000, 0x7f7fffff, 0xff7fffff} {
		add(b)
	}
	return xs
}

func TestEncodeEdgesMatchPortable(t *testing.T) {
	xs := edgeFloats()
	for _, dt := range []DType{F16, BF16} {
		for tail := range 9 { // every tail length after the blocks of 8
			src := xs[:len(xs)-tail]
			simd, ref := encodeBoth(src, dt)
			sameBytes(t, fmt.Sprintf("%s tail %d", dt, tail), simd, ref, src)
		}
	}
}

func TestConversionTables(t *testing.T) {
	cases := []struct {
		dt   DType
		in   float32
		want uint16
	}{
		{F16, 65504, 0x7bff}, {F16, 65519.99, 0x7bff}, {F16, 65520, 0x7c00}, {F16, -1e9, 0xfc00},
		{F16, float32(math.Inf(-1)), 0xfc00}, {F16, 5.9604645e-08, 0x0001}, {F16, 2.9802322e-08, 0x0000},
		{F16, 2.9802326e-08, 0x0001}, {F16, float32(math.Copysign(0, -1)), 0x8000},
		{F16, math.Float32frombits(0x7f800001), 0x7e00}, {F16, math.Float32frombits(0xffc12345), 0xfe00},
		{BF16, 1.00390625, 0x3f80}, {BF16, 1.01171875, 0x3f82}, {BF16, math.Float32frombits(0x7f800001), 0x7fc0},
		{BF16, math.Float32frombits(0x7f7fffff), 0x7f80},
	}
	for _, c := range cases {
		src := make([]float32, 8) // one whole block: the assembly path
		for i := range src {
			src[i] = c.in
		}
		simd, ref := encodeBoth(src, c.dt)
		for _, b := range [][]byte{simd, ref} {
			if got := binary.LittleEndian.Uint16(b); got != c.want {
				t.Errorf("%s(%g = %#08x) = %#04x, want %#04x", c.dt, c.in, math.Float32bits(c.in), got, c.want)
			}
		}
	}
}

// FuzzConversionsMatchPortable converts arbitrary bit patterns both ways on
// both paths.
func FuzzConversionsMatchPortable(f *testing.F) {
	f.Add([]byte{0x01, 0x7c, 0x00, 0x7e, 0xff, 0xff, 0x00, 0x80, 0x00, 0x00, 0x80, 0x7f, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Fuzz(func(t *testing.T, b []byte) {
		b = b[:len(b)&^3]
		for _, dt := range []DType{F16, BF16} {
			simd, ref := decodeBoth(b, dt)
			sameBits(t, "decode "+string(dt), simd, ref)
			xs := make([]float32, len(b)/4)
			for i := range xs {
				xs[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
			}
			se, re := encodeBoth(xs, dt)
			if !bytes.Equal(se, re) {
				sameBytes(t, "encode "+string(dt), se, re, xs)
			}
		}
	})
}

func TestRandomRoundTripsMatchPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 7, 8, 9, 63, 64, 1000, 4099} {
		xs := make([]float32, n)
		for i := range xs {
			xs[i] = float32(r.NormFloat64() * math.Exp(r.NormFloat64()*4))
		}
		for _, dt := range []DType{F16, BF16} {
			se, re := encodeBoth(xs, dt)
			sameBytes(t, fmt.Sprintf("%s n=%d", dt, n), se, re, xs)
			sd, rd := decodeBoth(se, dt)
			sameBits(t, fmt.Sprintf("%s n=%d back", dt, n), sd, rd)
		}
	}
}

func benchConvert(b *testing.B, dt DType, simd bool) {
	prev := SetSIMD(simd)
	defer SetSIMD(prev)
	xs := make([]float32, 1<<20)
	for i := range xs {
		xs[i] = float32(i%4099) * 0.0137
	}
	buf := make([]byte, 2*len(xs))
	b.SetBytes(int64(4 * len(xs)))
	for range b.N {
		EncodeFloat32s(buf, xs, dt)
		DecodeFloat32s(xs, buf, dt)
	}
}

func BenchmarkConvertF16(b *testing.B)          { benchConvert(b, F16, true) }
func BenchmarkConvertF16Portable(b *testing.B)  { benchConvert(b, F16, false) }
func BenchmarkConvertBF16(b *testing.B)         { benchConvert(b, BF16, true) }
func BenchmarkConvertBF16Portable(b *testing.B) { benchConvert(b, BF16, false) }

func ExampleEncodeFloat32s() {
	halves := make([]byte, 2*3)
	EncodeFloat32s(halves, []float32{1, 65520, -0.5}, F16) // 65520 rounds up to +Inf
	fmt.Printf("% x\n", halves)
	// Output: 00 3c 00 7c 00 b8
}

// The comparisons above mean something only where the assembly runs.
func TestAssemblyRunsWhereTheCPUHasIt(t *testing.T) {
	if haveSIMD != (cpu.X86.AVX2 && cpu.X86.F16C) || (haveSIMD && !useSIMD) {
		t.Fatalf("haveSIMD %v useSIMD %v, CPU AVX2 %v F16C %v", haveSIMD, useSIMD, cpu.X86.AVX2, cpu.X86.F16C)
	}
	if !haveSIMD {
		t.Skip("no AVX2/F16C here: only the portable conversions run")
	}
}
