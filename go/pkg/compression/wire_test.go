package compression

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"math/rand"
	"slices"
	"strings"
	"testing"
	"time"

	"kvlib/pkg/safetensors"
)

// wireCache is a synthetic cache in dtype dt with what the wire stage
// models: per-channel means and scales, as real keys and values have, and
// tokens that drift slowly.
func wireCache(seed int64, dt safetensors.DType, layers, heads, seq, dim int) *safetensors.File {
	r := rand.New(rand.NewSource(seed))
	f := &safetensors.File{Metadata: map[string]string{"model_name": "synthetic"}}
	for l := 0; l < layers; l++ {
		for _, kind := range []string{"key", "value"} {
			chScale, chMean := make([]float64, heads*dim), make([]float64, heads*dim)
			for i := range chScale {
				chScale[i] = 0.2 + r.ExpFloat64()*0.3
				chMean[i] = 1.5 * r.NormFloat64()
			}
			x := make([]float32, heads*seq*dim)
			for h := 0; h < heads; h++ {
				prev := make([]float64, dim)
				for t := 0; t < seq; t++ {
					for d := 0; d < dim; d++ {
						prev[d] = 0.8*prev[d] + 0.6*r.NormFloat64()
						x[(h*seq+t)*dim+d] = float32(chMean[h*dim+d] + prev[d]*chScale[h*dim+d])
					}
				}
			}
			t, err := safetensors.NewFloatTensor(fmt.Sprintf("layer_%d_%s", l, kind), dt, []int{1, heads, seq, dim}, x)
			if err != nil {
				panic(err)
			}
			f.Tensors = append(f.Tensors, t)
		}
	}
	return f
}

// Every preset on every source dtype: the same reconstruction, and the
// codes of every packed scheme wire-coded and smaller than the Huffman stage's.
func TestWireIsBitIdenticalForEveryPreset(t *testing.T) {
	for _, dt := range []safetensors.DType{safetensors.F32, safetensors.F16, safetensors.BF16} {
		src := wireCache(31, dt, 2, 3, 300, 64)
		for _, name := range append(PresetNames(), "k=asym3/g16/channel/out0.01/res5,v=sym5/g32/rot", "lm2/g32/rot/sp0.1", "sym2/g64") {
			t.Run(string(dt)+"/"+name, func(t *testing.T) {
				a, b, hdr := stageCheckSame(t, src, name, WireSuffix)
				spec, _ := ParseSpec(name)
				packed := !spec.Key.Method.IsGGML()
				for _, ti := range hdr.Tensors {
					if len(ti.Wire) > 0 && !packed || name == "int4" && len(ti.Wire) == 0 {
						t.Errorf("%s: wire %v", ti.Name, ti.Wire)
					}
				}
				if b.Report.CompressedSizeBytes >= a.Report.CompressedSizeBytes {
					t.Errorf("sizes: plain %d, wire %d", a.Report.CompressedSizeBytes, b.Report.CompressedSizeBytes)
				}
				if packed {
					l, err := ParseSpec(name + LosslessSuffix)
					if err != nil {
						t.Fatal(err)
					}
					c, err := Compress(src, Config{Spec: l})
					if err != nil {
						t.Fatal(err)
					}
					// never more than the lossless stage's (its size is estimated, hence the margin)
					if float64(b.Report.CompressedSizeBytes) > 1.005*float64(c.Report.CompressedSizeBytes) {
						t.Errorf("wire %d bytes, lossless %d", b.Report.CompressedSizeBytes, c.Report.CompressedSizeBytes)
					}
				}
				if b.Report.Lossless == nil || b.Report.Lossless.WithoutBytes != a.Report.CompressedSizeBytes {
					t.Errorf("report: %+v", b.Report.Lossless)
				}
				if !strings.Contains(name, "=") && !strings.Contains(name, "/") && b.Report.SchemeName != a.Report.SchemeName+WireSuffix {
					t.Errorf("scheme name %q", b.Report.SchemeName)
				}
			})
		}
	}
}

// Empty, short and odd shapes, 1-D tensors and constant tensors (a
// single-symbol alphabet in every context) come back the same.
func TestWireShortEmptyAndConstant(t *testing.T) {
	constant := func(shape []int, v float32) *safetensors.File {
		x := make([]float32, product(shape))
		for i := range x {
			x[i] = v
		}
		k, _ := safetensors.NewFloatTensor("layer_0_key", safetensors.F32, shape, x)
		v2, _ := safetensors.NewFloatTensor("layer_0_value", safetensors.F32, shape, x)
		return &safetensors.File{Tensors: []safetensors.Tensor{k, v2}}
	}
	cases := []struct {
		name string
		src  *safetensors.File
	}{
		{"one token", wireCache(1, safetensors.F32, 1, 2, 1, 64)},
		{"three tokens, head_dim 5", wireCache(2, safetensors.F16, 1, 2, 3, 5)},
		{"no tokens", wireCache(3, safetensors.F32, 1, 2, 0, 64)},
		{"several chunks", wireCache(4, safetensors.BF16, 1, 1, 2100, 64)},
		{"constant", constant([]int{1, 2, 700, 64}, 0.25)},
		{"zeros", constant([]int{1, 2, 64, 64}, 0)},
		{"1-D", constant([]int{1000}, 1)},
	}
	for _, c := range cases {
		for _, name := range []string{"int4", "kivi2", "rot3", "sym8/g64", "k=asym4/g8/channel/res3,v=sym2/g16"} {
			t.Run(c.name+"/"+name, func(t *testing.T) {
				spec, _ := ParseSpec(name)
				if spec.Key.Axis == Channel || spec.Key.Rotate || spec.Key.Residual > 0 || spec.Value.Rotate {
					if sh := c.src.Tensors[0].Shape; len(sh) != 4 || spec.Key.Rotate && sh[3]&(sh[3]-1) != 0 {
						t.Skip("needs a 4-D tensor, a power-of-two head_dim to rotate")
					}
				}
				stageCheckSame(t, c.src, name, WireSuffix)
			})
		}
	}
}

