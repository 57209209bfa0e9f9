package compression

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand"
	"os"
	"slices"
	"strings"
	"testing"

	"kvlib/pkg/safetensors"
)

// wireOrder1Codes are b-bit token-axis codes of shape w (batches of heads
// of tq tokens of d channels) with what mode 4 models: a mean per channel
// and tokens that drift slowly in each channel.
func wireOrder1Codes(r *rand.Rand, w wireShape, rho float64) []uint8 {
	return wireOrder1CodesMean(r, w, rho, 1.0/6)
}

func wireOrder1CodesMean(r *rand.Rand, w wireShape, rho, spread float64) []uint8 {
	A := 1 << w.bits
	syms := make([]uint8, w.n)
	mean := make([]float64, w.h*w.d)
	for i := range mean {
		mean[i] = float64(A)/2 + float64(A)*spread*r.NormFloat64()
	}
	x := make([]float64, w.d)
	for i := 0; i < w.n; i += w.d {
		hd := i / w.perHeadRun % w.h
		for c := range x {
			if i%w.perHeadRun == 0 {
				x[c] = 0
			}
			x[c] = rho*x[c] + math.Sqrt(1-rho*rho)*float64(A)/5*r.NormFloat64()
			syms[i+c] = uint8(min(A-1, max(0, int(math.Round(mean[hd*w.d+c]+x[c])))))
		}
	}
	return syms
}

func wireOrder1Shape(h, d, tq, batch, bits int) wireShape {
	w := wireShape{fourD: true, h: h, d: d, tq: tq, bits: bits, perHeadRun: tq * d, n: batch * h * tq * d}
	w.rawBytes = PackedLen(w.n, bits)
	return w
}

// The decode paths of this machine (the AVX-512 kernel and the Go loop on
// its table where there is one, the Go loop on the byte table): the
// symbols and the error of each.
func wireOrder1DecodeAll(m *wireModel, stream []byte, w wireShape, lo, n int) ([][]uint8, []error) {
	defer func() { useSIMD, useWireAVX512 = haveSIMD, haveWireAVX512 }()
	var got [][]uint8
	var errs []error
	decode := func(sym []uint8, ent []uint32) {
		dst := make([]uint8, n)
		err := m.decodeSyms(sym, ent, dst, stream, w, lo)
		got, errs = append(got, dst), append(errs, err)
	}
	if ent := m.decodeEntries(nil); ent != nil {
		decode(nil, ent) // the kernel
		useSIMD = false
		decode(nil, ent) // the Go loop on its table
	}
	decode(m.decodeTable(nil), nil)
	return got, errs
}

