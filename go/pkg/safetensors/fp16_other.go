//go:build !amd64

package safetensors

// haveSIMD is false: the Go conversions run everywhere but amd64.
const haveSIMD = false

func noSIMD() { panic("safetensors: no SIMD conversions on this architecture") }

func decodeF16AVX2([]float32, []byte)  { noSIMD() }
func encodeF16AVX2([]byte, []float32)  { noSIMD() }
func decodeBF16AVX2([]float32, []byte) { noSIMD() }
func encodeBF16AVX2([]byte, []float32) { noSIMD() }
