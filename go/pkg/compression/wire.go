package compression

import (
	"encoding/binary"
	"math"
	"sync"

	"kvlib/pkg/safetensors"
)

// The wire stage (spec suffix "+wire"): the lossless stage's sibling for the
// fewest bytes on the wire. A tensor's packed codes (sym, symf, asym, lm:
// codes of b <= 8 bits) are coded by the static context rANS coder of
// wire_rans.go, a context per (head, channel) or coarser, as measured; its
// model (header and frequency tables, counted in the size) is
// NAME.codes.wire (U8), its chunks' streams NAME.codes (U8) and their end
// offsets NAME.codes.chunks (U64), so chunks decode in parallel. The FP16
// scales and zero points of those tensors (NAME.scales, NAME.zeros) are
// split into two byte planes, every value's high byte (sign, exponent, two
// mantissa bits) then every low byte, and the planes coded by the same
// coder with a table per plane (wireF16Shape: the interleaved bytes' one
// Huffman table mixes the two distributions; apart they code about 1.7 bits
// a value smaller on a real cache), in NAME.scales, NAME.scales.chunks and
// NAME.scales.wire; a scales or zeros part stays with the Huffman coder
// wherever that codes it no larger. Every other part (ggml blocks, engines'
// bytes) goes through the lossless stage's Huffman coder, and any part
// that would not get smaller stays as it is. kvq.tensors records the wire-coded parts in
// "wire" and the Huffman-coded ones in "lossless". The reconstruction is bit
// for bit that of the same scheme without the stage.

// WireSuffix switches the wire stage on in a spec string.
const WireSuffix = "+wire"

// WireModelSuffix names a wire-coded part's model: NAME.codes.wire.
const WireModelSuffix = ".wire"

// wireShapeOf is the context shape of a layout's codes, false where its
// codes are not plain packed codes the wire coder models.
func wireShapeOf(l *layout) (wireShape, bool) {
	if !l.q.packed() || l.q.identity || l.q.engine != nil || l.s.Bits < 1 || l.s.Bits > 8 {
		return wireShape{}, false
	}
	w := wireShape{fourD: l.fourD, channel: l.fourD && l.s.Axis == Channel, h: l.h, d: l.d, tq: l.tq,
		n: l.nq, bits: l.s.Bits, rawBytes: l.codeBytes(), perHeadRun: l.tq * l.d}
	return w, w.rawBytes == PackedLen(w.n, w.bits)
}

// wirePrecision is the probability precision the encoder uses for b-bit codes.
func wirePrecision(bits int) int { return min(12, bits+8, max(10, bits+4)) }

// buildWireModel chooses, from the codes' counts, the context mode,
// resolution and table code that make the part smallest.
func buildWireModel(syms []uint8, w wireShape) *wireModel { return buildWireModelRaw(syms, nil, w) }