// Mode 4 on token-axis shapes: rows of 64 (the kernel's) and of 40 and 96
// channels (the Go loop's, and chunks starting within a row), several
// batches, 4-state parts; chosen where tokens drift, every chunk
// decoding the same on every path, corrupted streams failing alike.
func TestWireOrder1RoundTrip(t *testing.T) {
	defer func() { useSIMD = haveSIMD }()
	r := rand.New(rand.NewSource(17))
	shapes := []wireShape{
		wireOrder1Shape(2, 64, 1100, 1, 2), wireOrder1Shape(3, 40, 700, 1, 4),
		wireOrder1Shape(1, 96, 1000, 2, 3), wireOrder1Shape(2, 8, 50, 1, 2),
		wireOrder1Shape(3, 64, 2048, 1, 4), wireOrder1Shape(2, 16, 100, 3, 1),
	}
	for si, w := range shapes {
		syms := wireOrder1Codes(r, w, 0.9)
		m := buildWireModel(syms, w)
		if m.mode != wireModeOrder1 {
			t.Fatalf("shape %d: mode %d, want 4", si, m.mode)
		}
		for k, size := range m.tableSizes() {
			if size != len(m.tableBytes(k)) {
				t.Fatalf("shape %d: table size %d at order %d, written %d", si, size, k, len(m.tableBytes(k)))
			}
		}
		model := m.marshal()
		if model[0] != wireVersionOrder1 {
			t.Fatalf("shape %d: version %d", si, model[0])
		}
		m2, err := parseWireModel(model, w.bits, w.contexts, w.n)
		if err != nil {
			t.Fatalf("shape %d: %v", si, err)
		}
		if !bytes.Equal(m2.marshal(), model) {
			t.Fatalf("shape %d: the model does not marshal back", si)
		}
		size := len(model)
		for lo := 0; lo < w.n; lo += 1 << m.chunkLog {
			hi := min(w.n, lo+1<<m.chunkLog)
			stream := m.encodeChunk(nil, syms[lo:hi], w, lo, nil)
			useSIMD = false
			goStream := m.encodeChunk(nil, syms[lo:hi], w, lo, nil)
			useSIMD = haveSIMD
			if !bytes.Equal(stream, goStream) {
				t.Fatalf("shape %d chunk %d: the assembly and Go encoders differ", si, lo>>m.chunkLog)
			}
			size += len(stream)
			for trial := 0; trial < 12; trial++ {
				bad := append([]byte(nil), stream...)
				switch {
				case trial == 1:
					bad = bad[:len(bad)-2*(1+r.Intn(len(bad)/4))]
				case trial > 1:
					for k := 0; k < 1+r.Intn(3); k++ {
						bad[r.Intn(len(bad))] ^= byte(1 + r.Intn(255))
					}
				}
				got, errs := wireOrder1DecodeAll(m2, bad, w, lo, hi-lo)
				for v := 1; v < len(got); v++ {
					if fmt.Sprint(errs[0]) != fmt.Sprint(errs[v]) || !bytes.Equal(got[0], got[v]) {
						t.Fatalf("shape %d chunk %d trial %d: path 0 %v, path %d %v", si, lo>>m.chunkLog, trial, errs[0], v, errs[v])
					}
				}
				if trial == 0 && (errs[0] != nil || !bytes.Equal(got[0], syms[lo:hi])) {
					t.Fatalf("shape %d chunk %d: %v", si, lo>>m.chunkLog, errs[0])
				}
			}
		}
		if est := wireEstimate(m, w); math.Abs(est-float64(size)) > 0.02*float64(size)+64 {
			t.Errorf("shape %d: estimated %.0f bytes, coded %d", si, est, size)
		}
	}
}

// Codes with no dependence between tokens nor channel means keep a
// version 2 mode. (With channel means, the previous code tells the
// channel's mean, and mode 4 can pay off on independent tokens.)
func TestWireOrder1NotChosenWithoutGain(t *testing.T) {
	r := rand.New(rand.NewSource(18))
	w := wireOrder1Shape(2, 64, 300, 1, 4)
	syms := wireOrder1CodesMean(r, w, 0, 0)
	if m := buildWireModel(syms, w); m.mode == wireModeOrder1 {
		t.Fatalf("mode 4 chosen for independent tokens")
	}
}

