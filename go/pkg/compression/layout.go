package compression

import (
	"fmt"
	"math"

	"kvlib/pkg/safetensors"
)

// A layout maps a tensor's elements to its scheme's groups.
//
// The quantized elements are the whole tensor, or, with a residual of R
// tokens, the first T-R tokens of each [batch, head] slab of a
// [batch, heads, T, head_dim] tensor. In "q-order" they are lined up in
// rows that groups never cross: along the token axis one row holding the
// quantized elements row-major (so groups run along head_dim and on into
// the next token, the last group may be shorter); along the channel axis
// one row per (batch, head, channel) holding that channel's T-R tokens
// (the last group of each row may be shorter). Codes, scales and zero
// points are stored in q-order.
//
// Work is split into chunks of whole units: (batch, head) slabs when the
// scheme keeps a residual or groups along channels, head_dim rows when it
// rotates, single elements otherwise. A chunk's first code starts on a
// byte and, along the token axis, on a group.
type layout struct {
	s                 Scheme
	q                 *quantizer // s.Method's entry in methods
	n                 int
	fourD             bool
	b, h, t, d        int
	tq                int  // quantized tokens per slab (4-D)
	slab              bool // units are (batch, head) slabs
	nq                int  // quantized elements
	rowLen, gpr, rows int  // q-order rows, groups per row
	groups            int
	unitNat, unitQ    int // elements per unit: all, quantized
	units, chunkUnits int
	// rot is the Hadamard size along head_dim (0: none): head_dim for
	// kvlib's /rot (QuaRot, RotateRows), the engine's size for an engine
	// format (LlamaCppRotate, on runs of rot values).
	rot      int
	llamaRot bool
	esz      int // bytes per source element (none stores them)
	// group is the elements of a group (the scheme's, or for an engine's
	// per-token-head format the tensor's head_dim); blockElems and
	// blockBytes are a block type's elements and bytes per block.
	group, blockElems, blockBytes int
}

// chunkTarget is about how many elements one goroutine takes at a time.
const chunkTarget = 1 << 14