// buildWireModelRaw is buildWireModel from the codes unpacked (syms) or,
// where wireCountPacked takes them (syms nil), packed (raw).
func buildWireModelRaw(syms []uint8, raw []byte, w wireShape) *wireModel {
	A := 1 << w.bits
	full := 3
	if !w.fourD || w.contexts(3) > wireMaxCtx || w.contexts(3) < 1 {
		full = 0
	}
	if w.bytes && full > 1 {
		full = 1 // bytes: a table per head at most (finer tables of 256 symbols did not pay off, and cost the search)
	}
	nfull := w.contexts(full)
	counts := make([]uint32, nfull*A)
	if syms == nil {
		wireCountPacked(counts, raw, w)
	}
	it := w.runIter(full, 0, len(syms))
	var sub *[4][256]uint32
	for i := 0; i < len(syms); {
		n, c0, step := it.next()
		seg := syms[i : i+n]
		i += n
		if step == 0 {
			if sub == nil && n >= wireCountSplit {
				sub = new([4][256]uint32)
			}
			wireCountRun(counts[c0*A:(c0+1)*A], seg, sub)
			continue
		}
		for k, s := range seg {
			counts[(c0+k)*A+int(s)]++
		}
	}
	var best *wireModel
	bestBits := math.Inf(1)
	lm := wireLog2Memos.Get().(*wireLog2Memo)
	defer wireLog2Memos.Put(lm)
	// The finest mode first where the alphabet is small (it is then most
	// often the smallest), the coarsest first for bytes (whose fine tables
	// are large); a mode whose ideal code (the counts' entropy, which no
	// table reaches) and tables at their smallest (a bit an entry) come to
	// no less than the best so far is not tried at any resolution.
	var seen [4]bool
	for mi := 0; mi <= full; mi++ {
		mode := (full + mi) % (full + 1)
		if A > 16 {
			mode = mi
		}
		// A mode whose contexts are an earlier one's (with one channel a
		// head, per channel is one context and per (head, channel) per
		// head; with one head, per head is one context) repeats its
		// candidates, none of which can then be strictly smaller.
		same := mode
		if w.d == 1 {
			same &^= 2
		}
		if w.h == 1 {
			same &^= 1
		}
		if seen[same] {
			continue
		}
		seen[same] = true
		nctx := w.contexts(mode)
		prec := wirePrecision(w.bits) // lowered where the tables would outgrow the tensor
		if w.n >= wireWideMin && prec > w.bits && w.bits < 8 {
			// one bit less for the 32-state coder, whose decoder reads a
			// 4-byte entry a slot: half the table to fill and keep in cache
			// for under 0.1 % more bytes on the benchmark cache (not for
			// bytes, whose 256 symbols need the resolution)
			prec--
		}
		for prec > w.bits && nctx<<prec > max(w.n, wireTableAllowance) {
			prec--
		}
		if nctx < 1 || nctx > wireMaxCtx || nctx<<prec > max(w.n, wireTableAllowance) {
			continue
		}
		lg := wireLog2Table(prec)
		// log2(tot/k) per context and symbol, which every resolution rounds
		ideal := make([]float64, nctx*A)
		cm := make([]uint32, nctx*A)
		for hc := 0; hc < nfull; hc++ {
			c := hc
			switch mode {
			case 0:
				c = 0
			case 1:
				c = hc / w.d
			case 2:
				c = hc % w.d
			}
			for s := 0; s < A; s++ {
				cm[c*A+s] += counts[hc*A+s]
			}
		}
		var entropy float64
		for c := 0; c < nctx; c++ {
			var tot float64
			for _, k := range cm[c*A : (c+1)*A] {
				tot += float64(k)
			}
			for s, k := range cm[c*A : (c+1)*A] {
				if k > 0 {
					ideal[c*A+s] = lm.log2(tot, k)
					entropy += float64(k) * ideal[c*A+s]
				}
			}
		}
		if entropy+float64(nctx*A) >= bestBits {
			continue
		}
		for _, res := range []int{1, 2, 4, 8} {
			m := &wireModel{bits: w.bits, mode: mode, prec: prec, res: res, chunkLog: wireChunkLog, nctx: nctx,
				levels: make([]uint8, nctx*A), states: wireStates}
			if w.n >= wireWideMin {
				m.states, m.chunkLog = wireWideStates, wireWideChunk
			}
			maxLevel := wireMaxLevel(res, prec)
			for c := 0; c < nctx; c++ {
				used := false
				for s, k := range cm[c*A : (c+1)*A] {
					if k > 0 {
						m.levels[c*A+s] = uint8(min(maxLevel, 1+int(math.Round(float64(res)*ideal[c*A+s]))))
						used = true
					}
				}
				if !used { // an unused context still needs a symbol
					m.levels[c*A] = 1
				}
			}
			tb := math.Inf(1)
			for k, size := range m.tableSizes() {
				if t := float64(8 * size); t < tb {
					tb, m.egk = t, k
				}
			}
			// The codes' bits are at least their entropy (Gibbs's
			// inequality: the frequencies of the present symbols sum to at
			// most M; the margin covers the two sums' rounding), so a
			// candidate whose tables bring that to the best so far cannot
			// beat it, and its frequencies are not worked out.
			if entropy*(1-1e-6)-1+tb >= bestBits {
				continue
			}
			m.setLevels()
			var bits float64
			for i, k := range cm {
				if k > 0 {
					bits += float64(k) * lg[m.fs[i]&0xffff]
				}
			}
			if bits+tb < bestBits {
				best, bestBits = m, bits+tb
			}
		}
	}
	best, bestBits = wireTryOrder1(best, bestBits, syms, raw, w)
	best.cost = bestBits
	return best
}

