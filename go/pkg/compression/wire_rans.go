package compression

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// The wire coder: a static (two-pass) rANS coder over a tensor's
// quantization codes, with a context per (head, channel) of the code's
// position, or a coarser one where that codes smaller (wireModel.mode).
//
// Why rANS: a static model's decode step is one table lookup, one
// multiply-add and at most one 16-bit read, with no division and no
// data-dependent loop (an arithmetic/range decoder needs a division or a
// search per symbol); four interleaved states break the dependency chain so
// consecutive symbols decode in parallel in the CPU. Encoding runs
// backwards and divides, and is the slower side, as the codec's goals allow.
//
// A model (NAME.codes.wire) is
//
//	byte 0     model version (1)
//	byte 1     bits: the code width b, alphabet A = 2^b (1..8)
//	byte 2     mode: 0 one context, 1 per head, 2 per channel (position in
//	           head_dim), 3 per (head, channel)
//	byte 3     precision P: frequencies sum to M = 2^P (b <= P <= min(12, b+8))
//	byte 4     resolution r: levels per octave of the stored probabilities (1, 2, 4 or 8)
//	byte 5     chunk log: each chunk codes 2^c symbols (10..20), the last fewer
//	byte 6     Exp-Golomb order k of the table deltas (0..3)
//	bytes 7..  the tables, a little-endian bit stream: for each context, for
//	           each symbol, zigzag(level - the previous context's level of the
//	           symbol) as an order-k Exp-Golomb code, zero bits to a byte.
//
// A level 0 is an absent symbol; a level v >= 1 stands for a weight
// 2^(-(v-1)/r), normalized to M (wireFreqs: integers only, so every decoder
// builds the same table). Every context holds at least one symbol.
//
// Each chunk's stream is four little-endian uint32 final states, then the
// 16-bit renormalization words in decode order; symbol i of the chunk is
// coded by state i mod 4. A stream decodes exactly: every word used, and
// every state back at its initial value, or it is rejected.

const (
	wireVersion    = 1
	wireStates     = 4
	wireL          = 1 << 16 // lower bound of a state
	wireMaxCtx     = 4096    // contexts a model may have
	wireMinChunk   = 10
	wireMaxChunk   = 20
	wireChunkLog   = 16
	wireHeaderSize = 7
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
	levels                               []uint8  // nctx*A
	fs                                   []uint32 // nctx*A: freq | start<<16
	sym                                  []uint8  // nctx*M: the decode table, built by buildDecode
}

func (m *wireModel) alphabet() int { return 1 << m.bits }

// wireMaxLevel is the largest level at resolution res and precision prec.
func wireMaxLevel(res, prec int) int { return res*prec + 1 }