// The coder alone, on every width, context mode and length (the four
// states' tails included), with skewed and single-symbol alphabets.
func TestWireCoderRoundTrip(t *testing.T) {
	r := rand.New(rand.NewSource(5))
	for bits := 1; bits <= 8; bits++ {
		for _, n := range []int{1, 3, 4, 5, 63, 64, 1000, 1 << 16, 1<<16 + 7} {
			for _, skew := range []int{0, 1, 3} {
				w := wireShape{fourD: true, h: 2, d: 8, n: n, bits: bits}
				w.tq = (n + 15) / 16
				w.perHeadRun = w.tq * w.d
				if w.h*w.tq*w.d != n {
					w = wireShape{n: n, bits: bits}
				}
				w.rawBytes = PackedLen(n, bits)
				syms := make([]uint8, n)
				for i := range syms {
					v := r.Intn(1 << bits)
					for k := 0; k < skew; k++ {
						v = min(v, r.Intn(1<<bits))
					}
					if skew == 3 && bits > 1 {
						v = 0 // single-symbol alphabet
					}
					syms[i] = uint8(v)
				}
				m := buildWireModel(syms, w)
				for k, size := range m.tableSizes() {
					if size != len(m.tableBytes(k)) {
						t.Fatalf("bits %d n %d: table size %d at order %d, written %d", bits, n, size, k, len(m.tableBytes(k)))
					}
				}
				stream := m.encodeChunk(nil, syms, w, 0, nil)
				m2, err := parseWireModel(m.marshal(), bits, w.contexts, n)
				if err != nil {
					t.Fatalf("bits %d n %d: model: %v", bits, n, err)
				}
				got := make([]uint8, n)
				if err := m2.decodeChunk(got, stream, w, 0); err != nil {
					t.Fatalf("bits %d n %d skew %d mode %d: %v", bits, n, skew, m.mode, err)
				}
				if !bytes.Equal(got, syms) {
					t.Fatalf("bits %d n %d skew %d: decoded differently", bits, n, skew)
				}
				packed := make([]byte, PackedLen(n, bits))
				wirePack(packed, syms, bits)
				back := make([]uint8, n)
				wireUnpack(back, packed, 0, bits)
				if !bytes.Equal(back, syms) {
					t.Fatalf("bits %d n %d: pack/unpack differ", bits, n)
				}
			}
		}
	}
}

// The run iterator gives the runs of wireShape.run, from any start, for
// token- and channel-axis shapes, every mode, odd head_dims and 1-D codes.
func TestWireRunIter(t *testing.T) {
	shapes := []wireShape{
		{fourD: true, h: 3, d: 64, tq: 40},
		{fourD: true, h: 2, d: 5, tq: 7},
		{fourD: true, channel: true, h: 3, d: 8, tq: 33},
		{fourD: true, h: 1, d: 1, tq: 9},
		{h: 1, d: 1, tq: 100},
	}
	for _, w := range shapes {
		w.n, w.perHeadRun = w.h*w.d*w.tq, w.tq*w.d
		for mode := 0; mode <= 3; mode++ {
			for _, lo := range []int{0, 1, 3, 64, 65, w.n / 2, w.n - 1} {
				for _, hi := range []int{lo + 1, lo + 7, lo + 200, w.n} {
					if lo < 0 || lo >= hi || hi > w.n {
						continue
					}
					it := w.runIter(mode, lo, hi)
					for i := lo; i < hi; {
						n, c0, step := w.run(mode, i, hi)
						gn, gc, gs := it.next()
						if n != gn || c0 != gc || step != gs {
							t.Fatalf("%+v mode %d [%d,%d) at %d: iterator (%d,%d,%d), run (%d,%d,%d)", w, mode, lo, hi, i, gn, gc, gs, n, c0, step)
						}
						i += n
					}
				}
			}
		}
	}
}

// The encoder's step by reciprocal (wireEnc) is the division's, for every
// frequency at the largest precision and states at the edges.
func TestWireEncodeStepExact(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	const prec = 12
	for f := uint32(1); f <= 1<<prec; f++ {
		st := uint32(r.Intn(1<<prec - int(f) + 1))
		m := &wireModel{prec: prec, fs: []uint32{f | st<<16}}
		m.buildEncode()
		e := m.enc[0]
		xmax := uint64(f) << (32 - prec)
		for _, x := range []uint64{wireL, wireL + 1, uint64(f) * 7, xmax - 1, xmax >> 1, 1<<32 - 1, uint64(r.Uint32())} {
			if x < wireL || x > 1<<32-1 {
				continue
			}
			want := x
			if x >= xmax {
				want >>= 16
			}
			got := uint32(want)
			want = want/uint64(f)<<prec + want%uint64(f) + uint64(st)
			if uint64(got) >= e.xmax {
				t.Fatalf("f %d x %d: not renormalized", f, x)
			}
			q, _ := bits.Mul64(uint64(got), e.rcp)
			got += e.bias + uint32(q)*e.cmpl
			if uint64(got) != want {
				t.Fatalf("f %d start %d x %d: %d, want %d", f, st, x, got, want)
			}
		}
	}
}

