package compression

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Context mode 4, order 1 (model version 3): the context of a token-axis
// code is (head, the channel's class, the previous token's code in the same
// channel). Each head's channels are split into K = 2^klog classes (K = 1,
// 2, 4 or 8) by the rank of their mean code (the encoder's choice; the
// decoder reads the map), so a tensor has h*K*A contexts of A symbols,
// ordered (head, class, previous code): context (head*K + class)*A + prev.
//
// The previous code of a position i (chunk-relative, head_dim d) is the
// decoded symbol at i-d if that position lies in the same chunk and the
// same head (and batch), else A/2, the alphabet's middle: the first token
// row of every chunk and of every head within a chunk, so chunks decode
// independently and in parallel, as in the other modes.
//
// A version 3 model is version 2's header (bytes 0..7, mode 4), then
//
//	byte 8     klog: log2 of the classes a head, K (0..3)
//	bytes 9..  the class map: per head, per channel, the class in klog
//	           bits, a little-endian bit stream, zero bits to a byte
//	then       the tables as version 2's (h*K*A contexts)
//
// Only mode 4 is written as version 3, and mode 4 only as version 3: the
// other modes' models and streams are version 2's, byte for byte, and a
// build that reads version 2 refuses a version 3 model by its version.
//
// The streams are version 2's (S interleaved states, symbol i by state
// i mod S, 16-bit words in symbol order). A token row's contexts depend
// only on the previous row, so the states interleave across the channels
// of a row: with AVX-512 (wireDecodeOrder1, wire_amd64.s) a group of 16
// channels of one token decodes as in wireDecode32, each lane's table row
// from its channel's (head, class) and the code decoded d positions
// before (one VPMOVZXBD of the previous row's 16 bytes).

const (
	wireModeOrder1    = 4
	wireVersionOrder1 = 3
	wireMaxClassLog   = 3
	// wireOrder1MaxMap bounds a mode-4 shape's heads x head_dim (the class
	// map), checked before it is allocated.
	wireOrder1MaxMap = 1 << 16
)

// wireOrder1 lets the encoder choose mode 4; tests switch it off to check
// that the version 2 modes' bytes are those of the builds before it.
var wireOrder1 = true

// order1Heads is the heads of a shape whose codes mode 4 can model
// (token-axis 4-D codes, not bytes), else 0: wireShape.contexts(4).
func (w wireShape) order1Heads() int {
	if !w.fourD || w.channel || w.bytes || w.h < 1 || w.d < 1 || w.tq < 1 || w.perHeadRun != w.tq*w.d || w.h*w.d > wireOrder1MaxMap {
		return 0
	}
	return w.h
}

// setOrder1 sets a mode-4 model's class map and the contexts' bases
// (context of position's (head, channel) with previous code 0).
func (m *wireModel) setOrder1(h, d, klog int, cls []uint8) {
	A := m.alphabet()
	m.o1h, m.o1d, m.klog, m.cls = h, d, klog, cls
	m.o1base = make([]int32, h*d)
	for hd := 0; hd < h; hd++ {
		for c := 0; c < d; c++ {
			m.o1base[hd*d+c] = int32((hd<<klog + int(cls[hd*d+c])) * A)
		}
	}
}

// wireOrder1Chunk is the chunk log and states of a part of n codes (as
// buildWireModelRaw chooses them).
func wireOrder1Chunk(n int) (chunkLog, states int) {
	if n >= wireWideMin {
		return wireWideChunk, wireWideStates
	}
	return wireChunkLog, wireStates
}

