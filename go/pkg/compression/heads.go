package compression

import (
	"fmt"
	"strconv"
	"strings"

	"kvlib/pkg/safetensors"
)

// Head overrides in the pipeline. A tensor whose slot has a head override
// (layers.go) is stored a head at a time: head h is a part named NAME.h<h>,
// shape [1, 1, tokens, head_dim], compressed as a tensor of its own under
// its head's scheme, its TensorInfo naming the whole (Of) and the head.
// A part's codes are the ones the whole tensor would have had under that
// scheme for that head, since a group, a rotation and a channel run never
// cross a head (layout.go), except where a scheme selects a fraction of a
// tensor (outliers, /out; sparsity, /sp): a part selects its fraction of
// the head. Decompress and the report join the parts
// back into the tensor. A file with parts is version HeadsFormatVersion:
// an older reader refuses it rather than return the parts as tensors.

// HeadsFormatVersion is the kvq version of a file holding head parts.
const HeadsFormatVersion = 3

// headPartName is the name head h of the tensor called name is stored under.
func headPartName(name string, h int) string { return name + ".h" + strconv.Itoa(h) }

// A unit is what the pipeline compresses as one tensor: a source tensor, or
// one head of one (of is then the source tensor's name).
type unit struct {
	t      safetensors.Tensor
	scheme Scheme
	of     string
	head   int
}

// name is the source tensor's name (the whole one for a head part).
func (u *unit) name() string {
	if u.of != "" {
		return u.of
	}
	return u.t.Name
}

// splitUnits lists src's tensors as units under spec: one per tensor, or
// one per head for a tensor whose slot has a head override.
func splitUnits(src *safetensors.File, spec Spec) ([]unit, error) {
	var units []unit
	for i := range src.Tensors {
		t := &src.Tensors[i]
		if !t.DType.IsFloat() {
			return nil, tensorErrorf(t.Name, "dtype %s is not F32, F16 or BF16", t.DType)
		}
		heads := 1
		if len(t.Shape) == 4 {
			heads = t.Shape[1]
		}
		hs := spec.headSchemes(t.Name, heads)
		if hs == nil {
			units = append(units, unit{t: *t, scheme: spec.For(t.Name)})
			continue
		}
		if len(t.Shape) != 4 || t.Shape[0] != 1 {
			return nil, tensorErrorf(t.Name, "a head override needs a [1, heads, tokens, head_dim] tensor, not %v", t.Shape)
		}
		if heads > MaxHead+1 {
			return nil, tensorErrorf(t.Name, "a head override splits a tensor of at most %d heads, not %d", MaxHead+1, heads)
		}
		layer, r, _ := slotOf(t.Name)
		for _, o := range spec.Heads {
			if o.Layer == layer && o.Role == r && o.Head >= heads {
				return nil, tensorErrorf(t.Name, "the scheme names head %d, but the tensor has %d heads", o.Head, heads)
			}
		}
		size := len(t.Data) / heads
		for h := range heads {
			part := safetensors.Tensor{Name: headPartName(t.Name, h), DType: t.DType,
				Shape: []int{1, 1, t.Shape[2], t.Shape[3]}, Data: t.Data[h*size : (h+1)*size]}
			units = append(units, unit{t: part, scheme: hs[h], of: t.Name, head: h})
		}
	}
	return units, nil
}

// unitGroups are the units' indices per source tensor, in order.
func unitGroups(units []unit) [][]int {
	var out [][]int
	for i := range units {
		if i > 0 && units[i].of != "" && units[i].of == units[i-1].of {
			out[len(out)-1] = append(out[len(out)-1], i)
			continue
		}
		out = append(out, []int{i})
	}
	return out
}

// joinedScheme is a split tensor's scheme as the report shows it:
// "h0=SCHEME|h1=SCHEME|...".
func joinedScheme(units []unit, g []int) string {
	parts := make([]string, len(g))
	for k, i := range g {
		parts[k] = "h" + strconv.Itoa(units[i].head) + "=" + units[i].scheme.String()
	}
	return strings.Join(parts, "|")
}

