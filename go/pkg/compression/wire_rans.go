package compression

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	mathbits "math/bits"
	"sync"
	"unsafe"
)

// The wire coder: a static (two-pass) rANS coder over a tensor's
// quantization codes, with a context per (head, channel) of the code's
// position, or a coarser one where that codes smaller (wireModel.mode).
//
// Why rANS: a static model's decode step is two table lookups (slot to
// symbol, symbol to frequency), one multiply-add and at most one 16-bit
// read, with no division and no data-dependent loop (an arithmetic/range
// decoder needs a division or a search per symbol); four interleaved states
// break the dependency chain so consecutive symbols decode in parallel in
// the CPU. Encoding runs backwards and divides, by a multiply with the
// frequency's reciprocal (wireEnc).
//
// A model (NAME.codes.wire) is
//
//	byte 0     model version (2; version 1 is read too; 3 is a model in
//	           mode 4, wire_order1.go, whose header adds a byte and a class map)
//	byte 1     bits: the code width b, alphabet A = 2^b (1..8); in version 2
//	           a codes part of narrower codes may have 8: its packed bytes
//	           are the symbols (wireByteShape: one context)
//	byte 2     mode: 0 one context, 1 per head, 2 per channel (position in
//	           head_dim), 3 per (head, channel), 4 (version 3 only) per (head,
//	           channel class, previous token's code in the channel)
//	byte 3     precision P: frequencies sum to M = 2^P (b <= P <= min(12, b+8))
//	byte 4     resolution r: levels per octave of the stored probabilities (1, 2, 4 or 8)
//	byte 5     chunk log: each chunk codes 2^c symbols (10..20), the last fewer
//	byte 6     Exp-Golomb order k of the table deltas (0..3)
//	byte 7     (version 2) log2 of the interleaved states a chunk, S (2..5);
//	           version 1 has no such byte and 4 states
//	bytes 8..  (7.. in version 1) the tables, a little-endian bit stream: for each context, for
//	           each symbol, zigzag(level - the previous context's level of the
//	           symbol) as an order-k Exp-Golomb code, zero bits to a byte.
//
// A level 0 is an absent symbol; a level v >= 1 stands for a weight
// 2^(-(v-1)/r), normalized to M (wireFreqs: integers only, so every decoder
// builds the same table). Every context holds at least one symbol.
//
// Each chunk's stream is S little-endian uint32 final states, then the
// 16-bit renormalization words in decode order; symbol i of the chunk is
// coded by state i mod S. A stream decodes exactly: every word used, and
// every state back at its initial value, or it is rejected. Version 2's
// encoder takes 32 states (two 16-lane vectors in the AVX-512 decoder,
// wireDecode32) for parts of at least wireWideMin codes, in chunks of 2^17
// so the states' 128 bytes a chunk stay about 0.2 % of it, and 4 in chunks
// of 2^16 for the small ones.

const (
	wireVersion    = 2
	wireStates     = 4 // version 1's, and version 2's for small parts
	wireWideStates = 32
	wireMaxStates  = 32
	wireWideMin    = 1 << 14 // codes a part needs for wireWideStates
	wireWideChunk  = 17      // chunk log with wireWideStates
	wireL          = 1 << 16 // lower bound of a state
	wireMaxCtx     = 4096    // contexts a model may have
	wireMinChunk   = 10
	wireMaxChunk   = 20
	wireChunkLog   = 16
	wireHeaderSize = 8 // version 2's; version 1's is 7
	// wireMaxInflation is how many symbols one coded byte of a chunk may
	// stand for (at least half a bit a symbol, the Huffman stage's bound on
	// 4-bit codes): the decoder refuses a chunk that claims more before
	// allocating, and the encoder falls back where a part would code below it.
	wireMaxInflation = 16
	// wireTableAllowance: a model's decode tables (contexts x M bytes) may
	// take at most one byte per code of the tensor, or this many bytes.
	wireTableAllowance = 4096
)

// ErrWire reports a wire-coded part that does not decode.
var ErrWire = errors.New("wire payload")

// wireFrac8[k] is 2^30 * 2^(-k/8), rounded.
var wireFrac8 = [8]uint64{1073741824, 984625931, 902905064, 827967314, 759250125, 696236091, 638450071, 585461452}

// wireModel is a static model: per context, each symbol's frequency and
// cumulative start out of M = 2^prec.
type wireModel struct {
	bits, mode, prec, res, chunkLog, egk int
	nctx                                 int
	states                               int // interleaved states a chunk (4 in version 1)
	version                              byte
	cost                                 float64   // buildWireModel's: the codes' bits and the tables'
	levels                               []uint8   // nctx*A
	fs                                   []uint32  // nctx*A: freq | start<<16
	enc                                  []wireEnc // nctx*A: the encode table, built by buildEncode
	encOnce                              sync.Once // encTable's: the table is built where a chunk needs it
	// mode 4 (wire_order1.go): log2 of the classes a head, heads, head_dim,
	// each (head, channel)'s class and its context with previous code 0
	klog, o1h, o1d int
	cls            []uint8
	o1base         []int32
}

func (m *wireModel) alphabet() int { return 1 << m.bits }

// wireMaxLevel is the largest level at resolution res and precision prec.
func wireMaxLevel(res, prec int) int { return res*prec + 1 }

// wireFreqs turns one context's levels into frequencies summing to M, every
// present symbol at least 1. It reports false for a context with no symbol.
func wireFreqs(levels []uint8, res, prec int, freq []uint32) bool {
	M := uint64(1) << prec
	wt := &wireWeights()[res]
	var W uint64
	present := 0
	for s, v := range levels {
		freq[s] = 0
		if v == 0 {
			continue
		}
		W += wt[v]
		present++
	}
	if present == 0 {
		return false
	}
	var sum uint64
	for s, v := range levels {
		if v == 0 {
			continue
		}
		f := max(1, wt[v]*M/W)
		freq[s] = uint32(f)
		sum += f
	}
	for sum != M { // move the rounding onto the largest frequency (the first, on a tie)
		big := 0
		for s := range freq {
			if freq[s] > freq[big] {
				big = s
			}
		}
		if sum < M {
			freq[big] += uint32(M - sum)
			sum = M
		} else {
			d := min(sum-M, uint64(freq[big])-1)
			freq[big] -= uint32(d)
			sum -= d
		}
	}
	return true
}