// The assembly coder loops and the Go ones agree: byte for byte in
// encoding, and symbol for symbol and error for error in decoding valid,
// corrupted and truncated streams.
func TestWireDecodeKernelsAgree(t *testing.T) {
	if !haveSIMD {
		t.Skip("no assembly kernels here")
	}
	defer func() { useSIMD, useWireAVX512 = haveSIMD, haveWireAVX512 }()
	r := rand.New(rand.NewSource(8))
	// token-axis rows of 64 and of 40 channels (not whole groups of 16),
	// channel-axis rows of 300 tokens, and a part small enough for 4 states
	shapes := []wireShape{{fourD: true, h: 2, d: 64, tq: 300}, {fourD: true, h: 3, d: 40, tq: 200},
		{fourD: true, channel: true, h: 2, d: 64, tq: 300}, {fourD: true, h: 2, d: 64, tq: 100}}
	for i, bits := range []int{1, 2, 3, 4, 6, 8, 2, 4, 3, 5, 4, 2} {
		w := shapes[i%len(shapes)]
		w.bits = bits
		w.n, w.perHeadRun = w.h*w.d*w.tq, w.tq*w.d
		syms := make([]uint8, w.n)
		for i := range syms {
			syms[i] = uint8(min(r.Intn(1<<bits), r.Intn(1<<bits), (i%w.d)%(1<<bits)+r.Intn(2)) & (1<<bits - 1))
		}
		m := buildWireModel(syms, w)
		want := wireWideStates
		if w.n < wireWideMin {
			want = wireStates
		}
		if m.states != want {
			t.Fatalf("%d codes: %d states, want %d", w.n, m.states, want)
		}
		// the assembly with AVX-512 where there is, without it (the 4-state
		// groups with the states in memory), and Go
		useSIMD, useWireAVX512 = true, haveWireAVX512
		stream := m.encodeChunk(nil, syms, w, 0, nil)
		useWireAVX512 = false
		if s2 := m.encodeChunk(nil, syms, w, 0, nil); !bytes.Equal(stream, s2) {
			t.Fatalf("bits %d %+v: the assembly encoders with and without AVX-512 differ", bits, w)
		}
		useSIMD = false
		if goStream := m.encodeChunk(nil, syms, w, 0, nil); !bytes.Equal(stream, goStream) {
			t.Fatalf("bits %d %+v: the assembly and Go encoders differ", bits, w)
		}
		for trial := 0; trial < 40; trial++ {
			bad := append([]byte(nil), stream...)
			switch {
			case trial == 1:
				bad = bad[:len(bad)-2*r.Intn(len(bad)/4)]
			case trial > 1:
				for k := 0; k < 1+r.Intn(3); k++ {
					bad[r.Intn(len(bad))] ^= byte(1 + r.Intn(255))
				}
			}
			var got [3][]uint8
			var errs [3]error
			for v, simd := range [][2]bool{{true, haveWireAVX512}, {true, false}, {false, false}} {
				useSIMD, useWireAVX512 = simd[0], simd[1]
				got[v] = make([]uint8, w.n)
				errs[v] = m.decodeChunk(got[v], bad, w, 0)
			}
			for v := 1; v < 3; v++ {
				if fmt.Sprint(errs[0]) != fmt.Sprint(errs[v]) || !bytes.Equal(got[0], got[v]) {
					t.Fatalf("bits %d trial %d: assembly %v, variant %d %v", bits, trial, errs[0], v, errs[v])
				}
			}
			if trial == 0 && (errs[0] != nil || !bytes.Equal(got[0], syms)) {
				t.Fatalf("bits %d: %v", bits, errs[0])
			}
		}
	}
}

