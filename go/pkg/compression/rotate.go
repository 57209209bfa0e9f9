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
// (len(x) a multiple of d, d a power of two).
func RotateRows(x []float32, d int) {
	c := hadamardScale(d)
	for r := 0; r+d <= len(x); r += d {
		v := x[r : r+d : r+d]
		h := 1
		if d%64 == 0 { // the stages below 64 on fixed arrays: no bounds checks
			for b := 0; b < d; b += 64 {
				butterfly64((*[64]float32)(v[b : b+64]))
			}
			h = 64
		}
		for ; h < d; h *= 2 {
			for i := 0; i < d; i += 2 * h {
				a, b := v[i:i+h:i+h], v[i+h:i+2*h:i+2*h]
				for j := range a {
					a[j], b[j] = a[j]+b[j], a[j]-b[j]
				}
			}
		}
		for j := range v {
			v[j] *= c
		}
	}
}

// butterfly64 is the stages h = 1 ... 32 on one block of 64, in the
// order of the generic loop (the same additions, so the same bits).
func butterfly64(v *[64]float32) {
	for h := 1; h < 64; h *= 2 {
		for i := 0; i < 64; i += 2 * h {
			for j := i; j < i+h; j++ {
				a, b := v[j&63], v[(j+h)&63]
				v[j&63], v[(j+h)&63] = a+b, a-b
			}
		}
	}
}