// wireTryOrder1 is buildWireModelRaw's last candidate: the mode-4 model of
// the codes (syms, or raw unpacked where syms is nil) at each class count,
// resolution and table code, kept where it codes smaller than best (bits:
// bestBits) with its tables, class map and header byte.
func wireTryOrder1(best *wireModel, bestBits float64, syms []uint8, raw []byte, w wireShape) (*wireModel, float64) {
	h := w.order1Heads()
	A := 1 << w.bits
	if !wireOrder1 || h == 0 || h*A > wireMaxCtx || w.n%w.d != 0 {
		return best, bestBits
	}
	if syms == nil {
		syms = make([]uint8, w.n)
		wireUnpack(syms, raw, 0, w.bits)
	}
	d := w.d
	chunkLog, states := wireOrder1Chunk(w.n)
	aa := A*A + 16 // a channel's counts, padded by a cache line where counted in place
	if w.bits <= 4 {
		aa = A * A
	}
	fine := wireOrder1Counts(syms, w, chunkLog, aa)
	rank := wireOrder1Ranks(fine, h, d, A, aa)
	// the valid class counts are klog 0..kmax; each one's counts per
	// (head, class, previous code, symbol) are the finest's summed in pairs
	// of classes (class r*K/d is class r*2K/d halved)
	precs := make([]int, 0, wireMaxClassLog+1)
	for klog := 0; klog <= wireMaxClassLog && 1<<klog <= d; klog++ {
		nctx := h << klog * A
		prec := wirePrecision(w.bits)
		if w.n >= wireWideMin && prec > w.bits && w.bits < 8 {
			prec-- // as buildWireModelRaw's
		}
		for prec > w.bits && nctx<<prec > max(w.n, wireTableAllowance) {
			prec--
		}
		if nctx > wireMaxCtx || nctx<<prec > max(w.n, wireTableAllowance) {
			break
		}
		precs = append(precs, prec)
	}
	if len(precs) == 0 {
		return best, bestBits
	}
	cms := make([][]uint32, len(precs))
	cms[len(precs)-1] = wireOrder1Merge(fine, rank, h, d, len(precs)-1, A, aa)
	for klog := len(precs) - 2; klog >= 0; klog-- {
		fin := cms[klog+1]
		cm := make([]uint32, len(fin)/2)
		for i := range cm {
			cm[i] = fin[(i/(A*A))*2*A*A+i%(A*A)] + fin[(i/(A*A))*2*A*A+A*A+i%(A*A)]
		}
		cms[klog] = cm
	}
	for klog, prec := range precs {
		K := 1 << klog
		nctx := h * K * A
		extra := float64(8 * (1 + (h*d*klog+7)/8)) // klog's byte, the class map
		cls := make([]uint8, h*d)
		for i, r := range rank {
			cls[i] = uint8(r * K / d)
		}
		cm := cms[klog]
		ideal := make([]float64, nctx*A)
		var entropy float64
		for c := 0; c < nctx; c++ {
			var tot float64
			for _, k := range cm[c*A : (c+1)*A] {
				tot += float64(k)
			}
			for s, k := range cm[c*A : (c+1)*A] {
				if k > 0 {
					ideal[c*A+s] = math.Log2(tot / float64(k))
					entropy += float64(k) * ideal[c*A+s]
				}
			}
		}
		if entropy+float64(nctx*A)+extra >= bestBits {
			continue
		}
		lg := wireLog2Table(prec)
		for _, res := range []int{1, 2, 4, 8} {
			m := &wireModel{bits: w.bits, mode: wireModeOrder1, prec: prec, res: res, chunkLog: chunkLog, nctx: nctx,
				levels: make([]uint8, nctx*A), states: states, version: wireVersionOrder1}
			m.setOrder1(h, d, klog, cls)
			maxLevel := wireMaxLevel(res, prec)
			for c := 0; c < nctx; c++ {
				used := false
				for s, k := range cm[c*A : (c+1)*A] {
					if k > 0 {
						m.levels[c*A+s] = uint8(min(maxLevel, 1+int(math.Round(float64(res)*ideal[c*A+s]))))
						used = true
					}
				}
				switch {
				case used:
				case c > 0: // an unused context: the previous one's levels, which code in a bit each
					copy(m.levels[c*A:(c+1)*A], m.levels[(c-1)*A:c*A])
				default:
					m.levels[0] = 1
				}
			}
			tb := math.Inf(1)
			for k, size := range m.tableSizes() {
				if t := float64(8 * size); t < tb {
					tb, m.egk = t, k
				}
			}
			// the codes take at least their entropy (a bit of margin for
			// the sums' rounding): a model that cannot win is not built
			if entropy-1-1e-9*entropy+tb+extra >= bestBits {
				continue
			}
			m.setLevels()
			var bits float64
			for i, k := range cm {
				if k > 0 {
					bits += float64(k) * lg[m.fs[i]&0xffff]
				}
			}
			if bits+tb+extra < bestBits {
				best, bestBits = m, bits+tb+extra
			}
		}
	}
	return best, bestBits
}