// Bad payloads: one-line typed errors naming the tensor and part, never a
// panic or an allocation beyond the declared size.
func TestWireRejectsBadPayloads(t *testing.T) {
	src := wireCache(22, safetensors.F32, 1, 1, 4200, 64) // 268,800 codes: three chunks of 2^17
	spec, _ := ParseSpec("int4+wire")
	res, err := Compress(src, Config{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	name := "layer_0_key" + CodesSuffix
	mutate := func(fn func(c, o, m *safetensors.Tensor)) *safetensors.File {
		f := &safetensors.File{Metadata: res.Compressed.Metadata}
		for _, tn := range res.Compressed.Tensors {
			tn.Data = append([]byte(nil), tn.Data...)
			f.Tensors = append(f.Tensors, tn)
		}
		fn(f.Tensor(name), f.Tensor(name+ChunksSuffix), f.Tensor(name+WireModelSuffix))
		return f
	}
	off := func(t *safetensors.Tensor, c int) uint64 { return binary.LittleEndian.Uint64(t.Data[8*c:]) }
	setOff := func(t *safetensors.Tensor, c int, v uint64) { binary.LittleEndian.PutUint64(t.Data[8*c:], v) }
	tests := []struct {
		name string
		fn   func(c, o, m *safetensors.Tensor)
		want string
	}{
		{"corrupted stream", func(c, o, m *safetensors.Tensor) {
			for i := 20; i < 60; i++ {
				c.Data[i] ^= 0x5a
			}
		}, "chunk 0"},
		{"corrupted state", func(c, o, m *safetensors.Tensor) { c.Data[off(o, 0)+1] ^= 1 }, "chunk 1"},
		{"truncated payload", func(c, o, m *safetensors.Tensor) { c.Data = c.Data[:len(c.Data)-100] }, "past the"},
		{"offsets not ascending", func(c, o, m *safetensors.Tensor) { setOff(o, 1, off(o, 0)) }, "not ascending"},
		{"offset past the end", func(c, o, m *safetensors.Tensor) { setOff(o, 2, 1<<40) }, "past the"},
		{"missing offsets", func(c, o, m *safetensors.Tensor) { o.Data = o.Data[:8] }, "holds 1 offsets, want 3"},
		{"bytes after the last chunk", func(c, o, m *safetensors.Tensor) { c.Data = append(c.Data, 1, 2, 3) }, "3 bytes after its last chunk"},
		{"chunk claims too much", func(c, o, m *safetensors.Tensor) { setOff(o, 0, 16) }, "cannot hold"},
		{"model version", func(c, o, m *safetensors.Tensor) { m.Data[0] = 9 }, "model version 9"},
		{"model width", func(c, o, m *safetensors.Tensor) { m.Data[1] = 3 }, "3-bit codes"},
		{"model mode", func(c, o, m *safetensors.Tensor) { m.Data[2] = 7 }, "context mode 7"},
		{"model precision", func(c, o, m *safetensors.Tensor) { m.Data[3] = 13 }, "precision 13"},
		{"model resolution", func(c, o, m *safetensors.Tensor) { m.Data[4] = 3 }, "resolution 3"},
		{"model chunk size", func(c, o, m *safetensors.Tensor) { m.Data[5] = 40 }, "chunk log 40"},
		{"tables truncated", func(c, o, m *safetensors.Tensor) { m.Data = m.Data[:len(m.Data)/2] }, "table"},
		{"tables extended", func(c, o, m *safetensors.Tensor) { m.Data = append(m.Data, 0, 0) }, "after the tables"},
		{"tables corrupted", func(c, o, m *safetensors.Tensor) {
			for i := wireHeaderSize; i < len(m.Data); i += 3 {
				m.Data[i] ^= 0xff
			}
		}, "wire payload"},
		{"model missing", func(c, o, m *safetensors.Tensor) { m.Name = "other" }, "want .codes (U8)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := mutate(func(c, o, m *safetensors.Tensor) {
				tc.fn(c, o, m)
				c.Shape, o.Shape, m.Shape = []int{len(c.Data)}, []int{len(o.Data) / 8}, []int{len(m.Data)}
			})
			te, err := rejectsWithin(t, f, tc.want)
			if te != nil && te.Tensor != "layer_0_key" {
				t.Errorf("error %q names %s, want layer_0_key", err, te.Tensor)
			}
			if !errors.Is(err, ErrWire) && !strings.Contains(tc.want, "want .codes") {
				t.Errorf("error %q is not ErrWire", err)
			}
		})
	}
	// + lossless and + wire together: one stage only.
	if _, err := ParseSpec("int4+lossless+wire"); err == nil {
		t.Error("int4+lossless+wire parsed")
	}
}

