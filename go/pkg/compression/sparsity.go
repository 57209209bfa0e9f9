package compression

import (
	"fmt"
	"sort"
)

// Sparsify zeroes the floor(p*len(x)) elements of smallest magnitude in
// place. Ties at the threshold magnitude are zeroed in index order, so the
// count is exact and the result deterministic.
func Sparsify(x []float32, p float64) error {
	if p < 0 || p >= 1 {
		return fmt.Errorf("sparsity %g out of range [0, 1)", p)
	}
	k := int(p * float64(len(x)))
	if k == 0 {
		return nil
	}
	mags := make([]float32, len(x))
	for i, v := range x {
		if v < 0 {
			v = -v
		}
		mags[i] = v
	}
	sorted := append([]float32(nil), mags...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	t := sorted[k-1] // the k-th smallest magnitude
	below := 0
	for _, m := range mags {
		if m < t {
			below++
		}
	}
	ties := k - below // how many elements equal to t to zero
	for i, m := range mags {
		switch {
		case m < t:
			x[i] = 0
		case m == t && ties > 0:
			x[i] = 0
			ties--
		}
	}
	return nil
}
