package compression

import (
	"encoding/binary"
	"errors"
	"fmt"
	mathbits "math/bits"
)

// The chunk coder with S = m.states interleaved states (8 to 32; version 2
// of the format, wire_rans.go): symbol i of a chunk is coded by state
// i mod S and the 16-bit words are read in symbol order, as with four, so
// the Go loops here are the definition; on amd64 with AVX-512 the decoder's
// aligned groups of 16 symbols go to wireDecode32 (wire_amd64.s), two
// 16-lane vectors of states, and the encoder's groups of four to
// wireEncodeWideAMD64.

// encodeWide is encodeChunk for m.states states, over the runs of the
// chunk's positions.
func (m *wireModel) encodeWide(out []byte, syms []uint8, runs []wireRun, scratch *wireScratch) []byte {
	S := m.states
	n := len(syms)
	// 32 bytes below the states for wireEncode32's stores below its words
	size := 2*n + 4*S + 32
	if cap(scratch.buf) < size {
		scratch.buf = make([]byte, size)
	}
	buf := scratch.buf[:size]
	wp := len(buf) // the words go backwards from the end
	bits := uint(m.bits)
	var st [wireMaxStates]uint32
	for j := range st {
		st[j] = wireL
	}
	mask := S - 1
	kernel := S == wireWideStates && useSIMD && useWireAVX512
	A := 1 << bits
	// the encoder's table where a run is not all the kernel's (wireEncode32
	// takes fs)
	var enc []wireEnc
	for _, run := range runs {
		if !kernel || !wireKernelRun(run, A, len(m.fs)) {
			enc = m.encTable()
			break
		}
	}
	for r := len(runs) - 1; r >= 0; r-- {
		run := runs[r]
		ss := syms[run.start : run.start+run.n]
		k := run.n - 1
		if kernel && wireKernelRun(run, A, len(m.fs)) {
			// rows of the same contexts before this one, all in the kernel
			q := r
			for q > 0 && runs[q-1].step == 1 && runs[q-1].n == run.n && runs[q-1].c0 == run.c0 {
				q--
			}
			top := run.start + run.n - 16
			a := wireEnc32Args{fs: &m.fs[(run.c0+run.n-16)*A], syms: &syms[top], buf: &buf[0], wp: wp,
				groups: (r - q + 1) * run.n / 16, step: A, st: &st, phase: top & 16, rowGroups: run.n / 16,
				back: 4 * run.n * A, prec: uint64(m.prec)}
			wireEncode32(&a)
			wp = a.wp
			r = q
			continue
		}
		if kernel && k >= 15 {
			for ; k >= 0 && (run.start+k+1)&15 != 0; k-- {
				st[(run.start+k)&mask], wp = wireEncOne(st[(run.start+k)&mask], &enc[(run.c0+run.step*k)<<bits|int(ss[k])], buf, wp)
			}
			if g := (k + 1) / 16; g > 0 {
				top := run.start + k - 15
				a := wireEnc32Args{fs: &m.fs[(run.c0+run.step*(k-15))*A], syms: &syms[top], buf: &buf[0], wp: wp,
					groups: g, step: run.step * A, st: &st, phase: top & 16, rowGroups: g + 1, prec: uint64(m.prec)}
				wireEncode32(&a)
				wp = a.wp
				k -= 16 * g
			}
		}
		// single symbols down to a group boundary (position k+1 a multiple of 4)
		for ; k >= 0 && (run.start+k+1)&3 != 0; k-- {
			st[(run.start+k)&mask], wp = wireEncOne(st[(run.start+k)&mask], &enc[(run.c0+run.step*k)<<bits|int(ss[k])], buf, wp)
		}
		if useSIMD && k >= 3 {
			g := (k + 1) / 4
			a := wireEncWideArgs{enc: &enc[(run.c0+run.step*k)<<bits], syms: &ss[k], buf: &buf[0], wp: wp,
				groups: g, step: 24 * run.step << bits, st: &st[0], j: (run.start + k - 3) & mask, jmask: mask}
			wireEncodeWideAMD64(&a)
			wp = a.wp
			k -= 4 * g
		}
		for ; k >= 0; k-- {
			st[(run.start+k)&mask], wp = wireEncOne(st[(run.start+k)&mask], &enc[(run.c0+run.step*k)<<bits|int(ss[k])], buf, wp)
		}
	}
	wp -= 4 * S
	for j := 0; j < S; j++ {
		binary.LittleEndian.PutUint32(buf[wp+4*j:], st[j])
	}
	return append(out, buf[wp:]...)
}