// wireWeights[res][v] is level v's weight at resolution res (1 to 8; v
// >= 1): 2^30 * 2^(-(v-1)/res), wireFrac8's entry shifted, as wireFreqs
// takes it, computed once.
var wireWeights = sync.OnceValue(func() *[9][256]uint64 {
	var t [9][256]uint64
	for res := 1; res <= 8; res++ {
		for v := 1; v < 256; v++ {
			e := (v - 1) * (8 / res)
			t[res][v] = wireFrac8[e&7] >> (e >> 3)
		}
	}
	return &t
})

// setLevels fills fs from levels; false if a context holds no symbol.
func (m *wireModel) setLevels() bool {
	A := m.alphabet()
	m.fs = make([]uint32, m.nctx*A)
	freq := make([]uint32, A)
	for c := 0; c < m.nctx; c++ {
		if !wireFreqs(m.levels[c*A:(c+1)*A], m.res, m.prec, freq) {
			return false
		}
		var start uint32
		for s, f := range freq {
			m.fs[c*A+s] = f | start<<16
			start += f
		}
	}
	return true
}

// decodeTable fills the slot-to-symbol table, in buf's memory where it
// holds it: per context, the symbol whose interval holds each slot (a
// state's low prec bits), one byte a slot.
func (m *wireModel) decodeTable(buf []uint8) []uint8 {
	M := 1 << m.prec
	if cap(buf) < m.nctx*M+3 { // 3 bytes of slack for wireDecode32's 4-byte reads
		buf = make([]uint8, m.nctx*M, m.nctx*M+3)
	}
	t := buf[:m.nctx*M]
	m.intervals(func(c, s, st, f int) {
		seg := t[c*M+st : c*M+st+f]
		seg[0] = uint8(s)
		for k := 1; k < len(seg); k *= 2 {
			copy(seg[k:], seg[:k])
		}
	})
	return t
}

// intervals calls fn for each context c and symbol s of nonzero frequency f
// with the start st of its slots (the decode tables' one traversal).
func (m *wireModel) intervals(fn func(c, s, st, f int)) {
	A := m.alphabet()
	for c := 0; c < m.nctx; c++ {
		for s := 0; s < A; s++ {
			fs := m.fs[c*A+s]
			if f, st := int(fs&0xffff), int(fs>>16); f != 0 {
				fn(c, s, st, f)
			}
		}
	}
}

// ---- the model's bytes ----

type wireBitWriter struct {
	buf  []byte
	acc  uint64
	nacc uint
}

func (w *wireBitWriter) write(v uint64, n uint) {
	w.acc |= v << w.nacc
	w.nacc += n
	for w.nacc >= 8 {
		w.buf = append(w.buf, byte(w.acc))
		w.acc >>= 8
		w.nacc -= 8
	}
}

// writeEG writes v as an order-k Exp-Golomb code: with u = v + 2^k, the
// count of u's bits past k+1 as zeros, a one, then u's low bits.
func (w *wireBitWriter) writeEG(v uint64, k uint) {
	u := v + 1<<k
	nb := uint(64 - leadingZeros64(u)) // bits of u
	z := nb - 1 - k
	if nb > 28 { // not from a model's levels: the three parts one by one
		w.write(0, z)
		w.write(1, 1)
		w.write(u&(1<<(nb-1)-1), nb-1)
		return
	}
	// the zeros, the one and u's low bits as one field of at most 55 bits
	w.write(1<<z|(u&(1<<(nb-1)-1))<<(z+1), z+nb)
}

func (w *wireBitWriter) flush() []byte {
	if w.nacc > 0 {
		w.buf = append(w.buf, byte(w.acc))
		w.acc, w.nacc = 0, 0
	}
	return w.buf
}

func leadingZeros64(x uint64) int { return mathbits.LeadingZeros64(x) }

type wireBitReader struct {
	buf []byte
	pos uint // bit position
}

func (r *wireBitReader) bit() (uint64, bool) {
	if r.pos >= uint(len(r.buf))*8 {
		return 0, false
	}
	b := uint64(r.buf[r.pos>>3]>>(r.pos&7)) & 1
	r.pos++
	return b, true
}

func (r *wireBitReader) bits(n uint) (uint64, bool) {
	var v uint64
	for i := uint(0); i < n; i++ {
		b, ok := r.bit()
		if !ok {
			return 0, false
		}
		v |= b << i
	}
	return v, true
}

func (r *wireBitReader) readEG(k uint) (uint64, bool) {
	z := uint(0)
	for {
		b, ok := r.bit()
		if !ok || z > 16 {
			return 0, false
		}
		if b == 1 {
			break
		}
		z++
	}
	low, ok := r.bits(z + k)
	if !ok {
		return 0, false
	}
	return (1<<(z+k) | low) - 1<<k, true
}

func zigzag(d int) uint64 {
	if d >= 0 {
		return uint64(2 * d)
	}
	return uint64(-2*d - 1)
}

func unzigzag(u uint64) int {
	if u&1 == 0 {
		return int(u >> 1)
	}
	return -int(u>>1) - 1
}