// wireOrder1Stride is the counts' stride per channel for codes of at most
// 4 bits: a channel's (previous code, symbol) counts indexed by one byte,
// padded by a cache line so that a row's increments spread over the L1
// cache's sets.
const wireOrder1Stride = 256 + 16

// wireOrder1Counts counts the codes syms of shape w per (head, channel,
// previous code, symbol), a channel's counts at stride aa (previous code
// A/2 where wireTryOrder1's doc says). Codes of at most 4 bits are counted
// a head at a time into 16-bit counts that stay in the L1 cache, 8
// channels a word (wireOrder1CountRow).
func wireOrder1Counts(syms []uint8, w wireShape, chunkLog, aa int) []uint32 {
	h, d := w.order1Heads(), w.d
	A := 1 << w.bits
	def := uint8(A / 2)
	ab := uint(w.bits)
	fine := make([]uint32, h*d*aa)
	inChunk := func(i int) bool { return (i-d)>>chunkLog == (i+d-1)>>chunkLog } // row i's previous row and itself
	if w.bits > 4 {
		for r := 0; r < w.n/d; r++ {
			i := r * d
			f := fine[r/w.tq%h*d*aa : (r/w.tq%h+1)*d*aa]
			for c, s := range syms[i : i+d] {
				prev := def
				if r%w.tq != 0 && (i+c-d)>>chunkLog == (i+c)>>chunkLog {
					prev = syms[i+c-d]
				}
				f[c*aa+int(prev)<<ab+int(s)]++
			}
		}
		return fine
	}
	// a head's rows into 16-bit counts (a row's channels apart, so that no
	// increment waits on the one before), added to fine at least every
	// 65535 rows
	c16 := make([][wireOrder1Stride]uint16, d)
	flush := func(hd int) {
		f := fine[hd*d*aa : (hd+1)*d*aa]
		for c := range c16 {
			for k, v := range c16[c][:A*A] {
				f[c*aa+k] += uint32(v)
			}
			c16[c] = [wireOrder1Stride]uint16{}
		}
	}
	for r0 := 0; r0 < w.n/d; r0 += w.tq {
		hd := r0 / w.tq % h
		for r := r0; r < min(r0+w.tq, w.n/d); r++ { // (a last head of fewer rows: the rows there are)
			if (r-r0)%65535 == 65534 {
				flush(hd)
			}
			i := r * d
			row := syms[i : i+d]
			cnt := c16[:len(row)]
			switch {
			case r == r0:
				wireOrder1CountRow(cnt, nil, row, def, ab)
			case inChunk(i):
				wireOrder1CountRow(cnt, syms[i-d:i], row, def, ab)
			default:
				for k, s := range row {
					prev := def
					if (i+k-d)>>chunkLog == (i+k)>>chunkLog {
						prev = syms[i+k-d]
					}
					cnt[k][prev<<ab|s]++
				}
			}
		}
		flush(hd)
	}
	return fine
}

// wireOrder1CountRow counts a token row of codes (at most 4 bits) into
// cnt, a channel each, after the previous row prow (nil: every previous
// code def): 8 channels' byte indexes prev<<ab|sym at a time in a word
// (each code below 16, so no byte carries into the next).
func wireOrder1CountRow(cnt [][wireOrder1Stride]uint16, prow, row []uint8, def uint8, ab uint) {
	cnt = cnt[:len(row)]
	var pw uint64 = uint64(def) * 0x0101010101010101
	j := 0
	for ; j+8 <= len(row); j += 8 {
		if prow != nil {
			pw = binary.LittleEndian.Uint64(prow[j:])
		}
		key := pw<<ab | binary.LittleEndian.Uint64(row[j:])
		c := cnt[j : j+8 : j+8]
		c[0][uint8(key)]++
		c[1][uint8(key>>8)]++
		c[2][uint8(key>>16)]++
		c[3][uint8(key>>24)]++
		c[4][uint8(key>>32)]++
		c[5][uint8(key>>40)]++
		c[6][uint8(key>>48)]++
		c[7][uint8(key>>56)]++
	}
	for ; j < len(row); j++ {
		prev := def
		if prow != nil {
			prev = prow[j]
		}
		cnt[j][prev<<ab|row[j]]++
	}
}