// wireCountPackedRows is wireCountPacked for codes along tokens in
// channel rows (of whole bytes, every byte's codes in one context): a
// histogram of the bytes per context, four rows (four contexts) a step so
// that a byte repeated along a row does not wait on its own count, then
// each histogram's codes' margins.
func wireCountPackedRows(counts []uint32, raw []byte, w wireShape) {
	k := 8 / w.bits
	A := 1 << w.bits
	rowBytes := w.tq / k
	rows := w.n / w.tq
	nctx := w.h * w.d
	raw = raw[:rows*rowBytes]
	hist := make([][256]uint32, nctx)
	for r := 0; r < rows; {
		c := r % nctx
		if r+4 > rows || c+4 > nctx { // the last rows, or four that wrap around the contexts: one by one
			h := &hist[c]
			for _, b := range raw[r*rowBytes : (r+1)*rowBytes] {
				h[b]++
			}
			r++
			continue
		}
		h := hist[c : c+4 : c+4]
		r0 := raw[r*rowBytes : (r+1)*rowBytes]
		r1 := raw[(r+1)*rowBytes : (r+2)*rowBytes]
		r2 := raw[(r+2)*rowBytes : (r+3)*rowBytes]
		r3 := raw[(r+3)*rowBytes : (r+4)*rowBytes]
		r1, r2, r3 = r1[:len(r0)], r2[:len(r0)], r3[:len(r0)]
		for j, b := range r0 {
			h[0][b]++
			h[1][r1[j]]++
			h[2][r2[j]]++
			h[3][r3[j]]++
		}
		r += 4
	}
	// the margins: for 4-bit codes, the 16x16 table's two; for 2-bit ones,
	// per byte the count of each code among its four, two codes to a
	// 64-bit word (wireFields2), by one multiply-add a byte
	fields := wireFields2()
	for hc := range hist {
		hg := &hist[hc]
		cs := counts[hc*A : (hc+1)*A]
		if k == 2 {
			lo, hi := nibbleCounts(hg)
			for y := range lo {
				cs[y] += lo[y] + hi[y]
			}
			continue
		}
		var a01, a23 uint64
		for b, v := range hg {
			a01 += uint64(v) * fields[b][0]
			a23 += uint64(v) * fields[b][1]
		}
		cs = cs[:4]
		cs[0] += uint32(a01)
		cs[1] += uint32(a01 >> 32)
		cs[2] += uint32(a23)
		cs[3] += uint32(a23 >> 32)
	}
}

// wireFields2[b] counts the 2-bit codes of byte b by value: codes 0 and 1
// in the low and high halves of the first word, 2 and 3 in the second's.
var wireFields2 = sync.OnceValue(func() *[256][2]uint64 {
	var t [256][2]uint64
	for b := range t {
		for q := 0; q < 4; q++ {
			a := b >> (2 * q) & 3
			t[b][a>>1] += 1 << (32 * (a & 1))
		}
	}
	return &t
})

// wireCountPacked3 is wireCountPacked for 3-bit codes: a histogram of the
// 6-bit pairs of codes per pair of channels, eight pairs (6 bytes) a
// 64-bit read.
func wireCountPacked3(counts []uint32, raw []byte, w wireShape) {
	const A = 8
	rowBytes, pairs := w.d*3/8, w.d/2
	hist := make([][64]uint32, w.h*pairs)
	rows := w.n / w.d
	raw = raw[:rows*rowBytes]
	for r, head := 0, 0; r < rows; head = (head + 1) % w.h {
		h := hist[head*pairs : (head+1)*pairs]
		for end := min(rows, r+w.tq); r < end; r++ {
			for g, off := 0, r*rowBytes; g < pairs; g, off = g+8, off+6 {
				var v uint64
				if off+8 <= len(raw) {
					v = binary.LittleEndian.Uint64(raw[off:])
				} else { // the last group: its 6 bytes only
					v = uint64(binary.LittleEndian.Uint32(raw[off:])) | uint64(binary.LittleEndian.Uint16(raw[off+4:]))<<32
				}
				hg := h[g : g+8 : g+8]
				hg[0][v&63]++
				hg[1][v>>6&63]++
				hg[2][v>>12&63]++
				hg[3][v>>18&63]++
				hg[4][v>>24&63]++
				hg[5][v>>30&63]++
				hg[6][v>>36&63]++
				hg[7][v>>42&63]++
			}
		}
	}
	for g := range hist {
		c := 2 * g // context of the pair's first code: head*d + channel
		for b, v := range &hist[g] {
			if v != 0 {
				counts[c*A+(b&7)] += v
				counts[(c+1)*A+(b>>3)] += v
			}
		}
	}
}

// wireCountSplit is the run length from which wireCountRun counts into
// four histograms.
const wireCountSplit = 64

// wireCountRun adds the counts of the symbols seg, each below len(cs), to
// cs. A long run goes into the four histograms of sub by turns (zero
// before and after), so that a symbol repeated does not wait on its own
// count's store.
func wireCountRun(cs []uint32, seg []uint8, sub *[4][256]uint32) {
	if len(seg) < wireCountSplit || sub == nil {
		for _, s := range seg {
			cs[s]++
		}
		return
	}
	n4 := len(seg) &^ 3
	for i := 0; i < n4; i += 4 {
		g := seg[i : i+4 : i+4]
		sub[0][g[0]]++
		sub[1][g[1]]++
		sub[2][g[2]]++
		sub[3][g[3]]++
	}
	for _, s := range seg[n4:] {
		cs[s]++
	}
	cs = cs[:min(len(cs), 256)]
	for s := range cs {
		cs[s] += sub[0][s] + sub[1][s] + sub[2][s] + sub[3][s]
		sub[0][s], sub[1][s], sub[2][s], sub[3][s] = 0, 0, 0, 0
	}
}