// A mode-4 model that is malformed or for a shape it does not model is
// refused with a one-line error.
func TestWireOrder1RejectsBadModels(t *testing.T) {
	r := rand.New(rand.NewSource(19))
	w := wireOrder1Shape(2, 64, 300, 1, 2)
	m := buildWireModel(wireOrder1Codes(r, w, 0.9), w)
	if m.mode != wireModeOrder1 || m.klog == 0 {
		t.Fatalf("mode %d klog %d", m.mode, m.klog)
	}
	good := m.marshal()
	edit := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	channel := w
	channel.channel = true
	cases := []struct {
		name  string
		model []byte
		w     wireShape
		want  string
	}{
		{"version 2 with mode 4", edit(func(b []byte) []byte { b[0] = 2; return b }), w, "context mode 4 in a version 2"},
		{"version 3 with mode 3", edit(func(b []byte) []byte { b[2] = 3; return b }), w, "context mode 3 in a version 3"},
		{"version 4", edit(func(b []byte) []byte { b[0] = 4; return b }), w, "model version 4"},
		{"klog 4", edit(func(b []byte) []byte { b[8] = 4; return b }), w, "log2 of the classes 4"},
		{"header only", good[:9], w, "class map of 0 bytes"},
		{"no klog", good[:8], w, "want at least 9"},
		{"channel axis", good, channel, "does not model"},
		{"truncated tables", good[:len(good)-3], w, "table"},
	}
	for _, c := range cases {
		_, err := parseWireModel(c.model, 2, c.w.contexts, c.w.n)
		if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
	// the padding bits of a class map: 12 channels of 2 classes in 2 bytes
	w3 := wireOrder1Shape(1, 12, 100, 1, 2)
	m3 := &wireModel{bits: 2, mode: wireModeOrder1, prec: 8, res: 1, chunkLog: wireChunkLog, states: wireStates, nctx: 8, levels: make([]uint8, 32)}
	for i := range m3.levels {
		m3.levels[i] = 1
	}
	m3.setLevels()
	m3.setOrder1(1, 12, 1, []uint8{0, 1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 0})
	b := m3.marshal()
	if _, err := parseWireModel(b, 2, w3.contexts, w3.n); err != nil {
		t.Fatalf("class map: %v", err)
	}
	b[10] |= 0x80
	if _, err := parseWireModel(b, 2, w3.contexts, w3.n); err == nil || !strings.Contains(err.Error(), "padding") {
		t.Errorf("class map padding: %v", err)
	}
}

// Streams of version 2 (no mode 4), written by that code on
// wireCache(41, BF16, 1, 2, 1100, 64) and committed under testdata, still
// decode to the scheme's reconstruction, on the assembly and Go paths.
func TestWireDecodesVersion2Streams(t *testing.T) {
	defer func() { useSIMD, useWireAVX512 = haveSIMD, haveWireAVX512 }()
	src := wireCache(41, safetensors.BF16, 1, 2, 1100, 64)
	for _, name := range []string{"int4", "lm2rot", "rot3"} {
		data, err := os.ReadFile("testdata/wire_v2_" + name + ".kvq")
		if err != nil {
			t.Fatal(err)
		}
		f, err := safetensors.Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		h, err := parseHeader(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, ti := range h.Tensors {
			for _, s := range ti.Wire {
				if m := f.Tensor(ti.Name + s + WireModelSuffix); m == nil || len(m.Data) == 0 || m.Data[0] != 2 {
					t.Fatalf("%s: %s%s is not a version 2 model", name, ti.Name, s)
				}
			}
		}
		spec, _ := ParseSpec(name)
		plain, err := Compress(src, Config{Spec: spec})
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range [][2]bool{{haveSIMD, haveWireAVX512}, {haveSIMD, false}, {false, false}} {
			useSIMD, useWireAVX512 = v[0], v[1]
			back, _, err := Decompress(f, 2)
			if err != nil {
				t.Fatalf("%s %v: %v", name, v, err)
			}
			for i := range back.Tensors {
				if !bytes.Equal(back.Tensors[i].Data, plain.Restored.Tensors[i].Data) {
					t.Fatalf("%s %v: %s decodes differently", name, v, back.Tensors[i].Name)
				}
			}
		}
	}
}

// On the synthetic cache (tokens that drift) the stage picks mode 4 for
// codes, and the file decodes to the scheme's reconstruction.
func TestWireOrder1EndToEnd(t *testing.T) {
	src := wireCache(41, safetensors.BF16, 1, 2, 1100, 64)
	for _, name := range []string{"int4", "lm2rot", "rot3"} {
		spec, _ := ParseSpec(name + "+wire")
		res, err := Compress(src, Config{Spec: spec})
		if err != nil {
			t.Fatal(err)
		}
		v3 := 0
		for _, ts := range res.Compressed.Tensors {
			if strings.HasSuffix(ts.Name, CodesSuffix+WireModelSuffix) && ts.Data[0] == wireVersionOrder1 {
				v3++
			}
		}
		if v3 == 0 {
			t.Errorf("%s: no codes part in mode 4", name)
		}
		back, _, err := Decompress(res.Compressed, 2)
		if err != nil {
			t.Fatal(err)
		}
		for i := range back.Tensors {
			if !bytes.Equal(back.Tensors[i].Data, res.Restored.Tensors[i].Data) {
				t.Fatalf("%s: %s decodes differently", name, back.Tensors[i].Name)
			}
		}
	}
}

// FuzzWireOrder1Decode drives the mode-4 parser and decoder with arbitrary
// bytes: errors on one line, never a panic, a symbol outside the alphabet,
// or two decode paths that disagree.
func FuzzWireOrder1Decode(f *testing.F) {
	r := rand.New(rand.NewSource(20))
	for _, c := range []struct{ h, d, tq, bits int }{{2, 16, 40, 2}, {1, 64, 300, 4}, {2, 48, 200, 3}} {
		w := wireOrder1Shape(c.h, c.d, c.tq, 1, c.bits)
		syms := wireOrder1Codes(r, w, 0.9)
		m := buildWireModel(syms, w)
		if m.mode != wireModeOrder1 {
			f.Fatalf("%+v: mode %d", c, m.mode)
		}
		f.Add(uint8(c.bits-1), uint8(c.h), uint8(c.d), uint16(c.tq), m.marshal(), m.encodeChunk(nil, syms, w, 0, nil))
	}
	f.Fuzz(func(t *testing.T, bits, h, d uint8, tq uint16, model, stream []byte) {
		b := int(bits%8) + 1
		w := wireOrder1Shape(int(h%4)+1, int(d%80)+1, int(tq%400)+1, 1, b)
		m, err := parseWireModel(model, b, w.contexts, w.n)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		n := min(w.n, 1<<m.chunkLog)
		got, errs := wireOrder1DecodeAll(m, stream, w, 0, n)
		for v := range got {
			if fmt.Sprint(errs[0]) != fmt.Sprint(errs[v]) || !bytes.Equal(got[0], got[v]) {
				t.Fatalf("path 0 %v, path %d %v", errs[0], v, errs[v])
			}
			if errs[v] == nil {
				for _, s := range got[v] {
					if int(s) >= 1<<b {
						t.Fatalf("symbol %d out of a %d-bit alphabet", s, b)
					}
				}
			}
		}
	})
}

// The encoder's bytes with mode 4, pinned as TestWireEncoderBytesPinned pins
// the version 2 modes' (on its codes, which run along tokens, mode 4 is
// chosen for most token-axis parts), the same on every coder path.
func TestWireOrder1BytesPinned(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	defer func() { useSIMD, useWireAVX512 = haveSIMD, haveWireAVX512 }()
	const (
		wantCoder  = "0d6ab12fe28ce5286673c954332e393a87d60d5f68d1a6116843564eb38486ba"
		wantStored = "a38ac3e11d76a27dae5cf792c7635d62a98af31a78160741075cd7578591f72b"
	)
	for _, p := range [][2]bool{{haveSIMD, haveWireAVX512}, {haveSIMD, false}, {false, false}} {
		useSIMD, useWireAVX512 = p[0], p[1]
		hc, hs := sha256.New(), sha256.New()
		wirePinCoder(t, hc)
		wirePinStored(t, hs)
		if got := hex.EncodeToString(hc.Sum(nil)); got != wantCoder {
			t.Errorf("path %v: coder streams hash %s, want %s", p, got, wantCoder)
		}
		if got := hex.EncodeToString(hs.Sum(nil)); got != wantStored {
			t.Errorf("path %v: wireStored hash %s, want %s", p, got, wantStored)
		}
	}
}

// The counts per (head, channel, previous code, symbol) are those of a
// position-by-position count, for each code width, with chunk boundaries
// inside rows, odd head_dims (the word loop's tail) and a head of more
// than 65,535 rows (the 16-bit counts' flush).
func TestWireOrder1Counts(t *testing.T) {
	r := rand.New(rand.NewSource(5))
	for _, tc := range []struct{ h, d, tq, batch, bits, chunkLog int }{
		{3, 64, 100, 1, 4, 12}, {2, 24, 50, 2, 4, 9}, {1, 5, 40, 1, 3, 6}, {2, 16, 33, 1, 2, 7},
		{1, 8, 30, 2, 5, 8}, {1, 2, 70000, 1, 4, 22}, {1, 1, 140000, 1, 2, 10},
	} {
		w := wireOrder1Shape(tc.h, tc.d, tc.tq, tc.batch, tc.bits)
		syms := wireOrder1Codes(r, w, 0.9)
		if tc.tq > 1<<16 { // counts past 65,535
			for i := range syms {
				syms[i] = uint8(min(1, i%1000))
			}
		}
		A := 1 << w.bits
		aa := A * A
		if w.bits > 4 {
			aa += 16
		}
		want := make([]uint32, tc.h*tc.d*aa)
		for i, s := range syms {
			hd, c := i/w.perHeadRun%w.h, i%w.d
			prev := A / 2
			if i%w.perHeadRun >= w.d && (i-w.d)>>tc.chunkLog == i>>tc.chunkLog {
				prev = int(syms[i-w.d])
			}
			want[(hd*w.d+c)*aa+prev*A+int(s)]++
		}
		if got := wireOrder1Counts(syms, w, tc.chunkLog, aa); !slices.Equal(got, want) {
			t.Errorf("%+v: counts differ from the position-by-position count", tc)
		}
	}
}