// wireOrder1Ranks is the rank of each (head, channel)'s mean code within
// its head (ties by channel), from its counts.
func wireOrder1Ranks(fine []uint32, h, d, A, aa int) []int {
	sums := make([]uint64, h*d) // per (head, channel): the codes' sum
	for hc := range sums {
		for k, v := range fine[hc*aa : hc*aa+A*A] {
			sums[hc] += uint64(v) * uint64(k&(A-1))
		}
	}
	rank := make([]int, h*d)
	order := make([]int, d)
	for hd := 0; hd < h; hd++ {
		for c := range order {
			order[c] = c
		}
		hs := sums[hd*d : (hd+1)*d]
		slices.SortStableFunc(order, func(a, b int) int {
			switch {
			case hs[a] < hs[b]:
				return -1
			case hs[a] > hs[b]:
				return 1
			}
			return 0
		})
		for r, c := range order {
			rank[hd*d+c] = r
		}
	}
	return rank
}

// wireOrder1Merge sums the channels' counts into their classes at 2^klog
// classes a head: counts per (head, class, previous code, symbol).
func wireOrder1Merge(fine []uint32, rank []int, h, d, klog, A, aa int) []uint32 {
	K := 1 << klog
	cm := make([]uint32, h*K*A*A)
	for hd := 0; hd < h; hd++ {
		for c := 0; c < d; c++ {
			ctx := (hd*K + rank[hd*d+c]*K/d) * A
			src := fine[(hd*d+c)*aa : (hd*d+c)*aa+A*A]
			dst := cm[ctx*A : (ctx+A)*A]
			dst = dst[:len(src)]
			for k, v := range src {
				dst[k] += v
			}
		}
	}
	return cm
}

// marshalOrder1 is marshal for mode 4: version 3, klog, the class map.
func (m *wireModel) marshalOrder1() []byte {
	out := []byte{wireVersionOrder1, byte(m.bits), byte(m.mode), byte(m.prec), byte(m.res), byte(m.chunkLog), byte(m.egk),
		byte(trailingZeros(m.states)), byte(m.klog)}
	var bw wireBitWriter
	for _, c := range m.cls {
		bw.write(uint64(c), uint(m.klog))
	}
	out = append(out, bw.flush()...)
	return append(out, m.tableBytes(m.egk)...)
}

func trailingZeros(x int) int {
	n := 0
	for x > 1 {
		x >>= 1
		n++
	}
	return n
}

// parseOrder1 reads a version 3 model's klog and class map from b (the
// model's bytes) for a shape whose contexts nctx gives (nctx(4) its heads,
// 0 where mode 4 does not apply; nctx(2) head_dim), sets them, and returns
// the bytes after the map (the tables).
func (m *wireModel) parseOrder1(b []byte, nctx func(mode int) int) ([]byte, error) {
	h, d := nctx(wireModeOrder1), nctx(2)
	if h < 1 || d < 1 || h*d > wireOrder1MaxMap {
		return nil, errors.New("context mode 4 (order 1) for a shape it does not model (token-axis codes only)")
	}
	klog := int(b[wireHeaderSize])
	if klog > wireMaxClassLog || 1<<klog > d {
		return nil, fmt.Errorf("log2 of the classes %d, want 0 to %d and at most head_dim %d classes", klog, wireMaxClassLog, d)
	}
	mapBytes := (h*d*klog + 7) / 8
	rest := b[wireHeaderSize+1:]
	if len(rest) < mapBytes {
		return nil, fmt.Errorf("class map of %d bytes, want %d", len(rest), mapBytes)
	}
	r := wireBitReader{buf: rest[:mapBytes]}
	cls := make([]uint8, h*d)
	for i := range cls {
		v, _ := r.bits(uint(klog))
		cls[i] = uint8(v)
	}
	if pad, _ := r.bits(uint(mapBytes)*8 - r.pos); pad != 0 {
		return nil, errors.New("nonzero padding after the class map")
	}
	m.nctx = h << klog * m.alphabet()
	m.setOrder1(h, d, klog, cls)
	return rest[mapBytes:], nil
}