// tableBytes writes the tables at order k and returns them: each delta's
// code from wireEGCodes, gathered in a local 64-bit accumulator (a code
// is at most 19 bits), into a buffer of the tables' size.
func (m *wireModel) tableBytes(k int) []byte {
	A := m.alphabet()
	codes := &wireEGCodes()[k&3]
	levels := m.levels[:m.nctx*A]
	buf := make([]byte, 0, (len(levels)*19+7)/8)
	var acc uint64
	var nacc uint
	for i, v := range levels {
		pred := 0
		if i >= A {
			pred = int(levels[i-A])
		}
		e := codes[zigzag(int(v)-pred)&511]
		acc |= uint64(e>>8) << nacc
		nacc += uint(e & 0xff)
		for nacc >= 8 {
			buf = append(buf, byte(acc))
			acc >>= 8
			nacc -= 8
		}
	}
	if nacc > 0 {
		buf = append(buf, byte(acc))
	}
	return buf
}

// wireEGCodes[k][z] is z's order-k Exp-Golomb code as writeEG writes it,
// its bits << 8 | its length, for the zigzagged level deltas (below 512).
var wireEGCodes = sync.OnceValue(func() *[4][512]uint32 {
	var t [4][512]uint32
	for k := range t {
		for z := range t[k] {
			var w wireBitWriter
			w.writeEG(uint64(z), uint(k))
			n := uint32(w.nacc) + 8*uint32(len(w.buf))
			var bits uint32
			for i, b := range w.flush() {
				bits |= uint32(b) << (8 * i)
			}
			t[k][z] = bits<<8 | n
		}
	}
	return &t
})

// tableSizes is len(tableBytes(k)) for k = 0..3, without writing them:
// an order-k code of u takes 2*bits(u + 2^k) - 1 - k bits. The deltas are
// counted by value first (a level is a byte, so a zigzagged delta is below
// 512), then each value's bits taken once.
func (m *wireModel) tableSizes() [4]int {
	A := m.alphabet()
	var hist [512]int32
	levels := m.levels[:m.nctx*A]
	for _, v := range levels[:min(A, len(levels))] {
		hist[zigzag(int(v))&511]++
	}
	if len(levels) > A {
		prev, cur := levels[:len(levels)-A], levels[A:]
		cur = cur[:len(prev)]
		for i, v := range cur {
			hist[zigzag(int(v)-int(prev[i]))&511]++
		}
	}
	var n [4]int
	for z, c := range hist {
		if c == 0 {
			continue
		}
		for k := range n {
			n[k] += int(c) * (2*mathbits.Len64(uint64(z)+1<<k) - 1 - k)
		}
	}
	for k := range n {
		n[k] = (n[k] + 7) / 8
	}
	return n
}

// marshal is the model's bytes.
func (m *wireModel) marshal() []byte {
	if m.mode == wireModeOrder1 {
		return m.marshalOrder1()
	}
	out := []byte{wireVersion, byte(m.bits), byte(m.mode), byte(m.prec), byte(m.res), byte(m.chunkLog), byte(m.egk),
		byte(mathbits.TrailingZeros(uint(m.states)))}
	return append(out, m.tableBytes(m.egk)...)
}

// parseWireModel reads a model for codes of the given width, whose
// contexts the caller's shape gives (nctx per mode, wireContexts), checking
// every field before allocating; the decoder's table is decodeTable's.
func parseWireModel(b []byte, bits int, nctx func(mode int) int, ncodes int) (*wireModel, error) {
	if len(b) < 1 || b[0] < 1 || b[0] > wireVersionOrder1 {
		if len(b) == 0 {
			return nil, errors.New("model of 0 bytes")
		}
		return nil, fmt.Errorf("model version %d, this build reads 1 to %d", b[0], wireVersionOrder1)
	}
	hs := wireHeaderSize
	switch b[0] {
	case 1:
		hs = 7
	case wireVersionOrder1:
		hs = wireHeaderSize + 1 // klog
	}
	if len(b) < hs {
		return nil, fmt.Errorf("model of %d bytes, want at least %d", len(b), hs)
	}
	m := &wireModel{version: b[0], bits: int(b[1]), mode: int(b[2]), prec: int(b[3]), res: int(b[4]), chunkLog: int(b[5]), egk: int(b[6]), states: wireStates}
	if b[0] >= 2 {
		if b[7] < 2 || b[7] > 5 {
			return nil, fmt.Errorf("log2 of the states %d, want 2 to 5", b[7])
		}
		m.states = 1 << b[7]
	}
	switch {
	case m.bits != bits:
		return nil, fmt.Errorf("model for %d-bit codes, the scheme stores %d", m.bits, bits)
	case m.mode > 3 && m.version != wireVersionOrder1 || m.version == wireVersionOrder1 && m.mode != wireModeOrder1:
		return nil, fmt.Errorf("context mode %d in a version %d model, want 0 to 3 (4, and only 4, in version 3)", m.mode, m.version)
	case m.prec < m.bits || m.prec > min(12, m.bits+8):
		return nil, fmt.Errorf("precision %d for %d-bit codes, want %d to %d", m.prec, m.bits, m.bits, min(12, m.bits+8))
	case m.res != 1 && m.res != 2 && m.res != 4 && m.res != 8:
		return nil, fmt.Errorf("resolution %d, want 1, 2, 4 or 8", m.res)
	case m.chunkLog < wireMinChunk || m.chunkLog > wireMaxChunk:
		return nil, fmt.Errorf("chunk log %d, want %d to %d", m.chunkLog, wireMinChunk, wireMaxChunk)
	case m.egk > 3:
		return nil, fmt.Errorf("table code order %d, want 0 to 3", m.egk)
	}
	m.nctx = nctx(m.mode)
	A := m.alphabet()
	tab := b[hs:]
	if m.mode == wireModeOrder1 {
		var err error
		if tab, err = m.parseOrder1(b, nctx); err != nil {
			return nil, err
		}
	}
	switch {
	case m.nctx < 1 || m.nctx > wireMaxCtx:
		return nil, fmt.Errorf("context mode %d has %d contexts for this shape, want 1 to %d", m.mode, m.nctx, wireMaxCtx)
	case uint64(len(tab))*8 < uint64(m.nctx*A)*uint64(1+m.egk):
		return nil, fmt.Errorf("%d table bytes cannot hold %d contexts of %d symbols", len(tab), m.nctx, A)
	case m.nctx<<m.prec > max(ncodes, wireTableAllowance):
		return nil, fmt.Errorf("%d contexts at precision %d take more table bytes than the %d codes allow", m.nctx, m.prec, ncodes)
	}
	m.levels = make([]uint8, m.nctx*A)
	r := wireBitReader{buf: tab}
	maxLevel := wireMaxLevel(m.res, m.prec)
	for c := 0; c < m.nctx; c++ {
		for s := 0; s < A; s++ {
			u, ok := r.readEG(uint(m.egk))
			if !ok {
				return nil, fmt.Errorf("tables truncated or malformed at context %d symbol %d", c, s)
			}
			pred := 0
			if c > 0 {
				pred = int(m.levels[(c-1)*A+s])
			}
			if u > math.MaxInt32 {
				return nil, fmt.Errorf("table delta out of range at context %d symbol %d", c, s)
			}
			v := pred + unzigzag(u)
			if v < 0 || v > maxLevel {
				return nil, fmt.Errorf("level %d at context %d symbol %d, want 0 to %d", v, c, s, maxLevel)
			}
			m.levels[c*A+s] = uint8(v)
		}
	}
	if (r.pos+7)/8 != uint(len(tab)) {
		return nil, fmt.Errorf("%d bytes after the tables", uint(len(tab))-(r.pos+7)/8)
	}
	if rest, _ := r.bits(uint(len(tab))*8 - r.pos); rest != 0 {
		return nil, errors.New("nonzero padding after the tables")
	}
	if !m.setLevels() {
		return nil, errors.New("a context holds no symbol")
	}
	return m, nil
}