// wireLog2Memo is math.Log2(tot / k) for counts k below its size, each
// worked out once for the tot it was last asked with: the contexts of a
// mode mostly hold the same number of codes, and their counts repeat. An
// entry holds its tot, so a memo serves any model search after another
// (wireLog2Memos).
type wireLog2Memo struct {
	tot [wireLog2MemoSize]float64
	val [wireLog2MemoSize]float64
}

const wireLog2MemoSize = 4096

var wireLog2Memos = sync.Pool{New: func() any { return new(wireLog2Memo) }}

func (l *wireLog2Memo) log2(tot float64, k uint32) float64 {
	if k >= wireLog2MemoSize {
		return math.Log2(tot / float64(k))
	}
	if l.tot[k] != tot {
		l.tot[k], l.val[k] = tot, math.Log2(tot/float64(k))
	}
	return l.val[k]
}

// wireByteShape is the shape of the packed bytes of codes of shape w coded
// as 8-bit symbols (version 2): where w's rows (head_dim channels along
// tokens, tokens along channels) are whole bytes, rows of bytes with
// contexts as w's, else one context.
func wireByteShape(w wireShape) wireShape {
	b := wireShape{n: w.rawBytes, bits: 8, rawBytes: w.rawBytes, bytes: true}
	if !w.fourD || w.bits >= 8 || 8%w.bits != 0 || w.h < 1 || w.d < 1 || w.tq < 1 {
		return b
	}
	k := 8 / w.bits
	switch {
	case w.n%k != 0 || w.rawBytes != w.n/k:
	case w.channel && w.tq%k == 0:
		b.fourD, b.channel, b.h, b.d, b.tq = true, true, w.h, w.d, w.tq/k
	case !w.channel && w.d%k == 0:
		b.fourD, b.h, b.d, b.tq = true, w.h, w.d/k, w.tq
	}
	b.perHeadRun = b.tq * b.d
	return b
}

// wireEstimate is about the size a part of shape w codes to with model m:
// its codes' bits and tables, its states and offsets.
func wireEstimate(m *wireModel, w wireShape) float64 {
	chunks := (w.n-1)>>m.chunkLog + 1
	return m.cost/8 + float64(chunks*(4*m.states+8)+wireHeaderSize)
}

// wirePackedCounts reports whether wireCountPacked counts the codes of
// shape w from their packed bytes: 2- and 4-bit codes along tokens, every
// byte's codes in one row of head_dim channels, and 3-bit ones in rows of
// a multiple of 16 channels (whole 6-byte groups).
func wirePackedCounts(w wireShape) bool {
	per := 8 / max(1, w.bits)
	if w.channel {
		// rows of tokens along channels: 2- and 4-bit codes, rows of whole bytes
		return (w.bits == 2 || w.bits == 4) && w.fourD && w.d > 0 && w.tq > 0 && w.h > 0 &&
			w.tq%per == 0 && w.n%w.tq == 0 && w.contexts(3) <= wireMaxCtx && w.rawBytes == w.n*w.bits/8
	}
	if w.bits == 3 {
		per = 16
	}
	return (w.bits == 2 || w.bits == 3 || w.bits == 4) && w.fourD && w.d > 0 && w.tq > 0 && w.h > 0 &&
		w.d%per == 0 && w.n%w.d == 0 && w.contexts(3) <= wireMaxCtx && w.rawBytes == w.n*w.bits/8
}