// encodeOrder1 is encodeChunk for mode 4: positions [lo, lo+len(syms)) of
// shape w, from the last down, each head's segment of the chunk on its own.
func (m *wireModel) encodeOrder1(out []byte, syms []uint8, w wireShape, lo int, scratch *wireScratch) []byte {
	if scratch == nil {
		scratch = &wireScratch{}
	}
	S := m.states
	n := len(syms)
	size := 2*n + 4*S + 32
	if cap(scratch.buf) < size {
		scratch.buf = make([]byte, size)
	}
	buf := scratch.buf[:size]
	wp := len(buf)
	var st [wireMaxStates]uint32
	for j := range st {
		st[j] = wireL
	}
	mask := S - 1
	enc := m.encTable() // the first row of each segment, at least, takes the Go loop
	bits := uint(m.bits)
	d := w.d
	def := uint8(m.alphabet() / 2)
	kernel := S == wireWideStates && useSIMD && useWireAVX512 && d%16 == 0 && lo&15 == 0
	for b := n; b > 0; {
		g := lo + b - 1 // the segment's last position
		a := max(0, g-g%w.perHeadRun-lo)
		hd := g / w.perHeadRun % w.h
		base := m.o1base[hd*d : (hd+1)*d]
		c := g % d
		k := b - 1
		if kernel {
			// single symbols down to a group's end, then the groups whose
			// previous row lies in the segment
			for ; k >= a+d && (k+1)&15 != 0; k-- {
				st[k&mask], wp = wireEncOne(st[k&mask], &enc[(int(base[c])+int(syms[k-d]))<<bits|int(syms[k])], buf, wp)
				if c--; c < 0 {
					c = d - 1
				}
			}
			if gr := (k + 1 - a - d) / 16; gr > 0 && k+1-16 >= 0 {
				top := k - 15 // the highest group's first position; its channel c-15
				ea := wireEncOrder1Args{fs: &m.fs[0], syms: &syms[top], buf: &buf[0], wp: wp, groups: gr, st: &st,
					phase: top & 16, base: &base[0], c: 4 * (c - 15), d: d, bits: uint64(bits), prec: uint64(m.prec)}
				wireEncodeOrder1(&ea)
				wp = ea.wp
				k -= 16 * gr
				c = (c - 16*gr%d + d) % d
			}
		}
		for ; k >= a; k-- {
			prev := def
			if k-d >= a {
				prev = syms[k-d]
			}
			st[k&mask], wp = wireEncOne(st[k&mask], &enc[(int(base[c])+int(prev))<<bits|int(syms[k])], buf, wp)
			if c--; c < 0 {
				c = d - 1
			}
		}
		b = a
	}
	wp -= 4 * S
	for j := 0; j < S; j++ {
		binary.LittleEndian.PutUint32(buf[wp+4*j:], st[j])
	}
	return append(out, buf[wp:]...)
}