// wireFreqs turns one context's levels into frequencies summing to M, every
// present symbol at least 1. It reports false for a context with no symbol.
func wireFreqs(levels []uint8, res, prec int, freq []uint32) bool {
	M := uint64(1) << prec
	var W uint64
	present := 0
	for s, v := range levels {
		freq[s] = 0
		if v == 0 {
			continue
		}
		e := int(v-1) * (8 / res)
		W += wireFrac8[e&7] >> (e >> 3)
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
		e := int(v-1) * (8 / res)
		w := wireFrac8[e&7] >> (e >> 3)
		f := max(1, w*M/W)
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

// buildDecode fills the slot-to-symbol table.
func (m *wireModel) buildDecode() {
	A, M := m.alphabet(), 1<<m.prec
	m.sym = make([]uint8, m.nctx*M)
	for c := 0; c < m.nctx; c++ {
		t := m.sym[c*M : (c+1)*M]
		for s := 0; s < A; s++ {
			fs := m.fs[c*A+s]
			f, st := int(fs&0xffff), int(fs>>16)
			for k := st; k < st+f; k++ {
				t[k] = uint8(s)
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
	w.write(0, nb-1-k)
	w.write(1, 1)
	w.write(u&(1<<(nb-1)-1), nb-1)
}

func (w *wireBitWriter) flush() []byte {
	if w.nacc > 0 {
		w.buf = append(w.buf, byte(w.acc))
		w.acc, w.nacc = 0, 0
	}
	return w.buf
}

func leadingZeros64(x uint64) int { return bits.LeadingZeros64(x) }

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

// tableBits writes the tables at order k and returns them.
func (m *wireModel) tableBytes(k int) []byte {
	A := m.alphabet()
	var w wireBitWriter
	for c := 0; c < m.nctx; c++ {
		for s := 0; s < A; s++ {
			pred := 0
			if c > 0 {
				pred = int(m.levels[(c-1)*A+s])
			}
			w.writeEG(zigzag(int(m.levels[c*A+s])-pred), uint(k))
		}
	}
	return w.flush()
}

// tableSize is len(tableBytes(k)), without writing them.
func (m *wireModel) tableSize(k int) int {
	A := m.alphabet()
	n := 0
	for c := 0; c < m.nctx; c++ {
		for s := 0; s < A; s++ {
			pred := 0
			if c > 0 {
				pred = int(m.levels[(c-1)*A+s])
			}
			u := zigzag(int(m.levels[c*A+s])-pred) + 1<<k
			n += 2*bits.Len64(u) - 1 - k
		}
	}
	return (n + 7) / 8
}

// marshal is the model's bytes.
func (m *wireModel) marshal() []byte {
	out := []byte{wireVersion, byte(m.bits), byte(m.mode), byte(m.prec), byte(m.res), byte(m.chunkLog), byte(m.egk)}
	return append(out, m.tableBytes(m.egk)...)
}

// parseWireModel reads a model for codes of the given width, whose
// contexts the caller's shape gives (nctx per mode, wireContexts), checking
// every field before allocating, and builds its decode tables.
func parseWireModel(b []byte, bits int, nctx func(mode int) int, ncodes int) (*wireModel, error) {
	if len(b) < wireHeaderSize {
		return nil, fmt.Errorf("model of %d bytes, want at least %d", len(b), wireHeaderSize)
	}
	m := &wireModel{bits: int(b[1]), mode: int(b[2]), prec: int(b[3]), res: int(b[4]), chunkLog: int(b[5]), egk: int(b[6])}
	switch {
	case b[0] != wireVersion:
		return nil, fmt.Errorf("model version %d, this build reads %d", b[0], wireVersion)
	case m.bits != bits:
		return nil, fmt.Errorf("model for %d-bit codes, the scheme stores %d", m.bits, bits)
	case m.mode > 3:
		return nil, fmt.Errorf("context mode %d, want 0 to 3", m.mode)
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
	tab := b[wireHeaderSize:]
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
	m.buildDecode()
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
	rawBytes   int // PackedLen(n, bits)
	perHeadRun int // tq*d
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
	}
	return w.h * w.d
}

// runs calls fn for consecutive runs of [lo, hi) whose contexts are
// c0, c0+step, ..., step 0 or 1.
func (w wireShape) runs(mode, lo, hi int, fn func(n, c0, step int)) {
	if !w.fourD || mode == 0 || w.h == 0 || w.d == 0 || w.tq == 0 {
		if hi > lo {
			fn(hi-lo, 0, 0)
		}
		return
	}
	for i := lo; i < hi; {
		if w.channel {
			row := i / w.tq
			n := min(hi, (row+1)*w.tq) - i
			hc := row % (w.h * w.d)
			fn(n, [4]int{0, hc / w.d, hc % w.d, hc}[mode], 0)
			i += n
			continue
		}
		head := i / w.perHeadRun % w.h
		if mode == 1 {
			n := min(hi, (i/w.perHeadRun+1)*w.perHeadRun) - i
			fn(n, head, 0)
			i += n
			continue
		}
		c := i % w.d
		n := min(hi, i-c+w.d) - i
		if mode == 2 {
			fn(n, c, 1)
		} else {
			fn(n, head*w.d+c, 1)
		}
		i += n
	}
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
		for i := 0; i+1 < len(dst); i += 2 {
			b := p[i/2]
			dst[i], dst[i+1] = b&15, b>>4
		}
		if len(dst)&1 == 1 {
			dst[len(dst)-1] = p[len(dst)/2] & 15
		}
		return
	}
	mask := uint64(1)<<bits - 1
	bit := lo * bits
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

// wirePack writes codes src as bits-wide fields into dst (its first code on a byte).
func wirePack(dst []byte, src []uint8, bits int) {
	switch bits {
	case 8:
		copy(dst, src)
		return
	case 4:
		for i := 0; i+1 < len(src); i += 2 {
			dst[i/2] = src[i] | src[i+1]<<4
		}
		if len(src)&1 == 1 {
			dst[len(src)/2] = src[len(src)-1]
		}
		return
	case 2:
		n := len(src) &^ 3
		for i := 0; i < n; i += 4 {
			dst[i/4] = src[i] | src[i+1]<<2 | src[i+2]<<4 | src[i+3]<<6
		}
		if n < len(src) {
			var b byte
			for k, s := range src[n:] {
				b |= s << (2 * k)
			}
			dst[n/4] = b
		}
		return
	}
	var acc uint64
	var nacc uint
	j := 0
	for _, s := range src {
		acc |= uint64(s) << nacc
		nacc += uint(bits)
		for nacc >= 8 {
			dst[j] = byte(acc)
			j++
			acc >>= 8
			nacc -= 8
		}
	}
	if nacc > 0 {
		dst[j] = byte(acc)
	}
}

// ---- the chunk coder ----

// encodeChunk codes symbols [lo, lo+len(syms)) and appends the stream to out.
func (m *wireModel) encodeChunk(out []byte, syms []uint8, ctx []uint16) []byte {
	x := [wireStates]uint32{wireL, wireL, wireL, wireL}
	words := make([]uint16, 0, len(syms)/4+8)
	bits, shift := uint(m.bits), uint(32-m.prec)
	prec := uint(m.prec)
	for i := len(syms) - 1; i >= 0; i-- {
		fs := m.fs[int(ctx[i])<<bits|int(syms[i])]
		f, st := fs&0xffff, fs>>16
		s := x[i&3]
		if uint64(s) >= uint64(f)<<shift { // f may be M: 2^32 does not fit a uint32
			words = append(words, uint16(s))
			s >>= 16
		}
		x[i&3] = (s/f)<<prec + s%f + st
	}
	for _, s := range x {
		out = binary.LittleEndian.AppendUint32(out, s)
	}
	for k := len(words) - 1; k >= 0; k-- {
		out = binary.LittleEndian.AppendUint16(out, words[k])
	}
	return out
}

// contextsOf fills ctx with the contexts of positions [lo, lo+len(ctx)).
func (m *wireModel) contextsOf(ctx []uint16, w wireShape, lo int) {
	w.runs(m.mode, lo, lo+len(ctx), func(n, c0, step int) {
		for k := 0; k < n; k++ {
			ctx[k] = uint16(c0 + step*k)
		}
		ctx = ctx[n:]
	})
}

// decodeChunk decodes len(dst) symbols, positions from lo, from src.
func (m *wireModel) decodeChunk(dst []uint8, src []byte, w wireShape, lo int) error {
	if len(src) < 4*wireStates || len(src)&1 != 0 {
		return fmt.Errorf("stream of %d bytes: want the 16 bytes of states and whole 16-bit words", len(src))
	}
	var x0, x1, x2, x3 uint32
	x0 = binary.LittleEndian.Uint32(src)
	x1 = binary.LittleEndian.Uint32(src[4:])
	x2 = binary.LittleEndian.Uint32(src[8:])
	x3 = binary.LittleEndian.Uint32(src[12:])
	words := src[16:]
	p := 0
	prec, bits := uint(m.prec), uint(m.bits)
	mask := uint32(1)<<prec - 1
	sym, fsTab := m.sym, m.fs
	pos := 0 // symbols decoded
	short := false
	xs := [wireStates]uint32{x0, x1, x2, x3}
	w.runs(m.mode, lo, lo+len(dst), func(n, c0, step int) {
		if short {
			return
		}
		out := dst[pos : pos+n]
		for k := range out {
			j := (pos + k) & 3
			x := xs[j]
			c := c0 + step*k
			slot := x & mask
			s := sym[c<<prec|int(slot)]
			fs := fsTab[c<<bits|int(s)]
			x = (fs&0xffff)*(x>>prec) + slot - fs>>16
			if x < wireL {
				if p+2 > len(words) {
					short = true
					return
				}
				x = x<<16 | uint32(words[p]) | uint32(words[p+1])<<8
				p += 2
			}
			xs[j], out[k] = x, s
		}
		pos += n
	})
	x0, x1, x2, x3 = xs[0], xs[1], xs[2], xs[3]
	var err error
	switch {
	case err != nil:
		return err
	case short:
		return errors.New("stream ends before its symbols")
	case p != len(words):
		return fmt.Errorf("%d bytes left after the symbols", len(words)-p)
	case x0 != wireL || x1 != wireL || x2 != wireL || x3 != wireL:
		return errors.New("stream does not decode to its initial state")
	}
	return nil
}