// ---- contexts ----

// wireShape maps a position in q-order (the order codes are stored in) to
// its context: per head and channel for a 4-D tensor, along tokens
// (channel = position % d, head = position / (tq*d) % h) or along channels
// (one row of tq tokens per batch, head and channel).
type wireShape struct {
	fourD      bool
	channel    bool // codes in channel rows
	h, d, tq   int
	n          int // codes
	bits       int
	rawBytes   int  // PackedLen(n, bits)
	perHeadRun int  // tq*d
	bytes      bool // wireByteShape's: packed bytes as symbols
}

func (w wireShape) contexts(mode int) int {
	if !w.fourD {
		if mode == 0 {
			return 1
		}
		return 0
	}
	switch mode {
	case 0:
		return 1
	case 1:
		return w.h
	case 2:
		return w.d
	case wireModeOrder1: // its heads (wire_order1.go), 0 where it does not apply
		return w.order1Heads()
	}
	return w.h * w.d
}

// run is the run of positions from i (below hi) whose contexts are c0,
// c0+step, ..., step 0 or 1: its length n >= 1 (i < hi).
func (w wireShape) run(mode, i, hi int) (n, c0, step int) {
	if !w.fourD || mode == 0 || w.h == 0 || w.d == 0 || w.tq == 0 {
		return hi - i, 0, 0
	}
	if w.channel {
		row := i / w.tq
		hc := row % (w.h * w.d)
		return min(hi, (row+1)*w.tq) - i, [4]int{0, hc / w.d, hc % w.d, hc}[mode], 0
	}
	head := i / w.perHeadRun % w.h
	if mode == 1 {
		return min(hi, (i/w.perHeadRun+1)*w.perHeadRun) - i, head, 0
	}
	c := i % w.d
	n = min(hi, i-c+w.d) - i
	if mode == 2 {
		return n, c, 1
	}
	return n, head*w.d + c, 1
}

// ---- unpack and pack codes ----

// wireUnpack extracts codes [lo, hi) of width bits from packed (lo a multiple of 8).
func wireUnpack(dst []uint8, packed []byte, lo, bits int) {
	switch bits {
	case 8:
		copy(dst, packed[lo:])
		return
	case 4:
		p := packed[lo/2:]
		if useSIMD { // 64 codes a step
			if n := min(len(dst), 2*len(p)) &^ 63; n > 0 {
				wireUnpack4AVX2(dst[:n], p[:n/2])
				dst, p = dst[n:], p[n/2:]
			}
		}
		// 8 bytes, 16 codes at a time: the low and high nibbles spread to
		// alternate bytes
		n16 := min(len(dst), 2*len(p)) &^ 15
		for i := 0; i < n16; i += 16 {
			v := binary.LittleEndian.Uint64(p[i/2:])
			l, h := v&0x0f0f0f0f0f0f0f0f, v>>4&0x0f0f0f0f0f0f0f0f
			binary.LittleEndian.PutUint64(dst[i:], wireSpread(uint32(l))|wireSpread(uint32(h))<<8)
			binary.LittleEndian.PutUint64(dst[i+8:], wireSpread(uint32(l>>32))|wireSpread(uint32(h>>32))<<8)
		}
		for i := n16; i+1 < len(dst); i += 2 {
			b := p[i/2]
			dst[i], dst[i+1] = b&15, b>>4
		}
		if len(dst)&1 == 1 {
			dst[len(dst)-1] = p[len(dst)/2] & 15
		}
		return
	}
	if useSIMD && (bits == 2 || bits == 3) { // 32 codes a step
		p := packed[lo*bits/8:]
		n := min(len(dst), 4*len(p)) &^ 31
		if bits == 3 {
			n = 0
			if len(p) >= 14 { // the kernel reads two bytes past its codes
				n = min(len(dst)/32, (len(p)-2)/12) * 32
			}
		}
		if n > 0 {
			if bits == 2 {
				wireUnpack2AVX2(dst[:n], p[:n/4])
			} else {
				wireUnpack3AVX2(dst[:n], p[:n*3/8+2])
			}
			dst, lo = dst[n:], lo+n
		}
	}
	mask := uint64(1)<<bits - 1
	bit := lo * bits
	// Eight codes are bits whole bytes (lo is a multiple of 8): a group at a
	// time while 8 bytes can be read, then one by one.
	if p := packed[bit>>3:]; len(p) >= 8 {
		b := uint(bits)
		gmask := uint64(1)<<(8*b) - 1
		ng := min(len(dst)/8, (len(p)-8)/bits+1)
		if bits <= 3 {
			// the 8 fields spread to bytes in three halvings: fields 4-7 to
			// bit 32, 2-3 of each half to bit 16 of it, the odd ones to bit 8
			// (the fields left behind fall outside the masks for b <= 3)
			m4 := (uint64(1)<<(4*b) - 1) * (1 | 1<<32)
			m2 := (uint64(1)<<(2*b) - 1) * 0x0001000100010001
			m1 := mask * 0x0101010101010101
			for g := 0; g < ng; g++ {
				v := binary.LittleEndian.Uint64(p[g*bits:]) & gmask
				v = (v | v<<(32-4*b)) & m4
				v = (v | v<<(16-2*b)) & m2
				v = (v | v<<(8-b)) & m1
				binary.LittleEndian.PutUint64(dst[8*g:], v)
			}
		} else {
			for g := 0; g < ng; g++ {
				v := binary.LittleEndian.Uint64(p[g*bits:]) & gmask
				o := dst[8*g : 8*g+8 : 8*g+8]
				o[0], o[1], o[2], o[3] = uint8(v&mask), uint8(v>>b&mask), uint8(v>>(2*b)&mask), uint8(v>>(3*b)&mask)
				o[4], o[5], o[6], o[7] = uint8(v>>(4*b)&mask), uint8(v>>(5*b)&mask), uint8(v>>(6*b)&mask), uint8(v>>(7*b)&mask)
			}
		}
		dst = dst[8*ng:]
		bit += 8 * ng * bits
	}
	for i := range dst {
		byteAt, off := bit>>3, uint(bit&7)
		v := uint64(packed[byteAt]) >> off
		if int(off)+bits > 8 {
			v |= uint64(packed[byteAt+1]) << (8 - off)
		}
		dst[i] = uint8(v & mask)
		bit += bits
	}
}

