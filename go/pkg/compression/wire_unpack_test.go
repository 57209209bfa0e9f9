package compression

import (
	"bytes"
	"math/rand"
	"testing"
)

// wireUnpackBoth unpacks n codes from lo with the assembly (where this
// machine has it) and with the Go loops.
func wireUnpackBoth(packed []byte, lo, n, bits int) (kernel, portable []uint8) {
	defer func() { useSIMD = haveSIMD }()
	kernel, portable = make([]uint8, n), make([]uint8, n)
	useSIMD = haveSIMD
	wireUnpack(kernel, packed, lo, bits)
	useSIMD = false
	wireUnpack(portable, packed, lo, bits)
	return kernel, portable
}

// The unpacking kernels (wireUnpack4AVX2, wireUnpack2AVX2,
// wireUnpack3AVX2) give the Go loops' codes for every width, start and
// length, on buffers that end where the codes do (the 3-bit kernel's
// reads past its codes stay inside).
func TestWireUnpackKernelsAgree(t *testing.T) {
	if !haveSIMD {
		t.Skip("no assembly kernels here")
	}
	r := rand.New(rand.NewSource(21))
	for bits := 1; bits <= 8; bits++ {
		for trial := 0; trial < 300; trial++ {
			lo := 8 * r.Intn(40)
			n := r.Intn(3000)
			if trial < 80 {
				n = trial // every short length
			}
			packed := make([]byte, PackedLen(lo+n, bits))
			r.Read(packed)
			k, p := wireUnpackBoth(packed, lo, n, bits)
			if !bytes.Equal(k, p) {
				t.Fatalf("bits %d lo %d n %d: the kernel unpacks differently", bits, lo, n)
			}
		}
	}
}

func FuzzWireUnpack(f *testing.F) {
	f.Add([]byte{0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0}, uint8(3), uint8(0))
	f.Add(bytes.Repeat([]byte{0xa5, 0x3c, 0xff}, 50), uint8(4), uint8(1))
	f.Add(bytes.Repeat([]byte{0x1b}, 100), uint8(2), uint8(2))
	f.Fuzz(func(t *testing.T, packed []byte, bits, lo8 uint8) {
		b := int(bits%8) + 1
		lo := 8 * int(lo8%16)
		n := len(packed)*8/b - lo
		if n < 0 {
			return
		}
		k, p := wireUnpackBoth(packed, lo, n, b)
		if !bytes.Equal(k, p) {
			t.Fatalf("bits %d lo %d n %d: the kernel unpacks differently", b, lo, n)
		}
	})
}