// wireCountPacked adds the counts of the (head, channel) contexts of the
// packed codes raw (wirePackedCounts's shapes) to counts: a histogram of
// the bytes per run of 8/bits contexts, one increment a byte, then split.
func wireCountPacked(counts []uint32, raw []byte, w wireShape) {
	if w.channel {
		wireCountPackedRows(counts, raw, w)
		return
	}
	if w.bits == 3 {
		wireCountPacked3(counts, raw, w)
		return
	}
	k := 8 / w.bits
	A := 1 << w.bits
	rowBytes := w.d / k
	groups := w.h * rowBytes
	hist := make([][256]uint32, groups)
	rows := w.n / w.d
	raw = raw[:rows*rowBytes]
	// a head's rows (tq of them, then the next head's) into its rowBytes
	// histograms: the slices of equal length let the compiler drop the
	// bounds checks, and four bytes a step keep four increments in flight
	for r, head := 0, 0; r < rows; head = (head + 1) % w.h {
		h := hist[head*rowBytes : (head+1)*rowBytes]
		for end := min(rows, r+w.tq); r < end; r++ {
			row := raw[r*rowBytes : (r+1)*rowBytes]
			row = row[:len(h)]
			j := 0
			for ; j < len(h)-3; j += 4 {
				b0, b1, b2, b3 := row[j], row[j+1], row[j+2], row[j+3]
				h[j][b0]++
				h[j+1][b1]++
				h[j+2][b2]++
				h[j+3][b3]++
			}
			for ; j < len(h); j++ {
				h[j][row[j]]++
			}
		}
	}
	// each byte's histogram split into its codes' counts (the context of
	// the byte's first code is head*d + channel, g*k): the margins of the
	// 16x16 table of the two nibbles, or of the four 2-bit fields
	for g := range hist {
		hg := &hist[g]
		cs := counts[g*k*A : (g+1)*k*A]
		if k == 2 {
			lo, hi := nibbleCounts(hg)
			for y := range lo {
				cs[y] += lo[y]
				cs[16+y] += hi[y]
			}
			continue
		}
		var m [4][4]uint32
		for b, v := range hg {
			m[0][b&3] += v
			m[1][b>>2&3] += v
			m[2][b>>4&3] += v
			m[3][b>>6&3] += v
		}
		for q := range m {
			for a, v := range m[q] {
				cs[q*4+a] += v
			}
		}
	}
}

// wireLog2Tables[p][f] is log2(2^p / f), f = 1..2^p: a frequency's cost in
// bits at precision p, computed once.
var wireLog2Tables = sync.OnceValue(func() [][]float64 {
	t := make([][]float64, 13)
	for p := range t {
		M := float64(int(1) << p)
		t[p] = make([]float64, 1<<p+1)
		for f := 1; f <= 1<<p; f++ {
			t[p][f] = math.Log2(M / float64(f))
		}
	}
	return t
})

func wireLog2Table(prec int) []float64 { return wireLog2Tables()[prec] }

// wireF16Shape is the shape of a part of nv FP16 values coded as two byte
// planes: the high bytes, then the low bytes, a row each, so that mode 1
// (and 3) is a table per plane.
func wireF16Shape(nv int) wireShape {
	return wireShape{fourD: true, channel: true, h: 2, d: 1, tq: nv, n: 2 * nv, bits: 8, rawBytes: 2 * nv, perHeadRun: nv}
}

// wireSplitF16 writes the byte planes of the little-endian FP16 values raw.
func wireSplitF16(planes, raw []byte) {
	nv := len(raw) / 2
	for i := 0; i < nv; i++ {
		planes[i], planes[nv+i] = raw[2*i+1], raw[2*i]
	}
}

// wireJoinF16 is wireSplitF16's inverse.
func wireJoinF16(raw, planes []byte) {
	nv := len(planes) / 2
	for i := 0; i < nv; i++ {
		raw[2*i+1], raw[2*i] = planes[i], planes[nv+i]
	}
}

// wireF16Parts are the FP16 parts the wire stage codes as byte planes.
var wireF16Parts = []string{ScalesSuffix, ZerosSuffix}

type wirePart struct {
	index  int // tensor
	suffix string
	raw    []byte // the part as stored
	shape  wireShape
	syms   []uint8
	model  *wireModel
	chunks [][]byte
	// modelBytes is the model's marshal, huffman huffmanEstimate of the
	// codes: both per part, in parallel.
	modelBytes []byte
	huffman    int
	bytes      bool // codes coded as their packed bytes (wireByteShape)
}