// TestWireRejectsBadScales: a wire-coded scales or zeros part that does
// not decode, or one the scheme does not store, is a one-line ErrWire
// TensorError naming the tensor and the part, before any large allocation.
func TestWireRejectsBadScales(t *testing.T) {
	src := wireCache(23, safetensors.F32, 1, 2, 2048, 64)
	spec, _ := ParseSpec("kivi2+wire")
	res, err := Compress(src, Config{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	h, err := parseHeader(res.Compressed)
	if err != nil {
		t.Fatal(err)
	}
	var tensor, part string
	for _, ti := range h.Tensors {
		for _, s := range ti.Wire {
			if s == ZerosSuffix && tensor == "" {
				tensor, part = ti.Name, s
			}
		}
	}
	if tensor == "" {
		t.Fatal("no scales or zeros part was wire-coded")
	}
	name := tensor + part
	mutate := func(fn func(c, o, m *safetensors.Tensor), meta func(map[string]string)) *safetensors.File {
		f := &safetensors.File{Metadata: map[string]string{}}
		for k, v := range res.Compressed.Metadata {
			f.Metadata[k] = v
		}
		for _, tn := range res.Compressed.Tensors {
			tn.Data = append([]byte(nil), tn.Data...)
			f.Tensors = append(f.Tensors, tn)
		}
		c, o, m := f.Tensor(name), f.Tensor(name+ChunksSuffix), f.Tensor(name+WireModelSuffix)
		fn(c, o, m)
		c.Shape, o.Shape, m.Shape = []int{len(c.Data)}, []int{len(o.Data) / 8}, []int{len(m.Data)}
		if meta != nil {
			meta(f.Metadata)
		}
		return f
	}
	tests := []struct {
		name string
		fn   func(c, o, m *safetensors.Tensor)
		meta func(map[string]string)
		want string
	}{
		{"corrupted stream", func(c, o, m *safetensors.Tensor) {
			for i := 16; i < len(c.Data); i += 2 {
				c.Data[i] ^= 0x5a
			}
		}, nil, part + " chunk 0"},
		{"offset past the end", func(c, o, m *safetensors.Tensor) { binary.LittleEndian.PutUint64(o.Data, 1<<40) }, nil, "past the"},
		{"chunk claims too much", func(c, o, m *safetensors.Tensor) { binary.LittleEndian.PutUint64(o.Data, 16) }, nil, "cannot hold"},
		{"model width", func(c, o, m *safetensors.Tensor) { m.Data[1] = 4 }, nil, part + WireModelSuffix},
		{"tables truncated", func(c, o, m *safetensors.Tensor) { m.Data = m.Data[:wireHeaderSize+1] }, nil, "table"},
		{"a part the scheme lacks", func(c, o, m *safetensors.Tensor) {}, func(md map[string]string) {
			var recs []map[string]any
			if err := json.Unmarshal([]byte(md[metaTensors]), &recs); err != nil {
				t.Fatal(err)
			}
			for _, rec := range recs {
				if rec["name"] == tensor {
					rec["scheme"].(map[string]any)["method"] = "sym" // no zero points
				}
			}
			b, _ := json.Marshal(recs)
			md[metaTensors] = string(b)
		}, "stores no such part"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := mutate(tc.fn, tc.meta)
			if _, err := rejectsWithin(t, f, tc.want); !errors.Is(err, ErrWire) {
				t.Errorf("error %q is not ErrWire", err)
			}
		})
	}
}

// rejectsWithin decompresses f and checks that it fails, allocating no more
// than the memory bound, with a one-line TensorError containing want; it
// returns the error for the caller's own checks.
func rejectsWithin(t *testing.T, f *safetensors.File, want string) (*TensorError, error) {
	t.Helper()
	var err error
	if used := allocated(func() { _, _, err = Decompress(roundTripFile(t, f), 2) }); used > memoryBound(len(c0(f))) {
		t.Errorf("allocated %d bytes", used)
	}
	if err == nil {
		t.Fatal("accepted")
	}
	var te *TensorError
	msg := err.Error()
	if !errors.As(err, &te) || strings.Contains(msg, "\n") || !strings.Contains(msg, want) {
		t.Errorf("error %q, want a one-line TensorError containing %q", msg, want)
	}
	return te, err
}

// FuzzWireF16 drives the model parser and the chunk decoder on the byte
// planes of a scales part: errors, never a panic or a write out of range.
func FuzzWireF16(f *testing.F) {
	r := rand.New(rand.NewSource(10))
	raw := make([]byte, 2*300)
	for i := 0; i < len(raw); i += 2 {
		binary.LittleEndian.PutUint16(raw[i:], 0x2c00+uint16(r.Intn(1024)))
	}
	w := wireF16Shape(300)
	planes := make([]uint8, w.n)
	wireSplitF16(planes, raw)
	m := buildWireModel(planes, w)
	f.Add(m.marshal(), m.encodeChunk(nil, planes, w, 0, nil), uint16(300))
	f.Fuzz(func(t *testing.T, model, stream []byte, nv uint16) {
		w := wireF16Shape(int(nv)%4096 + 1)
		m, err := parseWireModel(model, 8, w.contexts, w.n)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		if len(stream) == 0 || w.n > wireMaxInflation*len(stream) || w.n > 1<<m.chunkLog {
			return
		}
		dst := make([]uint8, w.n)
		if err := m.decodeChunk(dst, stream, w, 0); err == nil {
			back := make([]byte, w.n)
			wireJoinF16(back, dst)
			again := make([]uint8, w.n)
			wireSplitF16(again, back)
			if !bytes.Equal(again, dst) {
				t.Fatal("planes do not round-trip")
			}
		}
	})
}

// c0 is the encoded size of a file, for the allocation bound.
// c0 is the encoded size of a file, for the allocation bound.
func c0(f *safetensors.File) []byte {
	var buf bytes.Buffer
	safetensors.Encode(&buf, f)
	return buf.Bytes()
}

// FuzzWireDecode drives the model parser and the chunk decoder with
// arbitrary bytes: errors, never a panic, an out-of-range write or a
// decode longer than the chunk.
func FuzzWireDecode(f *testing.F) {
	r := rand.New(rand.NewSource(9))
	for _, bits := range []int{2, 4, 8} {
		w := wireShape{fourD: true, h: 2, d: 8, tq: 16, n: 256, bits: bits, perHeadRun: 128}
		syms := make([]uint8, w.n)
		for i := range syms {
			syms[i] = uint8(min(r.Intn(1<<bits), r.Intn(1<<bits)))
		}
		m := buildWireModel(syms, w)
		f.Add(uint8(bits), m.marshal(), m.encodeChunk(nil, syms, w, 0, nil), uint16(w.n))
	}
	// a 32-state model and stream (the AVX-512 decoder's), 17,600 codes
	w := wireShape{fourD: true, h: 2, d: 8, tq: 1100, n: 17600, bits: 3, perHeadRun: 8800}
	syms := make([]uint8, w.n)
	for i := range syms {
		syms[i] = uint8(min(r.Intn(8), r.Intn(8), i%8))
	}
	if m := buildWireModel(syms, w); m.states != wireWideStates {
		f.Fatalf("%d states", m.states)
	} else {
		f.Add(uint8(2), m.marshal(), m.encodeChunk(nil, syms, w, 0, nil), uint16(w.n-1))
	}
	f.Fuzz(func(t *testing.T, bits uint8, model, stream []byte, n uint16) {
		b := int(bits%8) + 1
		w := wireShape{fourD: true, h: 2, d: 8, tq: (int(n) + 15) / 16, bits: b}
		w.n = w.h * w.d * w.tq
		w.perHeadRun = w.tq * w.d
		m, err := parseWireModel(model, b, w.contexts, w.n)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		dst := make([]uint8, w.n)
		if err := m.decodeChunk(dst, stream, w, 0); err == nil {
			for _, s := range dst {
				if int(s) >= 1<<b {
					t.Fatalf("symbol %d out of a %d-bit alphabet", s, b)
				}
			}
		}
	})
}

// FuzzWireDecompress is FuzzDecompress on wire-coded files.
func FuzzWireDecompress(f *testing.F) {
	for _, name := range []string{"int4+wire", "kivi2+wire", "rot3+wire", "k=asym3/g8/channel/res2,v=lm2/g16+wire"} {
		spec, _ := ParseSpec(name)
		res, err := Compress(wireCache(11, safetensors.F16, 1, 2, 40, 32), Config{Spec: spec})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(c0(res.Compressed))
	}
	// 38,400 codes a tensor: 32-state streams
	spec, _ := ParseSpec("lm2rot+wire")
	res, err := Compress(wireCache(12, safetensors.BF16, 1, 2, 300, 64), Config{Spec: spec})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(c0(res.Compressed))
	f.Fuzz(func(t *testing.T, data []byte) {
		parsed, err := safetensors.Parse(data)
		if err != nil {
			return
		}
		var derr error
		if used := allocated(func() { _, _, derr = Decompress(parsed, 2) }); used > memoryBound(len(data)) {
			t.Fatalf("decompress allocated %d bytes for a %d-byte file", used, len(data))
		}
		if derr != nil && strings.Contains(derr.Error(), "\n") {
			t.Fatalf("multi-line error %q", derr)
		}
	})
}

// wireBenchCodes is the benchmark cache's int4 codes, one part per tensor.
func wireBenchParts(b *testing.B, scheme string) (names []string, layouts []*layout, stored [][]safetensors.Tensor, infos []TensorInfo, elems int) {
	spec, err := ParseSpec(scheme)
	if err != nil {
		b.Fatal(err)
	}
	res, err := Compress(benchCache, Config{Spec: spec})
	if err != nil {
		b.Fatal(err)
	}
	hdr, err := ReadHeader(res.Compressed)
	if err != nil {
		b.Fatal(err)
	}
	for _, ti := range hdr.Tensors {
		l, err := newLayout(ti.Shape, ti.Scheme, ti.DType, ti.Rotation)
		if err != nil {
			b.Fatal(err)
		}
		var ts []safetensors.Tensor
		for _, t := range res.Compressed.Tensors {
			if strings.HasPrefix(t.Name, ti.Name+".") {
				ts = append(ts, t)
			}
		}
		names, layouts, stored, infos = append(names, ti.Name), append(layouts, l), append(stored, ts), append(infos, ti)
		elems += ti.NumElements()
	}
	return
}

// BenchmarkWire codes (encode) and decodes (decode) the stored parts of the
// benchmark cache ($KVQ_BENCH_FILE, make bench's real cache) under the
// wire stage, on 2 goroutines; MB/s is of the restored cache as BF16 (2
// bytes an element), "bpe" the coded bits per element (everything counted),
// "x_memcpy" the speed as a fraction of a memcopy of those BF16 bytes (one
// goroutine; wireReportMemcopy), timed in the same benchmark right after
// the coder, so the ratio holds on a loaded machine where MB/s alone does
// not.
func BenchmarkWire(b *testing.B) {
	for _, scheme := range []string{"int4", "kivi2", "rot3", "lm2rot"} {
		names, layouts, stored, infos, elems := wireBenchParts(b, scheme)
		var coded [][]safetensors.Tensor
		var wired, lossless [][]string
		b.Run(scheme+"/encode", func(b *testing.B) {
			b.SetBytes(int64(2 * elems))
			var err error
			for i := 0; i < b.N; i++ {
				if coded, wired, lossless, err = wireStored(names, layouts, stored, 2); err != nil {
					b.Fatal(err)
				}
			}
			wireReportMemcopy(b, 2*elems)
			var size int
			for _, ts := range coded {
				for _, t := range ts {
					size += len(t.Data)
				}
			}
			b.ReportMetric(8*float64(size)/float64(elems), "bpe")
		})
		f := &safetensors.File{}
		for i, ts := range coded {
			f.Tensors = append(f.Tensors, ts...)
			infos[i].Wire, infos[i].Lossless = wired[i], lossless[i]
		}
		b.Run(scheme+"/decode", func(b *testing.B) {
			b.SetBytes(int64(2 * elems))
			for i := 0; i < b.N; i++ {
				view, err := wireInflate(f, infos, 2)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := inflateStored(view, infos, rawPartSize, 2); err != nil {
					b.Fatal(err)
				}
			}
			wireReportMemcopy(b, 2*elems)
		})
	}
}

// wireReportMemcopy times copies of n bytes right after b's loop (at least
// 5, as many as b ran) and reports b's speed as a fraction of the median
// copy's ("x_memcpy"): the median, so that one copy the machine's other
// work slowed does not move the ratio.
func wireReportMemcopy(b *testing.B, n int) {
	perOp := b.Elapsed() / time.Duration(max(b.N, 1))
	b.StopTimer()
	src, dst := make([]byte, n), make([]byte, n)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // fault the pages in
	times := make([]time.Duration, max(b.N, 5))
	for i := range times {
		start := time.Now()
		copy(dst, src)
		times[i] = time.Since(start)
	}
	slices.Sort(times)
	if perOp > 0 {
		b.ReportMetric(float64(times[len(times)/2])/float64(perOp), "x_memcpy")
	}
	b.StartTimer()
}

// An int4 cache through the wire stage: fewer bytes, the same reconstruction.
func ExampleParseSpec_wire() {
	src := wireCache(1, safetensors.F16, 2, 2, 512, 64)
	plain, _ := ParseSpec("int4")
	wire, _ := ParseSpec("int4" + WireSuffix)
	a, _ := Compress(src, Config{Spec: plain})
	b, _ := Compress(src, Config{Spec: wire})
	back, hdr, _ := Decompress(b.Compressed, 2)
	same := true
	for i := range back.Tensors {
		same = same && bytes.Equal(back.Tensors[i].Data, a.Restored.Tensors[i].Data)
	}
	fmt.Println(wire.Name(), hdr.Tensors[0].Wire, hdr.Tensors[0].Lossless, same,
		b.Report.BitsPerElement < a.Report.BitsPerElement)
	// Output: int4+wire [.codes .scales] [] true true
}

// The counts from the packed bytes (wireCountPacked) are those of the codes
// one by one, and so is the model built from them.
func TestWireCountPacked(t *testing.T) {
	r := rand.New(rand.NewSource(12))
	for _, bits := range []int{2, 3, 4} {
		for _, sh := range [][3]int{{3, 64, 100}, {2, 8, 7}, {1, 4, 1}, {5, 16, 33}, {2, 48, 5}} {
			w := wireShape{fourD: true, h: sh[0], d: sh[1], tq: sh[2], bits: bits}
			w.n, w.perHeadRun = 2*w.h*w.d*w.tq, w.tq*w.d // two batch rows
			w.rawBytes = PackedLen(w.n, bits)
			if bits == 3 && w.d%16 != 0 { // 3-bit rows of whole 6-byte groups only
				if wirePackedCounts(w) {
					t.Fatalf("%+v: counted packed", w)
				}
				continue
			}
			if !wirePackedCounts(w) {
				t.Fatalf("%+v: not counted packed", w)
			}
			syms := make([]uint8, w.n)
			for i := range syms {
				syms[i] = uint8(min(r.Intn(1<<bits), (i%w.d+i/w.perHeadRun)%(1<<bits)))
			}
			raw := make([]byte, w.rawBytes)
			wirePack(raw, syms, bits)
			a, b := buildWireModel(syms, w), buildWireModelRaw(nil, raw, w)
			if !bytes.Equal(a.marshal(), b.marshal()) {
				t.Fatalf("bits %d %+v: the packed counts give another model", bits, w)
			}
			want := make([]uint32, w.h*w.d<<bits)
			for i, s := range syms {
				want[((i/w.perHeadRun%w.h)*w.d+i%w.d)<<bits|int(s)]++
			}
			got := make([]uint32, len(want))
			wireCountPacked(got, raw, w)
			if !slices.Equal(got, want) {
				t.Fatalf("bits %d %+v: counts differ", bits, w)
			}
		}
	}
}

// Channel-axis rows (kivi's keys) counted from their packed bytes: the
// counts and the model of the codes one by one.
func TestWireCountPackedRows(t *testing.T) {
	r := rand.New(rand.NewSource(15))
	for _, bits := range []int{2, 4} {
		for _, sh := range [][3]int{{3, 64, 100}, {2, 8, 8}, {1, 4, 4}, {5, 16, 36}, {2, 3, 6}} {
			w := wireShape{fourD: true, channel: true, h: sh[0], d: sh[1], tq: sh[2], bits: bits}
			w.n, w.perHeadRun = 2*w.h*w.d*w.tq, w.tq*w.d // two batch rows
			w.rawBytes = PackedLen(w.n, bits)
			if packed := wirePackedCounts(w); packed != (w.tq%(8/bits) == 0) {
				t.Fatalf("%+v: counted packed %v", w, packed)
			} else if !packed {
				continue
			}
			syms := make([]uint8, w.n)
			for i := range syms {
				syms[i] = uint8(min(r.Intn(1<<bits), (i/w.tq+i%7)%(1<<bits)))
			}
			raw := make([]byte, w.rawBytes)
			wirePack(raw, syms, bits)
			a, b := buildWireModel(syms, w), buildWireModelRaw(nil, raw, w)
			if !bytes.Equal(a.marshal(), b.marshal()) {
				t.Fatalf("bits %d %+v: the packed counts give another model", bits, w)
			}
			want := make([]uint32, w.h*w.d<<bits)
			for i, s := range syms {
				want[(i/w.tq%(w.h*w.d))<<bits|int(s)]++
			}
			got := make([]uint32, len(want))
			wireCountPacked(got, raw, w)
			if !slices.Equal(got, want) {
				t.Fatalf("bits %d %+v: counts differ", bits, w)
			}
		}
	}
}

// wireUnpack from any multiple of 8, every width and length, is the codes.
func TestWireUnpack(t *testing.T) {
	r := rand.New(rand.NewSource(13))
	for bits := 1; bits <= 8; bits++ {
		for _, n := range []int{0, 1, 7, 8, 9, 15, 16, 17, 31, 64, 100, 1001} {
			syms := make([]uint8, n)
			for i := range syms {
				syms[i] = uint8(r.Intn(1 << bits))
			}
			packed := make([]byte, PackedLen(n, bits))
			wirePack(packed, syms, bits)
			for _, lo := range []int{0, 8, 16, 64} {
				if lo > n {
					continue
				}
				got := make([]uint8, n-lo)
				wireUnpack(got, packed, lo, bits)
				if !bytes.Equal(got, syms[lo:]) {
					t.Fatalf("bits %d n %d lo %d: unpacked differently", bits, n, lo)
				}
			}
		}
	}
}

// Whole files through the three coder paths on this machine (the AVX-512
// kernels, the assembly without them, the Go loops): the same bytes
// written, the same reconstruction read, each path reading the others'.
func TestWirePathsAgree(t *testing.T) {
	defer func() { useSIMD, useWireAVX512 = haveSIMD, haveWireAVX512 }()
	src := wireCache(17, safetensors.BF16, 1, 3, 400, 64) // 76,800 codes a tensor: 32 states
	paths := [][2]bool{{haveSIMD, haveWireAVX512}, {haveSIMD, false}, {false, false}}
	for _, name := range []string{"int4", "kivi2", "rot3", "lm2rot", "k=asym3/g8/channel/res2,v=sym5/g32"} {
		spec, err := ParseSpec(name + WireSuffix)
		if err != nil {
			t.Fatal(err)
		}
		var files [][]byte
		for _, p := range paths {
			useSIMD, useWireAVX512 = p[0], p[1]
			res, err := Compress(src, Config{Spec: spec})
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, c0(res.Compressed))
		}
		for i := 1; i < len(files); i++ {
			if !bytes.Equal(files[0], files[i]) {
				t.Fatalf("%s: path %v writes other bytes than %v", name, paths[i], paths[0])
			}
		}
		var want [][]byte
		for i, p := range paths {
			useSIMD, useWireAVX512 = p[0], p[1]
			f, err := safetensors.Parse(files[0])
			if err != nil {
				t.Fatal(err)
			}
			back, _, err := Decompress(f, 2)
			if err != nil {
				t.Fatalf("%s: path %v: %v", name, p, err)
			}
			for k, tn := range back.Tensors {
				if i == 0 {
					want = append(want, tn.Data)
				} else if !bytes.Equal(tn.Data, want[k]) {
					t.Fatalf("%s: path %v reads %s differently", name, p, tn.Name)
				}
			}
		}
	}
}