// wireSpread moves x's four bytes to the even bytes of the result.
func wireSpread(x uint32) uint64 {
	v := uint64(x)
	v = (v | v<<16) & 0x0000ffff0000ffff
	return (v | v<<8) & 0x00ff00ff00ff00ff
}

// wirePack writes codes src as bits-wide fields into dst (its first code on a byte).
func wirePack(dst []byte, src []uint8, bits int) {
	switch bits {
	case 8:
		copy(dst, src)
		return
	case 4, 2: // Pack's kernels (AVX2 where there is), on the same bytes as int8 codes
		Pack(dst, asInt8(src), bits)
		return
	}
	// Eight codes are bits whole bytes: a group at a time, then the rest.
	b := bits & 7
	n8 := len(src) &^ 7
	if bits <= 3 {
		// wireUnpack's halvings backwards: the 8 bytes merged pairwise into
		// 16-, 32- and 64-bit lanes; each group stored as 8 bytes, the
		// next group's overwriting all but its b, while 8 bytes fit
		ub := uint(b)
		m1 := (uint64(1)<<(2*ub) - 1) * 0x0001000100010001
		m2 := (uint64(1)<<(4*ub) - 1) * (1 | 1<<32)
		m3 := uint64(1)<<(8*ub) - 1
		i := 0
		for ; i < n8 && i/8*bits+8 <= len(dst); i += 8 {
			v := binary.LittleEndian.Uint64(src[i:])
			v = (v | v>>(8-ub)) & m1
			v = (v | v>>(16-2*ub)) & m2
			v = (v | v>>(32-4*ub)) & m3
			binary.LittleEndian.PutUint64(dst[i/8*bits:], v)
		}
		src, dst = src[i:], dst[i/8*bits:]
		n8 -= i
	}
	for i := 0; i < n8; i += 8 {
		g := src[i : i+8 : i+8]
		v := uint64(g[0]) | uint64(g[1])<<b | uint64(g[2])<<(2*b) | uint64(g[3])<<(3*b) |
			uint64(g[4])<<(4*b) | uint64(g[5])<<(5*b) | uint64(g[6])<<(6*b) | uint64(g[7])<<(7*b)
		o := dst[i/8*bits : i/8*bits+bits]
		for k := range o {
			o[k] = byte(v >> (8 * k))
		}
	}
	src, dst = src[n8:], dst[n8/8*bits:]
	Pack(dst, asInt8(src), bits) // the last few: Pack's loop
}

// asInt8 is codes as Pack takes them, the same bytes.
func asInt8(codes []uint8) []int8 {
	if len(codes) == 0 {
		return nil
	}
	return unsafe.Slice((*int8)(unsafe.Pointer(unsafe.SliceData(codes))), len(codes))
}

// ---- the chunk coder ----

// wireEnc is one (context, symbol)'s encoder entry: a state x at or above
// xmax is renormalized first, then x becomes x + bias + q*cmpl with
// q = floor(x/freq) = the high word of x*rcp, rcp = floor(2^64/freq)+1
// (exact for x < 2^32, since x*(rcp - 2^64/freq)/2^64 < 2^-32 < 1/freq).
// A frequency 1 takes rcp = 2^64-1, so q = x-1, with bias and cmpl set to
// give x*M + start all the same (ryg_rans's trick).
type wireEnc struct {
	rcp        uint64
	xmax       uint64
	bias, cmpl uint32
}

// buildEncode fills the encoder's table from fs.
func (m *wireModel) buildEncode() {
	M := uint32(1) << m.prec
	m.enc = make([]wireEnc, len(m.fs))
	for i, fs := range m.fs {
		f, st := fs&0xffff, fs>>16
		e := wireEnc{xmax: uint64(f) << (32 - m.prec), bias: st, cmpl: M - f}
		switch f {
		case 0: // an absent symbol: never coded
		case 1:
			e.rcp, e.bias, e.cmpl = math.MaxUint64, st+M-1, M-1
		default:
			e.rcp = wireRcps()[f]
		}
		m.enc[i] = e
	}
}