// wireKernelRun reports whether wireEncode32 codes all of run, a row of
// whole aligned groups of 16 contexts stepping by one, in a table of nfs
// entries of A symbols a context.
func wireKernelRun(run wireRun, A, nfs int) bool {
	return run.step == 1 && run.n&15 == 0 && run.start&15 == 0 && run.c0 >= 0 && (run.c0+run.n)*A <= nfs
}

// wireEncOne codes one symbol, entry e, with state x: its renormalization
// word goes below wp.
func wireEncOne(x uint32, e *wireEnc, buf []byte, wp int) (uint32, int) {
	if uint64(x) >= e.xmax {
		wp -= 2
		binary.LittleEndian.PutUint16(buf[wp:], uint16(x))
		x >>= 16
	}
	q, _ := mathbits.Mul64(uint64(x), e.rcp)
	return x + e.bias + uint32(q)*e.cmpl, wp
}

// decodeEntries is the table wireDecode32 decodes with, in buf's memory
// where it holds it, or nil where that kernel does not run: per context
// and slot l, one 32-bit entry serving a state's whole step, the slot's
// symbol s (bits 0-7), its frequency less one (8-19) and l - start(s)
// (20-31), so that x becomes (x >> prec) * freq + (l - start).
func (m *wireModel) decodeEntries(buf []uint32) []uint32 {
	if m.states != wireWideStates || !useSIMD || !useWireAVX512 {
		return nil
	}
	M := 1 << m.prec
	if cap(buf) < m.nctx*M {
		buf = make([]uint32, m.nctx*M)
	}
	t := buf[:m.nctx*M]
	m.intervals(func(c, s, st, f int) {
		// this table is only built for the AVX-512 kernel
		wireFill32(t[c*M+st:c*M+st+f], uint32(s)|uint32(f-1)<<8)
	})
	return t
}

