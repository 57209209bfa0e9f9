package compression

import "math"

// Rotation (QuaRot): an orthonormal Walsh-Hadamard transform along
// head_dim spreads outlier channels over the whole vector before it is
// quantized. The transform is its own inverse, so restoring applies it
// again. In float32, for a row v of power-of-two length d:
//
//	for h = 1, 2, 4, ..., d/2; for i = 0, 2h, 4h, ...; for j in [i, i+h):
//	    v[j], v[j+h] = v[j] + v[j+h], v[j] - v[j+h]
//	then v *= float32(1/sqrt(d))

// hadamardScale is the float32 nearest to 1/sqrt(d).
func hadamardScale(d int) float32 { return float32(1 / math.Sqrt(float64(d))) }

// isPow2 reports whether d is a positive power of two.
func isPow2(d int) bool { return d > 0 && d&(d-1) == 0 }

// RotateRows applies the transform to every row of length d in x
// (len(x) a multiple of d, d a power of two). Butterflies within a stage
// are independent, so any order inside a stage gives the same bits.
func RotateRows(x []float32, d int) {
	x = x[:len(x)/d*d]
	h := 1
	if d >= 8 { // stages h = 1, 2, 4 on 8 values held in registers
		hadamard8(x)
		h = 8
	}
	// A stage's blocks of 2h never straddle two rows (2h <= d), so each
	// stage runs over all rows at once.
	for ; h < d; h *= 2 {
		hadamardStage(x, h)
	}
	scale(x, hadamardScale(d))
}

// butterfly8 is the stages h = 1, 2 and 4 of the transform on 8 values.
func butterfly8(v *[8]float32) {
	x0, x1, x2, x3, x4, x5, x6, x7 := v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]
	x0, x1 = x0+x1, x0-x1 // h = 1
	x2, x3 = x2+x3, x2-x3
	x4, x5 = x4+x5, x4-x5
	x6, x7 = x6+x7, x6-x7
	x0, x2 = x0+x2, x0-x2 // h = 2
	x1, x3 = x1+x3, x1-x3
	x4, x6 = x4+x6, x4-x6
	x5, x7 = x5+x7, x5-x7
	v[0], v[4] = x0+x4, x0-x4 // h = 4
	v[1], v[5] = x1+x5, x1-x5
	v[2], v[6] = x2+x6, x2-x6
	v[3], v[7] = x3+x7, x3-x7
}
