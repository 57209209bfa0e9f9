package safetensors

import "kvlib/pkg/cpu"

// haveSIMD: the conversion kernels need AVX2 and F16C.
var haveSIMD = cpu.X86.AVX2 && cpu.X86.F16C

// The assembly conversions (fp16_amd64.s), 8 values a step; each gives the
// bits of its Go loop in fp16.go. len(dst) (F32 side) is a multiple of 8 and
// the other side holds as many values.

//go:noescape
func decodeF16AVX2(dst []float32, src []byte)

//go:noescape
func encodeF16AVX2(dst []byte, src []float32)

//go:noescape
func decodeBF16AVX2(dst []float32, src []byte)

//go:noescape
func encodeBF16AVX2(dst []byte, src []float32)