// decodeWide is decodeSyms for m.states states; ent is decodeEntries's
// table, nil where wireDecode32 does not run.
func (m *wireModel) decodeWide(sym []uint8, ent []uint32, dst []uint8, src []byte, w wireShape, lo int) error {
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
	it := w.runIter(m.mode, lo, lo+n)
	kernel := S == wireWideStates && useSIMD && useWireAVX512 && ent != nil
	// rows: the token-axis contexts of modes 2 and 3 repeat every head_dim
	// positions within a head, which the kernel takes many rows at a time.
	rows := kernel && w.fourD && !w.channel && m.mode >= 2 && w.d%16 == 0 && w.d > 0 && w.perHeadRun > 0
	for i := 0; i < n; {
		rn, c0, step := it.next()
		out := dst[i : i+rn]
		row, rstep := c0<<prec, step<<prec
		frow, fstep := c0<<bits, step<<bits
		if rows && rn == w.d && i&15 == 0 {
			r := min(w.perHeadRun-(lo+i)%w.perHeadRun, n-i) / w.d
			g, used := wireDecodeGroups32(ent, dst[i:i+r*w.d], words, p, &st, i, row, rstep, prec, w.d)
			if g > 0 {
				i += 16 * g
				p += used
				it = w.runIter(m.mode, lo+i, lo+n)
				continue
			}
		}
		for k := 0; k < len(out); k++ {
			if (i+k)&15 == 0 && kernel && len(out)-k >= 16 {
				g, used := wireDecodeGroups32(ent, out[k:], words, p, &st, i+k, row, rstep, prec, 0)
				if g > 0 {
					k += 16*g - 1
					p += used
					row, frow = row+16*g*rstep, frow+16*g*fstep
					continue
				}
			}
			j := (i + k) & smask
			x := st[j]
			l := x & mask
			var a uint8
			if ent != nil { // the kernel's table, the same step
				e := ent[row+int(l)]
				a = uint8(e)
				x = (e>>8&0xfff+1)*(x>>prec) + e>>20
			} else {
				a = sym[row+int(l)]
				e := m.fs[frow+int(a)]
				x = (e&0xffff)*(x>>prec) + l - e>>16
			}
			row, frow = row+rstep, frow+fstep
			if x < wireL {
				if p+2 > len(words) {
					return errors.New("stream ends before its symbols")
				}
				x = x<<16 | uint32(words[p]) | uint32(words[p+1])<<8
				p += 2
			}
			st[j] = x
			out[k] = a
		}
		i += rn
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

// wireDecodeGroups32 decodes whole groups of 16 symbols from the start of
// out (position pos of the chunk, a multiple of 16, its contexts' rows of
// ent, decodeEntries's table, at row, stepping by rstep, and back to row
// every period positions, a multiple of 16, if period > 0) with
// wireDecode32, while a group and its 32 bytes of words remain; it returns
// the groups decoded and the bytes of words they took, the states updated
// in st. It checks once that every row the groups can read lies in ent.
func wireDecodeGroups32(ent []uint32, out []uint8, words []byte, p int, st *[wireMaxStates]uint32, pos, row, rstep int, prec uint, period int) (int, int) {
	g := len(out) / 16
	span := 16 * g
	if period > 0 {
		span = min(span, period)
	}
	if g == 0 || period&15 != 0 || p+32 > len(words) || row < 0 || rstep < 0 || row+(span-1)*rstep+1<<prec > len(ent) {
		return 0, 0
	}
	a := wireDecode32Args{ent: &ent[row], out: &out[0], words: &words[p], groups: g,
		last: len(words) - 32 - p, rstep: rstep, prec: uint64(prec), st: st, phase: pos & 16,
		rowGroups: g + 1}
	if period > 0 {
		a.rowGroups, a.back = period/16, 4*period*rstep
	}
	wireDecode32(&a)
	return a.done, a.used
}

// wireDecode32Args are wireDecode32's arguments and results: the table row,
// symbols and words where the groups start, how many groups it may decode
// and how many bytes of words may lie past a group's start (it starts one
// while 32 bytes are left), the row's step (entries a lane), the
// precision, the states (32) and which vector of them decodes the first
// group (0: states 0-15, 16: 16-31); done and used come back; every
// rowGroups groups the row steps back by back bytes.
type wireDecode32Args struct {
	ent             *uint32
	out             *uint8
	words           *byte
	groups, last    int
	rstep           int
	prec            uint64
	st              *[wireMaxStates]uint32
	phase           int
	done, used      int
	rowGroups, back int
}

// wireEnc32Args are wireEncode32's arguments: the frequency row of the
// highest group's first lane and that group's symbols, the words' buffer
// and offset (which comes back), the groups, the lanes' step in fs, the
// states (which come back), which vector codes the first group (16: states
// 16-31), and every rowGroups groups the row steps forward by back bytes;
// the precision.
type wireEnc32Args struct {
	fs        *uint32
	syms      *uint8
	buf       *byte
	wp        int
	groups    int
	step      int
	st        *[wireMaxStates]uint32
	phase     int
	rowGroups int
	back      int
	prec      uint64
}

// wireEncWideArgs are wireEncodeWideAMD64's arguments: as wireEncArgs's,
// with the states in memory (st) and j the index of the state of the
// group's first position (its lowest; the group's states are j..j+3),
// stepping back by 4 modulo jmask+1.
type wireEncWideArgs struct {
	enc    *wireEnc
	syms   *uint8
	buf    *byte
	wp     int
	groups int
	step   int
	st     *uint32
	j      int
	jmask  int
}

// useWireAVX512 selects the AVX-512 coder kernels (wireDecode32,
// wireEncode32) where the CPU has them; tests switch it off to run the
// AVX2-era assembly and Go loops on the same machine.
var useWireAVX512 = haveWireAVX512