// encTable is the encoder's table, built on the first call (the
// AVX-512 kernel codes from fs, and where it takes a part's every run the
// table is never built).
func (m *wireModel) encTable() []wireEnc {
	m.encOnce.Do(func() {
		if m.enc == nil {
			m.buildEncode()
		}
	})
	return m.enc
}

// wireRcps[f] is floor(2^64/f)+1, the encoder's reciprocal of a frequency
// f >= 2 (up to 2^12), worked out once rather than a division an entry.
var wireRcps = sync.OnceValue(func() []uint64 {
	t := make([]uint64, 1<<12+1)
	for f := 2; f < len(t); f++ {
		t[f] = math.MaxUint64/uint64(f) + 1
	}
	return t
})

// wireRun is a run of a chunk's positions from start, n long, of contexts
// c0, c0+step, ...
type wireRun struct{ start, n, c0, step int }

// encodeChunk codes the symbols of positions [lo, lo+len(syms)), shape w,
// and appends the stream to out. scratch is reused across calls.
func (m *wireModel) encodeChunk(out []byte, syms []uint8, w wireShape, lo int, scratch *wireScratch) []byte {
	if scratch == nil {
		scratch = &wireScratch{}
	}
	if m.mode == wireModeOrder1 {
		return m.encodeOrder1(out, syms, w, lo, scratch)
	}
	n := len(syms)
	runs := scratch.runs[:0]
	it := w.runIter(m.mode, lo, lo+n)
	for i := 0; i < n; {
		rn, c0, step := it.next()
		runs = append(runs, wireRun{i, rn, c0, step})
		i += rn
	}
	scratch.runs = runs
	if m.states != wireStates {
		return m.encodeWide(out, syms, runs, scratch)
	}
	if cap(scratch.buf) < 2*n+4*wireStates {
		scratch.buf = make([]byte, 2*n+4*wireStates)
	}
	buf := scratch.buf[:2*n+4*wireStates]
	wp := len(buf) // the words go backwards from the end
	enc := m.encTable()
	bits := uint(m.bits)
	// t0 is the state of the next symbol to code (position i, state i mod
	// 4), t1 that of i-1, and so on: a group of four codes i..i-3 with
	// t0..t3, a single symbol rotates them.
	t0, t1, t2, t3 := uint32(wireL), uint32(wireL), uint32(wireL), uint32(wireL)
	for r := len(runs) - 1; r >= 0; r-- {
		run := runs[r]
		ss := syms[run.start : run.start+run.n]
		k := run.n - 1
		if useSIMD && k >= 3 {
			// the groups' entries lie in enc: rows c0 + step*k down to c0
			a := wireEncArgs{enc: &enc[(run.c0+run.step*k)<<bits], syms: &ss[k], buf: &buf[0], wp: wp,
				groups: run.n / 4, step: 24 * run.step << bits, t: [4]uint32{t0, t1, t2, t3}}
			wireEncodeAMD64(&a)
			t0, t1, t2, t3, wp = a.t[0], a.t[1], a.t[2], a.t[3], a.wp
			k -= 4 * (run.n / 4)
		}
		for ; k >= 3; k -= 4 {
			c := run.c0 + run.step*k
			e0 := &enc[c<<bits|int(ss[k])]
			c -= run.step
			e1 := &enc[c<<bits|int(ss[k-1])]
			c -= run.step
			e2 := &enc[c<<bits|int(ss[k-2])]
			c -= run.step
			e3 := &enc[c<<bits|int(ss[k-3])]
			t0, wp = wireEmit(t0, e0.xmax, buf, wp)
			t1, wp = wireEmit(t1, e1.xmax, buf, wp)
			t2, wp = wireEmit(t2, e2.xmax, buf, wp)
			t3, wp = wireEmit(t3, e3.xmax, buf, wp)
			q0, _ := mathbits.Mul64(uint64(t0), e0.rcp)
			q1, _ := mathbits.Mul64(uint64(t1), e1.rcp)
			q2, _ := mathbits.Mul64(uint64(t2), e2.rcp)
			q3, _ := mathbits.Mul64(uint64(t3), e3.rcp)
			t0 += e0.bias + uint32(q0)*e0.cmpl
			t1 += e1.bias + uint32(q1)*e1.cmpl
			t2 += e2.bias + uint32(q2)*e2.cmpl
			t3 += e3.bias + uint32(q3)*e3.cmpl
		}
		for ; k >= 0; k-- {
			e := &enc[(run.c0+run.step*k)<<bits|int(ss[k])]
			x := t0
			if uint64(x) >= e.xmax {
				wp -= 2
				binary.LittleEndian.PutUint16(buf[wp:], uint16(x))
				x >>= 16
			}
			q, _ := mathbits.Mul64(uint64(x), e.rcp)
			x += e.bias + uint32(q)*e.cmpl
			t0, t1, t2, t3 = t1, t2, t3, x
		}
	}
	// After position 0, t0 is the state of position -1 (state 3), t3 of position 0 (state 0).
	wp -= 4 * wireStates
	binary.LittleEndian.PutUint32(buf[wp:], t3)
	binary.LittleEndian.PutUint32(buf[wp+4:], t2)
	binary.LittleEndian.PutUint32(buf[wp+8:], t1)
	binary.LittleEndian.PutUint32(buf[wp+12:], t0)
	return append(out, buf[wp:]...)
}

// wireScratch is a worker's reusable memory for encodeChunk.
type wireScratch struct {
	runs []wireRun
	buf  []byte
	syms []uint8 // wireStored's: a chunk's codes, unpacked
}

