package compression

import (
	"math"
	"testing"

	"kvlib/pkg/safetensors"
)

// rn16Step strides the float32 bit patterns TestRN16IsTheFP16RoundTrip
// covers (1 checks all 2^32, about a minute).
const rn16Step = 37

// The branch-free fp16 rounding is the conversion pair it replaces, bit
// for bit: on a stride of every float32 (signs, NaNs and infinities
// included) and around each of its paths' edges.
func TestRN16IsTheFP16RoundTrip(t *testing.T) {
	ref := func(v float32) float32 { return safetensors.FP16ToFloat32(safetensors.Float32ToFP16(v)) }
	check := func(u uint32) bool {
		v := math.Float32frombits(u)
		if got, want := math.Float32bits(rn16(v)), math.Float32bits(ref(v)); got != want {
			t.Errorf("rn16(%#08x = %g) = %#08x, want %#08x", u, v, got, want)
			return false
		}
		return true
	}
	bad := 0
	for u := uint64(0); u < 1<<32 && bad < 5; u += rn16Step {
		if !check(uint32(u)) {
			bad++
		}
	}
	for _, edge := range []uint32{0, 0x33000000, 0x38800000, 0x477fe000, 0x477ff000, 0x7f800000, 0x7fc00000} {
		for d := uint32(0); d < 4; d++ { // both sides of each edge, both signs
			for _, s := range []uint32{0, 0x80000000} {
				check(s | (edge + d))
				check(s | (edge - d - 1))
			}
		}
	}
}

// engineBenchFormats are the engine formats with kernels of their own
// (exllamav2.go, exllamav3.go), benchmarked one by one on the bench cache.
var engineBenchFormats = []string{"exllamav2:fp8", "exllamav2:q4", "exllamav2:q8", "exllamav2:q6",
	"exllamav3:2", "exllamav3:3", "exllamav3:4", "exllamav3:8"}

// BenchmarkEngineFormat is compress+restore of each of engineBenchFormats
// (MB/s of F32 input), with the AVX2 kernels and, as portable, without.
func BenchmarkEngineFormat(b *testing.B) {
	for _, name := range engineBenchFormats {
		spec, err := ParseSpec(name)
		if err != nil {
			b.Fatal(err)
		}
		cfg := DefaultConfig()
		cfg.Spec = spec
		for _, simd := range []bool{true, false} {
			sub := name
			if !simd {
				sub += "/portable"
			}
			b.Run(sub, func(b *testing.B) {
				saved := useSIMD
				useSIMD = simd && haveSIMD
				defer func() { useSIMD = saved }()
				b.SetBytes(int64(benchBytes()))
				for i := 0; i < b.N; i++ {
					if _, err := Compress(benchCache, cfg); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