// wireStored codes the stored parts of every tensor: the codes of the
// tensors whose layouts the wire coder models by the context coder, every
// other part by the lossless stage. It returns the stored tensors and, per
// tensor, the wire-coded and the Huffman-coded suffixes.
func wireStored(names []string, layouts []*layout, stored [][]safetensors.Tensor, workers int) ([][]safetensors.Tensor, [][]string, [][]string, error) {
	parts := make([]*wirePart, 0, len(stored))
	for i, ts := range stored {
		w, ok := wireShapeOf(layouts[i])
		if !ok || w.n == 0 {
			continue
		}
		for _, t := range ts {
			if t.Name == names[i]+CodesSuffix && len(t.Data) == w.rawBytes {
				parts = append(parts, &wirePart{index: i, suffix: CodesSuffix, raw: t.Data, shape: w})
			}
		}
		for _, suffix := range wireF16Parts {
			for _, t := range ts {
				size := 2 * layouts[i].groups // rawPartSize's, for the packed layouts wireShapeOf takes
				if t.Name == names[i]+suffix && (suffix == ScalesSuffix || layouts[i].q.zeros) && t.DType == safetensors.F16 && size > 0 && len(t.Data) == size {
					parts = append(parts, &wirePart{index: i, suffix: suffix, raw: t.Data, shape: wireF16Shape(size / 2)})
				}
			}
		}
	}
	unpacked := make([][]uint8, max(workers, 1))
	if err := forEach(len(parts), workers, func(wk, k int) error {
		p := parts[k]
		if p.suffix == CodesSuffix {
			p.huffman = huffmanEstimate(p.raw)
			// the codes are unpacked chunk by chunk for the coder, below,
			// and here only where their counts need it
			var syms []uint8
			if !wirePackedCounts(p.shape) {
				if cap(unpacked[wk]) < p.shape.n {
					unpacked[wk] = make([]uint8, p.shape.n)
				}
				syms = unpacked[wk][:p.shape.n]
				wireUnpack(syms, p.raw, 0, p.shape.bits)
			}
			p.model = buildWireModelRaw(syms, p.raw, p.shape)
			// Where the contexts would not clearly beat the Huffman stage on
			// the bytes (pairs of 4-bit codes, runs of 2-bit ones, neighbours
			// along tokens in a channel-axis row), the packed bytes as 8-bit
			// symbols, one table: about Huffman's size, at the rANS
			// decoder's speed; kept below only where the Huffman stage's
			// actual output is larger.
			if est := wireEstimate(p.model, p.shape); est > 0.98*float64(p.huffman) && p.shape.bits < 8 {
				bs := wireByteShape(p.shape)
				if bm := buildWireModel(p.raw, bs); wireEstimate(bm, bs) < est {
					p.model, p.shape, p.syms, p.bytes = bm, bs, p.raw, true
				}
			}
		} else {
			p.syms = make([]uint8, p.shape.n)
			wireSplitF16(p.syms, p.raw)
			p.model = buildWireModel(p.syms, p.shape)
		}
		p.chunks = make([][]byte, (p.shape.n-1)>>p.model.chunkLog+1)
		p.modelBytes = p.model.marshal()
		return nil
	}); err != nil {
		return nil, nil, nil, err
	}
	var jobs []chunkJob
	for k, p := range parts {
		for c := range p.chunks {
			jobs = append(jobs, chunkJob{k, c})
		}
	}
	scratch := make([]wireScratch, max(workers, 1))
	if err := forEach(len(jobs), workers, func(wk, k int) error {
		p, c := parts[jobs[k].part], jobs[k].chunk
		lo := c << p.model.chunkLog
		hi := min(p.shape.n, lo+1<<p.model.chunkLog)
		syms := p.syms
		if syms == nil { // codes: this chunk's, unpacked
			sc := &scratch[wk]
			if cap(sc.syms) < hi-lo {
				sc.syms = make([]uint8, 1<<p.model.chunkLog)
			}
			syms = sc.syms[:hi-lo]
			wireUnpack(syms, p.raw, lo, p.shape.bits)
		} else {
			syms = syms[lo:hi]
		}
		p.chunks[c] = p.model.encodeChunk(nil, syms, p.shape, lo, &scratch[wk])
		return nil
	}); err != nil {
		return nil, nil, nil, err
	}
	// Keep a part wire-coded where it is smaller and every chunk within the bound.
	wired := make([][]string, len(stored))
	coded := map[int]*wirePart{}
	var f16 []*wirePart
	for _, p := range parts {
		size := p.wireSize()
		ok := true
		for c, b := range p.chunks {
			lo := c << p.model.chunkLog
			ok = ok && min(p.shape.n-lo, 1<<p.model.chunkLog) <= wireMaxInflation*len(b)
		}
		p.syms = nil
		switch {
		case !ok || size >= len(p.raw):
		case p.suffix != CodesSuffix || p.bytes:
			f16 = append(f16, p) // against the Huffman coder's actual size, below
		case size < p.huffman:
			// The Huffman stage codes bytes: pairs of 4-bit codes, runs of 2-bit
			// ones, which can beat a context per code where neighbours depend on
			// each other; keep the wire coder only where it beats that too.
			coded[p.index] = p
		}
	}
	rest := make([][]safetensors.Tensor, len(stored))
	for i, ts := range stored {
		for _, t := range ts {
			if coded[i] == nil || t.Name != names[i]+CodesSuffix {
				rest[i] = append(rest[i], t)
			}
		}
	}
	out, lossless, err := deflateStored(names, rest, workers)
	if err != nil {
		return nil, nil, nil, err
	}
	for i := range out {
		if p := coded[i]; p != nil {
			out[i] = append(p.tensors(names[i]), out[i]...)
			wired[i] = []string{CodesSuffix}
		}
	}
	// A scales or zeros part, or codes coded as bytes: wire-coded where that
	// beats the part as the lossless stage left it (Huffman-coded with its
	// offsets, or raw).
	for _, p := range f16 {
		i, name := p.index, names[p.index]+p.suffix
		huffman := 0
		for _, t := range out[i] {
			if t.Name == name || t.Name == name+ChunksSuffix {
				huffman += len(t.Data)
			}
		}
		// codes as bytes: kept up to 0.5 % over the Huffman stage's bytes,
		// which decode at a fraction of the rANS decoder's speed
		if size := float64(p.wireSize()); size >= float64(huffman) && !p.bytes || size > 1.005*float64(huffman) {
			continue
		}
		kept := out[i][:0:0]
		for _, t := range out[i] {
			if t.Name != name && t.Name != name+ChunksSuffix {
				kept = append(kept, t)
			}
		}
		out[i] = append(kept, p.tensors(names[i])...)
		wired[i] = append(wired[i], p.suffix)
		var l []string
		for _, s := range lossless[i] {
			if s != p.suffix {
				l = append(l, s)
			}
		}
		lossless[i] = l
	}
	return out, wired, lossless, nil
}