// decodeOrder1 is decodeSyms for mode 4, with decodeTable's byte table
// (sym) or decodeEntries's (ent, where wireDecode32 runs, whose token rows
// go to wireDecodeOrder1).
func (m *wireModel) decodeOrder1(sym []uint8, ent []uint32, dst []uint8, src []byte, w wireShape, lo int) error {
	S := m.states
	if len(src) < 4*S || len(src)&1 != 0 {
		return fmt.Errorf("stream of %d bytes: want the %d bytes of states and whole 16-bit words", len(src), 4*S)
	}
	var st [wireMaxStates]uint32
	for j := 0; j < S; j++ {
		st[j] = binary.LittleEndian.Uint32(src[4*j:])
	}
	words := src[4*S:]
	p := 0
	prec := uint(m.prec) & 31
	bits := uint(m.bits) & 31
	mask := uint32(1)<<prec - 1
	smask := S - 1
	n := len(dst)
	d := w.d
	if m.o1d != d || m.o1h != w.h || w.perHeadRun != w.tq*d || len(m.o1base) != w.h*d {
		return errors.New("mode 4 model for another shape")
	}
	def := uint8(m.alphabet() / 2)
	kernel := ent != nil && S == wireWideStates && useSIMD && useWireAVX512 && d%16 == 0
	var rowBase []int32 // the kernel's: a head's bases << prec
	for a := 0; a < n; {
		g := lo + a
		hd := g / w.perHeadRun % w.h
		b := min(n, a+w.perHeadRun-g%w.perHeadRun)
		base := m.o1base[hd*d : (hd+1)*d]
		c := g % d
		if kernel {
			if cap(rowBase) < d {
				rowBase = make([]int32, d)
			}
			rowBase = rowBase[:d]
			for k, v := range base {
				rowBase[k] = v << prec
			}
		}
		for k := a; k < b; k++ {
			if kernel && k&15 == 0 && k-d >= a && b-k >= 16 {
				// c is a multiple of 16 here: lo and d are
				g, used := wireDecodeOrder1Groups(ent, dst[k:b], d, words, p, &st, k, rowBase, c, prec)
				if g > 0 {
					k += 16*g - 1
					p += used
					c = (c + 16*g) % d
					continue
				}
			}
			prev := def
			if k-d >= a {
				prev = dst[k-d]
			}
			ctx := int(base[c]) + int(prev)
			j := k & smask
			x := st[j]
			l := x & mask
			var s uint8
			if ent != nil {
				e := ent[ctx<<prec+int(l)]
				s = uint8(e)
				x = (e>>8&0xfff+1)*(x>>prec) + e>>20
			} else {
				s = sym[ctx<<prec+int(l)]
				e := m.fs[ctx<<bits+int(s)]
				x = (e&0xffff)*(x>>prec) + l - e>>16
			}
			if x < wireL {
				if p+2 > len(words) {
					return errors.New("stream ends before its symbols")
				}
				x = x<<16 | uint32(words[p]) | uint32(words[p+1])<<8
				p += 2
			}
			st[j] = x
			dst[k] = s
			if c++; c == d {
				c = 0
			}
		}
		a = b
	}
	if p != len(words) {
		return fmt.Errorf("%d bytes left after the symbols", len(words)-p)
	}
	for j := 0; j < S; j++ {
		if st[j] != wireL {
			return errors.New("stream does not decode to its initial state")
		}
	}
	return nil
}

// wireDecodeOrder1Groups decodes whole groups of 16 symbols from the start
// of out (chunk position pos, a multiple of 16, at least d positions into
// its head's segment, so the previous row lies d bytes before out[0];
// channel c, a multiple of 16) with wireDecodeOrder1, while a group and its
// 32 bytes of words remain; it returns the groups decoded and the bytes of
// words they took. rowBase holds the head's channels' context rows << prec,
// every one within ent.
func wireDecodeOrder1Groups(ent []uint32, out []uint8, d int, words []byte, p int, st *[wireMaxStates]uint32, pos int, rowBase []int32, c int, prec uint) (int, int) {
	g := len(out) / 16
	if g == 0 || p+32 > len(words) || c&15 != 0 || len(rowBase) != d || d&15 != 0 {
		return 0, 0
	}
	a := wireOrder1Args{ent: &ent[0], out: &out[0], words: &words[p], groups: g, last: len(words) - 32 - p,
		prec: uint64(prec), st: st, phase: pos & 16, base: &rowBase[0], c: 4 * c, d: d}
	wireDecodeOrder1(&a)
	return a.done, a.used
}

// wireOrder1Args are wireDecodeOrder1's arguments and results: as
// wireDecode32Args's (ent the table's start), base the head's rows, c the
// first group's channel in bytes of base, d head_dim (the previous row d
// bytes before out, base's d entries).
type wireOrder1Args struct {
	ent          *uint32
	out          *uint8
	words        *byte
	groups, last int
	prec         uint64
	st           *[wireMaxStates]uint32
	phase        int
	done, used   int
	base         *int32
	c, d         int
}

// wireEncOrder1Args are wireEncodeOrder1's arguments: as wireEnc32Args's
// (fs the table's start, syms the highest group's first symbol), with the
// head's context bases (base, d of them, the previous row d symbols
// before), the highest group's first channel in bytes of base (c), and
// the code width.
type wireEncOrder1Args struct {
	fs     *uint32
	syms   *uint8
	buf    *byte
	wp     int
	groups int
	st     *[wireMaxStates]uint32
	phase  int
	base   *int32
	c, d   int
	bits   uint64
	prec   uint64
}
