package compression

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"

	"kvlib/pkg/safetensors"
)

// Outliers (dense-and-sparse, as KVQuant): the floor(p*n) elements of
// largest |x| among the n quantized elements of a tensor (ties: lower flat
// index first) are stored apart, their flat index as U32 and their value as
// FP16, and set to 0 before their group is quantized; the reconstruction
// puts float32(fp16(x)) back at each index.
type outlierSet struct {
	index []uint32 // ascending flat indices into the whole tensor
	value []uint16 // FP16 bits
}

// selectOutliers picks the k largest |x[i]| for i in candidates order (the
// quantized elements, ascending) and returns them sorted by index.
func selectOutliers(x []float32, candidate func(yield func(i int) bool), k int) (outlierSet, error) {
	if k == 0 {
		return outlierSet{}, nil
	}
	type cand struct {
		mag uint32
		i   int
	}
	var all []cand
	candidate(func(i int) bool {
		all = append(all, cand{math.Float32bits(x[i]) & 0x7fffffff, i})
		return true
	})
	// The k-th largest magnitude t: everything above t is an outlier, and
	// the elements equal to t fill the rest in index order.
	t := kthLargest(all, k, func(c cand) uint32 { return c.mag })
	sel := make([]int, 0, k)
	for _, c := range all {
		if c.mag > t {
			sel = append(sel, c.i)
		}
	}
	for _, c := range all { // ties at the threshold, in index order
		if len(sel) == k {
			break
		}
		if c.mag == t {
			sel = append(sel, c.i)
		}
	}
	sort.Ints(sel)
	out := outlierSet{index: make([]uint32, k), value: make([]uint16, k)}
	for j, i := range sel {
		if i > math.MaxUint32 {
			return outlierSet{}, fmt.Errorf("outlier index %d does not fit U32", i)
		}
		h := safetensors.Float32ToFP16(x[i])
		if h&0x7c00 == 0x7c00 {
			return outlierSet{}, fmt.Errorf("%w (outlier %g at element %d)", ErrScaleOverflow, x[i], i)
		}
		out.index[j], out.value[j] = uint32(i), h
	}
	return out, nil
}

// kthLargest returns the k-th largest key (1-based) by a two-pass radix
// select on the 32-bit keys: O(n), no sort of the whole tensor.
func kthLargest[T any](items []T, k int, key func(T) uint32) uint32 {
	var hist [1 << 16]int
	for _, it := range items {
		hist[key(it)>>16]++
	}
	hi, rank := 0, k
	for b := len(hist) - 1; b >= 0; b-- {
		if rank <= hist[b] {
			hi = b
			break
		}
		rank -= hist[b]
	}
	hist = [1 << 16]int{}
	for _, it := range items {
		if kv := key(it); int(kv>>16) == hi {
			hist[kv&0xffff]++
		}
	}
	for b := len(hist) - 1; b >= 0; b-- {
		if rank <= hist[b] {
			return uint32(hi)<<16 | uint32(b)
		}
		rank -= hist[b]
	}
	return 0
}

func (o outlierSet) tensors(name string) []safetensors.Tensor {
	if len(o.index) == 0 {
		return nil
	}
	idx := make([]byte, 4*len(o.index))
	val := make([]byte, 2*len(o.value))
	for j := range o.index {
		binary.LittleEndian.PutUint32(idx[4*j:], o.index[j])
		binary.LittleEndian.PutUint16(val[2*j:], o.value[j])
	}
	return []safetensors.Tensor{
		{Name: name + OutlierIndexSuffix, DType: safetensors.U32, Shape: []int{len(o.index)}, Data: idx},
		{Name: name + OutlierValueSuffix, DType: safetensors.F16, Shape: []int{len(o.value)}, Data: val},
	}
}

// readOutliers decodes and checks a file's outlier tensors for a tensor of
// n elements: indices strictly ascending and below n, values finite.
func readOutliers(idx, val *safetensors.Tensor, count, n int) (outlierSet, error) {
	if count == 0 {
		if idx != nil || val != nil {
			return outlierSet{}, fmt.Errorf("outlier tensors present but the header records none")
		}
		return outlierSet{}, nil
	}
	if idx == nil || val == nil || idx.DType != safetensors.U32 || val.DType != safetensors.F16 ||
		len(idx.Data) != 4*count || len(val.Data) != 2*count {
		return outlierSet{}, fmt.Errorf("want %d outliers as %s (U32) and %s (F16)", count, OutlierIndexSuffix, OutlierValueSuffix)
	}
	o := outlierSet{index: make([]uint32, count), value: make([]uint16, count)}
	for j := 0; j < count; j++ {
		o.index[j] = binary.LittleEndian.Uint32(idx.Data[4*j:])
		o.value[j] = binary.LittleEndian.Uint16(val.Data[2*j:])
		if int64(o.index[j]) >= int64(n) || (j > 0 && o.index[j] <= o.index[j-1]) {
			return outlierSet{}, fmt.Errorf("outlier %d: index %d not ascending or beyond %d elements", j, o.index[j], n)
		}
		if o.value[j]&0x7c00 == 0x7c00 {
			return outlierSet{}, fmt.Errorf("outlier %d: value is not finite", j)
		}
	}
	return o, nil
}

// restore puts the outliers whose index lies in [lo, hi) back into y,
// which holds elements [lo, hi).
func (o outlierSet) restore(y []float32, lo, hi int) {
	j := sort.Search(len(o.index), func(j int) bool { return int(o.index[j]) >= lo })
	for ; j < len(o.index) && int(o.index[j]) < hi; j++ {
		y[int(o.index[j])-lo] = safetensors.FP16ToFloat32(o.value[j])
	}
}