// newLayout lays out a tensor of the given shape and source dtype under
// scheme s. rot is the Hadamard size an engine format rotates by, as
// engineRotation decided it (or a file recorded it); 0 for every other
// scheme, whose /rot is kvlib's own (the whole head_dim).
func newLayout(shape []int, s Scheme, dt safetensors.DType, rot int) (*layout, error) {
	l := &layout{s: s, q: quantizerOf(s.Method), n: product(shape), fourD: len(shape) == 4, esz: dt.Size()}
	if l.q == nil {
		return nil, fmt.Errorf("unknown method %q", s.Method)
	}
	if s.needs4D() && !l.fourD {
		return nil, fmt.Errorf("scheme %s needs a 4-D [batch, heads, tokens, head_dim] tensor, shape is %v", s, shape)
	}
	if l.q.engine != nil && l.q.engine.whole && !l.fourD {
		return nil, fmt.Errorf("%s has one scale per token over all heads and needs a 4-D [batch, heads, tokens, head_dim] tensor, shape is %v",
			s.Method, shape)
	}
	if l.fourD {
		l.b, l.h, l.t, l.d = shape[0], shape[1], shape[2], shape[3]
		l.tq = l.t - min(s.Residual, l.t)
	}
	switch {
	case l.q.engine != nil:
		if rot != 0 && (!s.Rotate || !l.fourD || rot < 64 || !isPow2(rot) || l.d%rot != 0) {
			return nil, fmt.Errorf("rotation %d does not fit scheme %s and shape %v", rot, s, shape)
		}
		l.rot, l.llamaRot = rot, true
	case rot != 0:
		return nil, fmt.Errorf("rotation %d recorded for scheme %s, which has no engine rotation", rot, s)
	case s.Rotate && !isPow2(l.d):
		return nil, fmt.Errorf("rotation needs a power-of-two head_dim, shape is %v", shape)
	case s.Rotate:
		l.rot = l.d
	}
	if s.Outliers > 0 && l.n > math.MaxUint32 {
		return nil, fmt.Errorf("outliers need at most 2^32 elements, tensor has %d", l.n)
	}
	l.slab = l.fourD && (s.Residual > 0 || s.Axis == Channel)
	switch {
	case l.slab:
		l.unitNat, l.unitQ, l.units = l.t*l.d, l.tq*l.d, l.b*l.h
	case l.rot > 0:
		l.unitNat, l.unitQ, l.units = l.d, l.d, l.n/max(l.d, 1)
	default:
		l.unitNat, l.unitQ, l.units = 1, 1, l.n
	}
	if l.n == 0 { // nothing to do, whatever the shape claims
		l.units = 0
	}
	l.nq = l.unitQ * l.units
	group := s.Group
	if l.q.identity {
		group = 1 // none has no groups; its chunks align like single elements
	}
	if !l.q.packed() {
		l.blockElems, l.blockBytes = l.q.block.blockElems(), l.q.block.blockSize
		if f := l.q.engine; f != nil && f.perHead {
			if !l.fourD {
				return nil, fmt.Errorf("%s has one scale per token and head and needs a 4-D [batch, heads, tokens, head_dim] tensor, shape is %v", s.Method, shape)
			}
			if l.d == 0 {
				return nil, fmt.Errorf("%s has one scale per token and head and needs head_dim > 0, shape is %v", s.Method, shape)
			}
			group, l.blockElems, l.blockBytes = l.d, l.d, f.headBytes(l.d)
		}
		if l.nq%l.blockElems != 0 {
			return nil, fmt.Errorf("%s needs a multiple of %d quantized elements, tensor has %d", s.Method, l.blockElems, l.nq)
		}
	}
	l.group = group
	switch {
	case l.nq == 0:
	case s.Axis == Channel:
		l.rowLen, l.rows = l.tq, l.b*l.h*l.d
	default:
		l.rowLen, l.rows = l.nq, 1
	}
	if l.rowLen > 0 {
		l.gpr = (l.rowLen-1)/group + 1
		l.groups = l.rows * l.gpr
	}
	// Chunk alignment: the first code on a byte (8 codes), and along the
	// token axis on a group.
	align := 8
	if s.Axis == Token {
		align = lcm(align, group)
	}
	k0 := 1
	if l.unitQ > 0 {
		k0 = align / gcd(l.unitQ, align)
	}
	l.chunkUnits = k0
	if l.unitNat > 0 && l.unitNat <= chunkTarget/k0 {
		l.chunkUnits = k0 * max(1, chunkTarget/(k0*l.unitNat))
	}
	l.chunkUnits = max(1, min(l.chunkUnits, l.units))
	return l, nil
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func lcm(a, b int) int { return a / gcd(a, b) * b }

func product(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

func (l *layout) numChunks() int {
	if l.units == 0 {
		return 0
	}
	return (l.units-1)/l.chunkUnits + 1
}

// chunk returns chunk c's units and its ranges of elements (natural
// order) and of quantized elements (q-order).
func (l *layout) chunk(c int) (u0, u1, nlo, nhi, qlo, qhi int) {
	u0, u1 = c*l.chunkUnits, min(l.units, (c+1)*l.chunkUnits)
	return u0, u1, u0 * l.unitNat, u1 * l.unitNat, u0 * l.unitQ, u1 * l.unitQ
}

// codeBytes is the size of the stored codes (packed, or ggml blocks).
func (l *layout) codeBytes() int {
	switch {
	case l.q.identity, l.q.engine != nil && l.q.engine.identity:
		return l.nq * l.esz
	case l.q.engine != nil && l.q.engine.whole:
		return 0 // variable: the engine writes it (cacheGenSizeRange bounds it)
	case !l.q.packed():
		return l.nq / l.blockElems * l.blockBytes
	}
	return PackedLen(l.nq, l.s.Bits)
}

// rotate applies the layout's rotation to whole head_dim rows x (its own
// inverse): kvlib's QuaRot transform, or the engine's kernel.
func (l *layout) rotate(x []float32) {
	if l.llamaRot {
		LlamaCppRotate(x, l.rot)
		return
	}
	RotateRows(x, l.d)
}

// residualElems is how many elements are kept exact.
func (l *layout) residualElems() int {
	if !l.slab {
		return 0
	}
	return l.n - l.nq
}

// runs reports whether the groups of a chunk are its whole blocks one
// after the other, group g at elements [g·group, (g+1)·group) and block
// g of the codes: an engine block type along the token axis, where
// eachGroup's groups are exactly these (the run entries of engineFormat).
func (l *layout) runs() bool {
	return l.s.Axis == Token && !l.slab && l.group == l.blockElems && l.group > 0 && l.rowLen%l.group == 0 &&
		l.residualElems() == 0 && !l.q.packed()
}

// eachGroup calls fn for the groups of q-order range [qlo, qhi) (chunk
// bounds, so whole groups): its bounds relative to qlo and its index.
func (l *layout) eachGroup(qlo, qhi int, fn func(gs, ge, gi int) error) error {
	for r := qlo; r < qhi; {
		row := r / l.rowLen
		rs := row * l.rowLen
		k := (r - rs) / l.group
		ge := min(rs+(k+1)*l.group, rs+l.rowLen)
		if err := fn(r-qlo, ge-qlo, row*l.gpr+k); err != nil {
			return err
		}
		r = ge
	}
	return nil
}

// gather copies the quantized elements of units [u0, u1) from src (their
// natural elements) into dst, in natural order.
func (l *layout) gather(dst, src []float32, u0, u1 int) {
	if !l.slab {
		copy(dst, src)
		return
	}
	for u := 0; u < u1-u0; u++ {
		copy(dst[u*l.unitQ:(u+1)*l.unitQ], src[u*l.unitNat:u*l.unitNat+l.unitQ])
	}
}

// scatter is the inverse of gather.
func (l *layout) scatter(dst, src []float32, u0, u1 int) {
	if !l.slab {
		copy(dst, src)
		return
	}
	for u := 0; u < u1-u0; u++ {
		copy(dst[u*l.unitNat:u*l.unitNat+l.unitQ], src[u*l.unitQ:(u+1)*l.unitQ])
	}
}

// toQOrder lines up the quantized elements of whole slabs for channel
// groups (each slab [tq, d] becomes [d, tq]); other layouts are already
// in q-order, and it returns src itself.
func (l *layout) toQOrder(dst, src []float32) []float32 {
	if l.s.Axis != Channel {
		return src
	}
	transpose(dst[:len(src)], src, l.tq, l.d)
	return dst[:len(src)]
}

// fromQOrder is the inverse of toQOrder.
func (l *layout) fromQOrder(dst, src []float32) []float32 {
	if l.s.Axis != Channel {
		return src
	}
	transpose(dst[:len(src)], src, l.d, l.tq)
	return dst[:len(src)]
}

// transpose writes each [r, c] matrix of src as [c, r] into dst, in
// tiles that stay in cache.
func transpose(dst, src []float32, r, c int) {
	const tile = 32
	m := r * c
	if m == 0 { // nothing to move (e.g. a residual that covers every token)
		return
	}
	for base := 0; base+m <= len(src); base += m {
		s, d := src[base:base+m], dst[base:base+m]
		if useSIMD && r%8 == 0 && c%8 == 0 {
			transposeAVX2(d, s, r, c)
			continue
		}
		for i0 := 0; i0 < r; i0 += tile {
			for j0 := 0; j0 < c; j0 += tile {
				for i := i0; i < min(i0+tile, r); i++ {
					row := s[i*c : i*c+c]
					for j := j0; j < min(j0+tile, c); j++ {
						d[j*r+i] = row[j]
					}
				}
			}
		}
	}
}

// head returns the KV head of natural element i of a 4-D tensor.
func (l *layout) head(i int) int { return i / (l.t * l.d) % l.h }