// decodeChunk decodes len(dst) symbols, positions from lo, from src, one a
// byte.
func (m *wireModel) decodeChunk(dst []uint8, src []byte, w wireShape, lo int) error {
	if ent := m.decodeEntries(nil); ent != nil {
		return m.decodeSyms(nil, ent, dst, src, w, lo)
	}
	return m.decodeSyms(m.decodeTable(nil), nil, dst, src, w, lo)
}

// wireDecodeScratch is a decoding worker's memory: the decode table of the
// model it last decoded with, and room for a chunk's symbols.
type wireDecodeScratch struct {
	model *wireModel
	sym   []uint8
	ent   []uint32 // decodeEntries's, where wireDecode32 runs
	tab   []uint32 // ent where the model last built uses it, else nil
	syms  []uint8
}

// decodeInto decodes n symbols, positions from lo, from src into dst as
// packed b-bit codes (dst holds PackedLen(n, b) bytes). It builds the
// decode table in the scratch when the last chunk there was another
// model's: the table then is warm in the cache for the chunks that follow.
func (m *wireModel) decodeInto(dst []byte, n int, src []byte, w wireShape, lo int, scratch *wireDecodeScratch) error {
	if scratch.model != m {
		scratch.model = m
		// the AVX-512 kernel's table where it runs (the Go steps in between
		// use it too), else the slot-to-symbol bytes
		if ent := m.decodeEntries(scratch.ent); ent != nil {
			scratch.ent, scratch.tab = ent, ent
		} else {
			scratch.sym, scratch.tab = m.decodeTable(scratch.sym), nil
		}
	}
	if cap(scratch.syms) < n {
		scratch.syms = make([]uint8, n)
	}
	syms := scratch.syms[:n]
	if err := m.decodeSyms(scratch.sym, scratch.tab, syms, src, w, lo); err != nil {
		return err
	}
	wirePack(dst, syms, m.bits)
	return nil
}

// wireRunIter walks the runs of wireShape.run from lo to hi without a
// division a run.
type wireRunIter struct {
	w            wireShape
	mode, i, hi  int
	head, ch, in int // token-axis modes 2 and 3: the head, the channel, positions left in the head
}

func (w wireShape) runIter(mode, lo, hi int) wireRunIter {
	it := wireRunIter{w: w, mode: mode, i: lo, hi: hi}
	if w.fourD && !w.channel && (mode == 2 || mode == 3) && w.d > 0 && w.tq > 0 && w.h > 0 {
		it.head, it.ch, it.in = lo/w.perHeadRun%w.h, lo%w.d, w.perHeadRun-lo%w.perHeadRun
	}
	return it
}

// next is the run at the iterator's position (which must be below hi).
func (it *wireRunIter) next() (n, c0, step int) {
	w := it.w
	if it.in == 0 {
		n, c0, step = w.run(it.mode, it.i, it.hi)
		it.i += n
		return n, c0, step
	}
	n = min(it.hi-it.i, w.d-it.ch)
	c0 = it.ch
	if it.mode == 3 {
		c0 += it.head * w.d
	}
	it.i += n
	it.ch += n
	it.in -= n
	if it.ch == w.d {
		it.ch = 0
	}
	if it.in == 0 {
		it.in = w.perHeadRun
		if it.head++; it.head == w.h {
			it.head = 0
		}
	}
	return n, c0, 1
}

// decodeSyms decodes len(dst) symbols, positions from lo of shape w, from
// src, with the table of decodeTable. The four states live in registers,
// s0 that of the next symbol: a group of four decodes with s0..s3
// (wireDecodeGroups), a single symbol rotates them; the 16-bit words are read in
// symbol order.
func (m *wireModel) decodeSyms(sym []uint8, ent []uint32, dst []uint8, src []byte, w wireShape, lo int) error {
	if m.mode == wireModeOrder1 {
		return m.decodeOrder1(sym, ent, dst, src, w, lo)
	}
	if m.states != wireStates {
		return m.decodeWide(sym, ent, dst, src, w, lo)
	}
	if len(src) < 4*wireStates || len(src)&1 != 0 {
		return fmt.Errorf("stream of %d bytes: want the 16 bytes of states and whole 16-bit words", len(src))
	}
	s0 := binary.LittleEndian.Uint32(src)
	s1 := binary.LittleEndian.Uint32(src[4:])
	s2 := binary.LittleEndian.Uint32(src[8:])
	s3 := binary.LittleEndian.Uint32(src[12:])
	words := src[16:]
	p := 0
	prec := uint(m.prec) & 31
	bits := uint(m.bits) & 31
	mask := uint32(1)<<prec - 1
	n := len(dst)
	it := w.runIter(m.mode, lo, lo+n)
	for i := 0; i < n; {
		rn, c0, step := it.next()
		out := dst[i : i+rn]
		i += rn
		row, rstep := c0<<prec, step<<prec
		frow, fstep := c0<<bits, step<<bits
		var k int
		s0, s1, s2, s3, p, row, frow, k = wireDecodeGroups(sym, m.fs, out, words, p, s0, s1, s2, s3, row, rstep, frow, fstep, 1<<bits, prec)
		for ; k < len(out); k++ {
			l := s0 & mask
			a := sym[row+int(l)]
			e := m.fs[frow+int(a)]
			row, frow = row+rstep, frow+fstep
			x := (e&0xffff)*(s0>>prec) + l - e>>16
			if x < wireL {
				if p+2 > len(words) {
					return errors.New("stream ends before its symbols")
				}
				x = x<<16 | uint32(words[p]) | uint32(words[p+1])<<8
				p += 2
			}
			s0, s1, s2, s3 = s1, s2, s3, x
			out[k] = a
		}
	}
	switch {
	case p != len(words):
		return fmt.Errorf("%d bytes left after the symbols", len(words)-p)
	case s0 != wireL || s1 != wireL || s2 != wireL || s3 != wireL:
		return errors.New("stream does not decode to its initial state")
	}
	return nil
}