// wireSize is the coded part's size: model, offsets and streams.
func (p *wirePart) wireSize() int {
	size := len(p.modelBytes) + 8*len(p.chunks)
	for _, b := range p.chunks {
		size += len(b)
	}
	return size
}

// tensors are the wire-coded part of tensor name: its streams, their end
// offsets and its model.
func (p *wirePart) tensors(tensor string) []safetensors.Tensor {
	var n int
	for _, b := range p.chunks {
		n += len(b)
	}
	data := make([]byte, 0, n)
	offsets := make([]byte, 8*len(p.chunks))
	for c, b := range p.chunks {
		data = append(data, b...)
		binary.LittleEndian.PutUint64(offsets[8*c:], uint64(len(data)))
	}
	name := tensor + p.suffix
	return []safetensors.Tensor{
		{Name: name, DType: safetensors.U8, Shape: []int{len(data)}, Data: data},
		{Name: name + ChunksSuffix, DType: safetensors.U64, Shape: []int{len(p.chunks)}, Data: offsets},
		{Name: name + WireModelSuffix, DType: safetensors.U8, Shape: []int{len(p.modelBytes)}, Data: p.modelBytes},
	}
}

// huffmanEstimate is about the size the lossless stage codes raw to: the
// order-0 byte entropy of each of its chunks, plus its tables and offsets.
func huffmanEstimate(raw []byte) int {
	var total float64
	var sub [4][256]int // four histograms by turns: a byte repeated does not wait on its own count's store
	for lo := 0; lo < len(raw); lo += LosslessChunk {
		chunk := raw[lo:min(len(raw), lo+LosslessChunk)]
		n4 := len(chunk) &^ 3
		for i := 0; i < n4; i += 4 {
			g := chunk[i : i+4 : i+4]
			sub[0][g[0]]++
			sub[1][g[1]]++
			sub[2][g[2]]++
			sub[3][g[3]]++
		}
		for _, b := range chunk[n4:] {
			sub[0][b]++
		}
		var hist [256]int
		for b := range hist {
			hist[b] = sub[0][b] + sub[1][b] + sub[2][b] + sub[3][b]
		}
		sub = [4][256]int{}
		n := float64(len(chunk))
		used := 0
		for _, k := range hist {
			if k > 0 {
				total -= float64(k) * math.Log2(float64(k)/n) / 8
				used++
			}
		}
		total += float64(used)/2 + 8 + 8 // the Huffman table, about 4 bits a used byte; the stream's framing; the offset
	}
	return int(total)
}