// A joined tensor is a source tensor of a compressed file: its name, and
// the indices in the header of what holds it (one tensor, or its heads'
// parts in head order).
type joined struct {
	name  string
	infos []int
}

// joinPlan checks the header's head parts and lists the file's source
// tensors: a part's name is its whole's with .h<head>, its shape [1, 1,
// tokens, head_dim]; a whole's parts share dtype and shape, hold heads 0
// to H-1 once each, and no tensor of the file has the whole's name. The
// error names the whole tensor.
func joinPlan(h *Header) ([]joined, error) {
	var out []joined
	at := map[string]int{} // a whole's index in out
	names := map[string]bool{}
	for _, ti := range h.Tensors {
		if ti.Of == "" {
			names[ti.Name] = true
		}
	}
	for i, ti := range h.Tensors {
		if ti.Of == "" {
			out = append(out, joined{name: ti.Name, infos: []int{i}})
			continue
		}
		if h.Version < HeadsFormatVersion {
			return nil, tensorErrorf(ti.Of, "head parts in a version %d file (they need version %d)", h.Version, HeadsFormatVersion)
		}
		if names[ti.Of] {
			return nil, tensorErrorf(ti.Of, "recorded both whole and as head parts")
		}
		if ti.Head < 0 || ti.Head > MaxHead || ti.Name != headPartName(ti.Of, ti.Head) {
			return nil, tensorErrorf(ti.Of, "head part %q records head %d", ti.Name, ti.Head)
		}
		if len(ti.Shape) != 4 || ti.Shape[0] != 1 || ti.Shape[1] != 1 {
			return nil, tensorErrorf(ti.Of, "head part %q has shape %v, not [1, 1, tokens, head_dim]", ti.Name, ti.Shape)
		}
		k, seen := at[ti.Of]
		if !seen {
			k = len(out)
			at[ti.Of] = k
			out = append(out, joined{name: ti.Of})
		}
		out[k].infos = append(out[k].infos, i)
	}
	for _, j := range out {
		if _, split := at[j.name]; !split {
			continue
		}
		first := h.Tensors[j.infos[0]]
		byHead := make([]int, len(j.infos))
		for k := range byHead {
			byHead[k] = -1
		}
		for _, i := range j.infos {
			ti := h.Tensors[i]
			if ti.DType != first.DType || fmt.Sprint(ti.Shape) != fmt.Sprint(first.Shape) {
				return nil, tensorErrorf(j.name, "head part %q has dtype %s and shape %v, head part %q %s and %v",
					ti.Name, ti.DType, ti.Shape, first.Name, first.DType, first.Shape)
			}
			if ti.Head >= len(byHead) || byHead[ti.Head] >= 0 {
				return nil, tensorErrorf(j.name, "head parts do not hold heads 0 to %d once each (head %d)", len(byHead)-1, ti.Head)
			}
			byHead[ti.Head] = i
		}
		copy(j.infos, byHead)
	}
	return out, nil
}

// joinedTensor is a source tensor from its units' restored bytes: a unit's
// own, or its head parts' one after another (the heads of a batch of one
// are contiguous).
func joinedTensor(name string, jobs []*tensorJob) safetensors.Tensor {
	if len(jobs) == 1 && jobs[0].name == name {
		j := jobs[0]
		return safetensors.Tensor{Name: name, DType: j.dtype, Shape: j.shape, Data: j.restored}
	}
	first := jobs[0]
	data := make([]byte, 0, len(first.restored)*len(jobs))
	for _, j := range jobs {
		data = append(data, j.restored...)
	}
	shape := []int{1, len(jobs), first.shape[2], first.shape[3]}
	return safetensors.Tensor{Name: name, DType: first.dtype, Shape: shape, Data: data}
}