// Channel-axis 2- and 4-bit key codes (kivi's), whose neighbours along
// tokens share a byte, go as their packed bytes (a model of 8-bit symbols):
// the same reconstruction on every path, and a model that claims bytes
// where the stream is not is refused in one line.
func TestWireCodesAsBytes(t *testing.T) {
	defer func() { useSIMD, useWireAVX512 = haveSIMD, haveWireAVX512 }()
	src := wireCache(5, safetensors.F16, 1, 3, 2048, 64)
	for _, name := range []string{"kivi2", "kivi4"} {
		for _, p := range [][2]bool{{haveSIMD, haveWireAVX512}, {haveSIMD, false}, {false, false}} {
			useSIMD, useWireAVX512 = p[0], p[1]
			_, b, hdr := stageCheckSame(t, src, name, WireSuffix)
			m := b.Compressed.Tensor("layer_0_key" + CodesSuffix + WireModelSuffix)
			if m == nil || m.Data[0] != wireVersion || m.Data[1] != 8 || hdr.Tensors[0].Scheme.Bits >= 8 {
				t.Fatalf("%s: layer_0_key's codes are not coded as bytes", name)
			}
		}
	}
	// the value codes' model (contexts) read as bytes: a one-line ErrWire
	spec, _ := ParseSpec("kivi2+wire")
	res, err := Compress(src, Config{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	f := &safetensors.File{Metadata: res.Compressed.Metadata}
	for _, tn := range res.Compressed.Tensors {
		tn.Data = append([]byte(nil), tn.Data...)
		f.Tensors = append(f.Tensors, tn)
	}
	f.Tensor("layer_0_value" + CodesSuffix + WireModelSuffix).Data[1] = 8
	if _, err := rejectsWithin(t, f, "layer_0_value"); !errors.Is(err, ErrWire) {
		t.Errorf("error %q is not ErrWire", err)
	}
	// rows that are not whole bytes: one context
	if s := wireByteShape(wireShape{fourD: true, channel: true, h: 2, d: 4, tq: 7, n: 56, bits: 4, rawBytes: 28}); s.fourD || s.n != 28 {
		t.Errorf("byte shape %+v", s)
	}
}

// wirePack of every width and length is Pack's bytes.
func TestWirePack(t *testing.T) {
	r := rand.New(rand.NewSource(14))
	for bits := 1; bits <= 8; bits++ {
		for _, n := range []int{0, 1, 7, 8, 9, 15, 16, 17, 24, 31, 64, 100, 1001} {
			syms := make([]uint8, n)
			for i := range syms {
				syms[i] = uint8(r.Intn(1 << bits))
			}
			got, want := make([]byte, PackedLen(n, bits)), make([]byte, PackedLen(n, bits))
			wirePack(got, syms, bits)
			Pack(want, asInt8(syms), bits)
			if !bytes.Equal(got, want) {
				t.Fatalf("bits %d n %d: packed differently", bits, n)
			}
		}
	}
}