// wireInflate returns a view of f in which every wire-coded part of the
// tensors in infos is decoded to its packed codes, checking the model,
// offsets and streams first.
func wireInflate(f *safetensors.File, infos []TensorInfo, workers int) (*safetensors.File, error) {
	type part struct {
		tensor  string
		suffix  string
		shape   wireShape
		model   *wireModel
		coded   []byte
		offsets []uint64
		raw     []byte
	}
	var parts []*part
	var jobs []chunkJob
	replaced := map[string]*part{}
	drop := map[string]bool{}
	for _, ti := range infos {
		for _, suffix := range ti.Wire {
			if suffix != CodesSuffix && suffix != ScalesSuffix && suffix != ZerosSuffix {
				return nil, tensorErrorf(ti.Name, "%w: part %q cannot be wire-coded (only %s, %s, %s)", ErrWire, suffix, CodesSuffix, ScalesSuffix, ZerosSuffix)
			}
			name := ti.Name + suffix
			if err := ti.Scheme.Validate(); err != nil {
				return nil, tensorErrorf(ti.Name, "scheme: %w", err)
			}
			l, err := newLayout(ti.Shape, ti.Scheme, ti.DType, ti.Rotation)
			if err != nil {
				return nil, &TensorError{Tensor: ti.Name, Err: err}
			}
			w, ok := wireShapeOf(l)
			if !ok || w.n == 0 {
				return nil, tensorErrorf(ti.Name, "%w: scheme %s and shape %v have no codes the wire stage codes", ErrWire, ti.Scheme, ti.Shape)
			}
			if suffix != CodesSuffix {
				size, err := rawPartSize(ti, suffix)
				if err != nil || size < 2 {
					return nil, tensorErrorf(ti.Name, "%w: %s: scheme %s stores no such part", ErrWire, suffix, ti.Scheme)
				}
				w = wireF16Shape(size / 2)
			}
			ct, ot, mt := f.Tensor(name), f.Tensor(name+ChunksSuffix), f.Tensor(name+WireModelSuffix)
			if ct == nil || ot == nil || mt == nil || ct.DType != safetensors.U8 || ot.DType != safetensors.U64 || mt.DType != safetensors.U8 {
				return nil, tensorErrorf(ti.Name, "%w: want %s (U8), %s%s (U64) and %s%s (U8)", ErrWire, suffix, suffix, ChunksSuffix, suffix, WireModelSuffix)
			}
			if suffix == CodesSuffix && w.bits < 8 && len(mt.Data) > 1 && mt.Data[0] >= 2 && mt.Data[1] == 8 {
				w = wireByteShape(w) // the packed bytes as symbols
			}
			m, err := parseWireModel(mt.Data, w.bits, w.contexts, w.n)
			if err != nil {
				return nil, tensorErrorf(ti.Name, "%w: %s%s: %v", ErrWire, suffix, WireModelSuffix, err)
			}
			n := (w.n-1)>>m.chunkLog + 1
			if len(ot.Data) != 8*n {
				return nil, tensorErrorf(ti.Name, "%w: %s%s holds %d offsets, want %d for %d codes", ErrWire, suffix, ChunksSuffix, len(ot.Data)/8, n, w.n)
			}
			offsets, err := chunkOffsets(ti.Name, suffix, ot.Data, len(ct.Data), n,
				func(c int) int { return min(1<<m.chunkLog, w.n-c<<m.chunkLog) }, wireMaxInflation, ErrWire, "codes")
			if err != nil {
				return nil, err
			}
			p := &part{tensor: ti.Name, suffix: suffix, shape: w, model: m, coded: ct.Data, offsets: offsets}
			for c := 0; c < n; c++ {
				jobs = append(jobs, chunkJob{len(parts), c})
			}
			p.raw = make([]byte, w.rawBytes) // at most wireMaxInflation codes per coded byte, checked above
			parts = append(parts, p)
			replaced[name] = p
			drop[name+ChunksSuffix], drop[name+WireModelSuffix] = true, true
		}
	}
	scratch := make([]wireDecodeScratch, max(workers, 1))
	err := forEach(len(jobs), workers, func(wk, k int) error {
		p, c := parts[jobs[k].part], jobs[k].chunk
		var begin uint64
		if c > 0 {
			begin = p.offsets[c-1]
		}
		lo := c << p.model.chunkLog
		hi := min(p.shape.n, lo+1<<p.model.chunkLog)
		b := p.shape.bits
		if err := p.model.decodeInto(p.raw[lo*b/8:PackedLen(hi, b)], hi-lo, p.coded[begin:p.offsets[c]], p.shape, lo, &scratch[wk]); err != nil {
			return tensorErrorf(p.tensor, "%w: %s chunk %d: %v", ErrWire, p.suffix, c, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, p := range parts {
		if p.suffix != CodesSuffix {
			raw := make([]byte, len(p.raw))
			wireJoinF16(raw, p.raw)
			p.raw = raw
		}
	}
	out := &safetensors.File{Metadata: f.Metadata}
	for _, t := range f.Tensors {
		switch p := replaced[t.Name]; {
		case p != nil && p.suffix != CodesSuffix: // scales, zero points
			out.Tensors = append(out.Tensors, safetensors.Tensor{Name: t.Name, DType: safetensors.F16, Shape: []int{len(p.raw) / 2}, Data: p.raw})
		case p != nil:
			out.Tensors = append(out.Tensors, safetensors.Tensor{Name: t.Name, DType: safetensors.U8, Shape: []int{len(p.raw)}, Data: p.raw})
		case !drop[t.Name]:
			out.Tensors = append(out.Tensors, t)
		}
	}
	return out, nil
}

// nibbleCounts splits a histogram of bytes holding two 4-bit codes (byte
// hi<<4 | lo) into the counts of each nibble's code.
func nibbleCounts(hg *[256]uint32) (lo, hi [16]uint32) {
	for x := range hi {
		for y, v := range hg[16*x : 16*x+16] {
			lo[y] += v
			hi[x] += v
		}
	}
	return lo, hi
}