// wireDecodeGroups is decodeSyms's loop over groups of four: from the start of out,
// while a whole group and its (at most four) words remain, it decodes with
// the four states in registers and returns them, the next word, the next
// rows and the symbols decoded. It checks once, before the loop, that every
// row the groups can read lies in sym and fs, and at each group's start
// that its 8 bytes of words and 4 symbols lie in words and out; in between
// it indexes without bounds checks, which in Go's code for this loop cost
// the registers the states need.
func wireDecodeGroups(sym []uint8, fs []uint32, out []uint8, words []byte, p int, s0, s1, s2, s3 uint32, row, rstep, frow, fstep, alpha int, prec uint) (uint32, uint32, uint32, uint32, int, int, int, int) {
	prec &= 31
	n4 := len(out) &^ 3
	if n4 == 0 || p+8 > len(words) || row+(n4-1)*rstep+1<<prec > len(sym) || frow+(n4-1)*fstep+alpha > len(fs) || row < 0 || rstep < 0 || frow < 0 || fstep < 0 {
		return s0, s1, s2, s3, p, row, frow, 0
	}
	if useSIMD {
		a := wireGroupArgs{sym: &sym[row], fs: &fs[frow], out: &out[0], words: &words[p], n4: n4,
			last: len(words) - 8 - p, rstep: rstep, fstep: fstep, prec: uint64(prec), s: [4]uint32{s0, s1, s2, s3}}
		wireGroupsAMD64(&a)
		return a.s[0], a.s[1], a.s[2], a.s[3], p + a.used, row + a.k*rstep, frow + a.k*fstep, a.k
	}
	mask := uint32(1)<<prec - 1
	sb := unsafe.Pointer(unsafe.SliceData(sym))
	fb := unsafe.Pointer(unsafe.SliceData(fs))
	ob := unsafe.Pointer(unsafe.SliceData(out))
	wlast := len(words) - 8
	k := 0
	for ; k < n4 && p <= wlast; k += 4 {
		l0, l1, l2, l3 := s0&mask, s1&mask, s2&mask, s3&mask
		a0 := *(*uint8)(unsafe.Add(sb, row+int(l0)))
		a1 := *(*uint8)(unsafe.Add(sb, row+rstep+int(l1)))
		a2 := *(*uint8)(unsafe.Add(sb, row+2*rstep+int(l2)))
		a3 := *(*uint8)(unsafe.Add(sb, row+3*rstep+int(l3)))
		e0 := *(*uint32)(unsafe.Add(fb, 4*(frow+int(a0))))
		e1 := *(*uint32)(unsafe.Add(fb, 4*(frow+fstep+int(a1))))
		e2 := *(*uint32)(unsafe.Add(fb, 4*(frow+2*fstep+int(a2))))
		e3 := *(*uint32)(unsafe.Add(fb, 4*(frow+3*fstep+int(a3))))
		row += 4 * rstep
		frow += 4 * fstep
		s0 = (e0&0xffff)*(s0>>prec) + l0 - e0>>16
		s1 = (e1&0xffff)*(s1>>prec) + l1 - e1>>16
		s2 = (e2&0xffff)*(s2>>prec) + l2 - e2>>16
		s3 = (e3&0xffff)*(s3>>prec) + l3 - e3>>16
		*(*uint8)(unsafe.Add(ob, k)) = a0
		*(*uint8)(unsafe.Add(ob, k+1)) = a1
		*(*uint8)(unsafe.Add(ob, k+2)) = a2
		*(*uint8)(unsafe.Add(ob, k+3)) = a3
		// The group's words are among the next 8 bytes, read at once; which
		// state takes which follows from the renormalization flags alone, so
		// the states' chains do not wait on one another's reads.
		ws := binary.LittleEndian.Uint64(words[p : p+8])
		n0, n1, n2, n3 := wireLow(s0), wireLow(s1), wireLow(s2), wireLow(s3)
		c1 := n0
		c2 := c1 + n1
		c3 := c2 + n2
		s0 = s0<<(16*n0&31) | uint32(ws)&0xffff&-n0
		s1 = s1<<(16*n1&31) | uint32(ws>>(16*c1&63))&0xffff&-n1
		s2 = s2<<(16*n2&31) | uint32(ws>>(16*c2&63))&0xffff&-n2
		s3 = s3<<(16*n3&31) | uint32(ws>>(16*c3&63))&0xffff&-n3
		p += 2 * int(c3+n3)
	}
	return s0, s1, s2, s3, p, row, frow, k
}

// wireEmit is the encoder's renormalization without a branch: x's low 16
// bits go to buf[wp-2:wp] (free space below the words written so far) and
// count, and x shifts down, if x >= xmax.
func wireEmit(x uint32, xmax uint64, buf []byte, wp int) (uint32, int) {
	binary.LittleEndian.PutUint16(buf[wp-2:], uint16(x))
	var n uint
	if uint64(x) >= xmax {
		n = 1
	}
	return x >> (16 * n & 31), wp - 2*int(n)
}

// wireLow is 1 if a state x is below wireL (it takes a word), else 0.
func wireLow(x uint32) uint32 {
	if x < wireL {
		return 1
	}
	return 0
}

// wireGroupArgs are wireGroupsAMD64's arguments and results: the table
// rows, symbols and words where the groups start, how many symbols and
// bytes of words they may take (a group starts while at most last bytes
// are read), the steps and the states; k and used come back.
type wireGroupArgs struct {
	sym          *uint8
	fs           *uint32
	out          *uint8
	words        *byte
	n4, last     int
	rstep, fstep int
	prec         uint64
	s            [4]uint32
	k, used      int
}

// wireEncArgs are wireEncodeAMD64's arguments: the encoder entries of the
// first symbol's context (the last position of the groups), that symbol,
// the words' buffer and offset (which comes back), how many groups, the
// bytes a symbol steps back in the entries, and the states (which come
// back).
type wireEncArgs struct {
	enc    *wireEnc
	syms   *uint8
	buf    *byte
	wp     int
	groups int
	step   int
	t      [4]uint32
}
