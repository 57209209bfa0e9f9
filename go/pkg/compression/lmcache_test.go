package compression

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"math/rand"
	"os"
	"strings"
	"testing"

	"kvlib/pkg/safetensors"
)

// lmcacheVectorsPath is the shared test-vector file of the LMCache
// formats, made by tests/make_lmcache_vectors.py from
// tests/lmcache_reference.py, which tests/test_lmcache_formats.py checks
// against LMCache 0.5.6's own code.
const lmcacheVectorsPath = "../../../tests/vectors/lmcache_vectors.json"

type lmcacheVectors struct {
	EngineVersion string `json:"engine_version"`
	Cases         []struct {
		Name    string `json:"name"`
		Spec    string `json:"spec"`
		Error   string `json:"error"`
		Tensors []struct {
			v2Tensor
			Saturated int64 `json:"saturated"`
			Bins      int   `json:"bins"`
		} `json:"tensors"`
	} `json:"cases"`
}

func loadLMCacheVectors(t testing.TB) *lmcacheVectors {
	t.Helper()
	data, err := os.ReadFile(lmcacheVectorsPath)
	if err != nil {
		t.Fatalf("LMCache test vectors: %v", err)
	}
	var v lmcacheVectors
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Cases) < 30 || v.EngineVersion != lmcache.version {
		t.Fatalf("%d cases, version %q", len(v.Cases), v.EngineVersion)
	}
	return &v
}

// TestLMCacheVectors: whole caches through Compress and Decompress give the
// reference's bytes (LMCache's own, tests/test_lmcache_formats.py): every
// CacheGen bitstream, length, CDF and maximum, the fp8 codes, kivi's
// identity; the reconstruction, the saturated counts, the bins; the same
// refusals.
func TestLMCacheVectors(t *testing.T) {
	for _, vc := range loadLMCacheVectors(t).Cases {
		t.Run(vc.Name, func(t *testing.T) {
			vs := make([]v2Tensor, len(vc.Tensors))
			for i, tv := range vc.Tensors {
				vs[i] = tv.v2Tensor
			}
			res := compressCodesCase(t, vc.Spec, vs, vc.Error)
			if res == nil {
				return
			}
			for i, tv := range vc.Tensors {
				tr := res.Report.Tensors[i]
				if tr.Saturated != tv.Saturated || tr.Bins != tv.Bins || tr.CompressedSizeBytes != int64(len(tv.Parts[CodesSuffix])/2) {
					t.Errorf("%s: saturated %d bins %d size %d, want %d, %d, %d", tv.Name, tr.Saturated, tr.Bins, tr.CompressedSizeBytes,
						tv.Saturated, tv.Bins, len(tv.Parts[CodesSuffix])/2)
				}
			}
			back := lmcacheRoundTrip(t, res)
			for i := range back.Tensors {
				if !bytes.Equal(back.Tensors[i].Data, res.Restored.Tensors[i].Data) {
					t.Errorf("%s: Decompress differs from Compress's reconstruction", back.Tensors[i].Name)
				}
			}
		})
	}
}

// TestLMCacheVectorsPortable runs the cases with the assembly kernels off.
func TestLMCacheVectorsPortable(t *testing.T) {
	withPortable(func() { TestLMCacheVectors(t) })
}

// lmcacheRoundTrip writes the compressed file, parses it and decompresses it.
func lmcacheRoundTrip(t testing.TB, res *Result) *safetensors.File {
	t.Helper()
	var buf bytes.Buffer
	if err := safetensors.Encode(&buf, res.Compressed); err != nil {
		t.Fatal(err)
	}
	parsed, err := safetensors.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	back, _, err := Decompress(parsed, 2)
	if err != nil {
		t.Fatal(err)
	}
	return back
}

// CacheGenConfig.from_model_name's bins, naive_serde/cachegen_basics.py:84-129.
func TestCacheGenBins(t *testing.T) {
	names := func(layers int) []string {
		var out []string
		for l := 0; l < layers; l++ {
			out = append(out, "layer_"+itoa(l)+"_key", "layer_"+itoa(l)+"_value")
		}
		return out
	}
	for _, tc := range []struct {
		layers, layer int
		role          string
		want          int
	}{
		{1, 0, "key", 32}, {1, 0, "value", 32}, {9, 8, "value", 32}, {9, 8, "key", 32},
		{10, 9, "key", 32}, {10, 9, "value", 16}, {10, 1, "value", 32}, {10, 2, "value", 16},
		{32, 10, "key", 16}, {32, 31, "key", 16}, {32, 0, "value", 32}, {40, 39, "value", 16}, {40, 9, "key", 32},
	} {
		got, err := cacheGenBins("layer_"+itoa(tc.layer)+"_"+tc.role, names(tc.layers))
		if err != nil || got != tc.want {
			t.Errorf("%d layers, layer %d %s: %d %v, want %d", tc.layers, tc.layer, tc.role, got, err, tc.want)
		}
	}
	// the layer count is the cache's largest layer + 1, whatever is missing below it
	if got, _ := cacheGenBins("layer_3_value", []string{"layer_3_value", "layer_11_key"}); got != 16 {
		t.Errorf("12 layers by the largest index: %d", got)
	}
	if _, err := cacheGenBins("t", []string{"t"}); err == nil || !strings.Contains(err.Error(), "layer_{i}_key") {
		t.Errorf("unnamed tensor: %v", err)
	}
}

func itoa(i int) string { return string(mustJSON(i)) }

func mustJSON(v any) []byte { b, _ := json.Marshal(v); return b }

// The quantizer's arithmetic, element by element (cachegen_encoder.py:61-68):
// float32 product, then the +MAX offset, then round half to even; NaN and
// Inf give symbol 0 (CPU torch's int8 cast).
func TestCacheGenSymbol(t *testing.T) {
	inf := float32(math.Inf(1))
	for _, tc := range []struct {
		x, factor, mx float32
		want          uint8
	}{
		{1, 0.5, 15, 16}, {3, 0.5, 15, 16}, {-1, 0.5, 15, 14}, {-3, 0.5, 15, 14}, {30, 0.5, 15, 30}, {-30, 0.5, 15, 0},
		{5, 0.5, 15, 18}, {0.5, 1, 7, 8}, {1.5, 1, 7, 8}, {-0.5, 1, 7, 6}, {2.5, 1, 7, 10},
		{0, inf, 15, 0}, {1e-39, inf, 15, 0}, {-1e-39, inf, 15, 0}, {0, 15, 15, 15},
		{3e38, 15 / 3e38, 15, 30}, {float32(math.NaN()), 1, 15, 0},
	} {
		if got := cacheGenSymbol(tc.x, tc.factor, tc.mx); got != tc.want {
			t.Errorf("symbol(%g, %g, %g) = %d, want %d", tc.x, tc.factor, tc.mx, got, tc.want)
		}
	}
}

// The coder: any symbols under the CDF of their own counts decode back,
// the stream is the shortest the termination allows, and 256 symbols never
// take more than LMCache's 256-byte buffer (at most about 160 bytes).
func TestCacheGenCoderRoundTrip(t *testing.T) {
	r := rand.New(rand.NewSource(5))
	longest := 0
	for trial := 0; trial < 3000; trial++ {
		n := 1 + r.Intn(cacheGenChunk)
		if trial%3 == 0 {
			n = cacheGenChunk
		}
		levels := []int{31, 15, 2, 1}[trial%4]
		syms := make([]uint8, n)
		for i := range syms {
			switch trial % 5 {
			case 0: // uniform: the most a stream can cost
				syms[i] = uint8(r.Intn(levels))
			case 1: // one symbol, a single other one
				syms[i] = 15
			default:
				syms[i] = uint8(min(levels-1, int(math.Abs(r.NormFloat64()*3))))
			}
		}
		if trial%5 == 1 {
			syms[r.Intn(n)] = uint8(r.Intn(levels))
		}
		var hist [cacheGenNB]int
		for _, s := range syms {
			hist[s]++
		}
		var cdf [cacheGenLp]uint16
		cacheGenCDF(&cdf, &hist)
		if cdf[0] != 0 || cdf[cacheGenNB] != 0xFFFF {
			t.Fatalf("cdf ends %d %d", cdf[0], cdf[cacheGenNB])
		}
		stream := cacheGenEncodeStream(nil, syms, &cdf)
		longest = max(longest, len(stream))
		back := make([]uint8, n)
		cacheGenDecodeStream(back, stream, &cdf)
		if !bytes.Equal(back, syms) {
			t.Fatalf("trial %d: %v decodes as %v", trial, syms, back)
		}
		// whatever follows the stream (the numba decoder reads its successor's bytes), the symbols are the same
		cacheGenDecodeStream(back, append(append([]byte{}, stream...), 0xff, 0xa5, 0x5a, 0xff), &cdf)
		if !bytes.Equal(back, syms) {
			t.Fatalf("trial %d: trailing bytes change the symbols", trial)
		}
	}
	if longest > 170 || longest < 100 {
		t.Errorf("longest stream %d bytes, want about 160 (<= 256)", longest)
	}
}

// A known stream: calculate_cdf and _encode_single_channel of LMCache
// 0.5.6 on these 8 symbols (tests/test_lmcache_formats.py::
// test_known_stream_is_lmcaches runs them, numba or not).
func TestCacheGenKnownStream(t *testing.T) {
	syms := []uint8{15, 15, 16, 14, 15, 30, 0, 15}
	var hist [cacheGenNB]int
	for _, s := range syms {
		hist[s]++
	}
	var cdf [cacheGenLp]uint16
	cacheGenCDF(&cdf, &hist)
	want := [cacheGenLp]uint16{0, 8188, 8189, 8190, 8191, 8192, 8193, 8194, 8195, 8196, 8197, 8198, 8199, 8200, 8201, 16390,
		49143, 57332, 57333, 57334, 57335, 57336, 57337, 57338, 57339, 57340, 57341, 57342, 57343, 57344, 57345, 65534, 65535}
	if cdf != want {
		t.Errorf("cdf %v\nwant %v", cdf, want)
	}
	if stream := cacheGenEncodeStream(nil, syms, &cdf); hex.EncodeToString(stream) != "91a800" {
		t.Errorf("stream %x, want 91a800", stream)
	}
}

// Specs: the formats' spellings, their refusals in one line, and
// asym_k16_v8, which LMCache 0.5.6 does not register.
func TestLMCacheSpecs(t *testing.T) {
	for _, tc := range []struct{ in, canon string }{
		{"lmcache:fp8", "lmcache:fp8"},
		{"lmcache:kivi", "lmcache:kivi"},
		{"lmcache:cachegen", "lmcache:cachegen"},
		{"k=lmcache:cachegen,v=lmcache:fp8", "k=lmcache:cachegen,v=lmcache:fp8"},
		{"lmcache:cachegen,kv0=none", "lmcache:cachegen,k0=none,v0=none"},
		{`{"key": {"method": "lmcache:cachegen"}, "value": {"method": "lmcache:kivi"}}`, "k=lmcache:cachegen,v=lmcache:kivi"},
		{"lmcache:fp8+lossless", "lmcache:fp8+lossless"},
	} {
		s, err := ParseSpec(tc.in)
		if err != nil || s.String() != tc.canon {
			t.Errorf("%s: %v %v, want %s", tc.in, s, err, tc.canon)
			continue
		}
		if again, err := ParseSpec(s.String()); err != nil || !again.Equal(s) {
			t.Errorf("%s does not round-trip: %v", s, err)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"lmcache:asym_k16_v8", "lmcache:asym_k16_v8 is not registered in LMCache 0.5.6"},
		{"k=lmcache:fp8,v=lmcache:asym_k16_v8", "is not registered in LMCache 0.5.6"},
		{"lmcache:turboquant", `lmcache has no KV-cache format "turboquant" (its formats: fp8, kivi, cachegen)`},
		{"lmcache:cachegen+lossless", "lmcache:cachegen is entropy-coded by the engine's own coder: it takes no +lossless"},
		{"int4,kv3=lmcache:cachegen+lossless", "it takes no +lossless"},
		{"lmcache:cachegen/rot", "never rotated"},
		{"lmcache:fp8/scale2", "computes its own scales"},
		{"lmcache:cachegen/g64", "got bits 5 group 64"},
		{"lmcache:kivi/out0.1", "takes no outliers"},
	} {
		_, err := ParseSpec(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error %v, want one line containing %q", tc.in, err, tc.want)
		}
	}
	rows, err := EngineReport("lmcache")
	if err != nil || len(rows) != 3 {
		t.Fatalf("%d rows, %v", len(rows), err)
	}
	for i, r := range rows {
		if r.Format != []string{"fp8", "kivi", "cachegen"}[i] || r.Evidence != EvidenceExecuted || r.Source == "" ||
			!strings.Contains(r.EngineVersion, "0.5.6") || !strings.HasPrefix(r.EvidenceDetail, "executed") {
			t.Errorf("row %d: %+v", i, r)
		}
	}
	if rows[0].KeyBits != 8 || rows[1].KeyBits != 16 || math.Abs(rows[2].KeyBits-(2.1875+math.Log2(31))) > 1e-12 {
		t.Errorf("bits %g %g %g", rows[0].KeyBits, rows[1].KeyBits, rows[2].KeyBits)
	}
	if rows[2].Flags != "remote_serde: cachegen (LMCACHE_REMOTE_SERDE=cachegen, with a remote_url)" || !strings.Contains(rows[0].Flags, `"serde": {"type": "fp8"}`) {
		t.Errorf("flags %q %q", rows[0].Flags, rows[2].Flags)
	}
}

// cacheGenFile is a compressed BF16 cache of two layers (256 + 3 tokens,
// two heads of 64) under lmcache:cachegen, encoded as a file.
func cacheGenFile(t testing.TB) ([]byte, *Result) { return cacheGenFileOf(t, 2, 259, 64) }

// cacheGenFileOf is cacheGenFile with other heads, tokens and head_dim.
func cacheGenFileOf(t testing.TB, heads, tokens, hd int) ([]byte, *Result) {
	t.Helper()
	src := randomCache(21, 2, heads, tokens, hd)
	for i := range src.Tensors {
		x, _ := src.Tensors[i].Float32s(nil)
		src.Tensors[i], _ = safetensors.NewFloatTensor(src.Tensors[i].Name, safetensors.BF16, src.Tensors[i].Shape, x)
	}
	spec, _ := ParseSpec("lmcache:cachegen")
	res, err := Compress(src, Config{Spec: spec, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := safetensors.Encode(&buf, res.Compressed); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), res
}

// withCodes is the compressed file with layer_0_key.codes replaced.
func withCodes(t testing.TB, file []byte, codes []byte, meta func(map[string]string)) *safetensors.File {
	t.Helper()
	f, err := safetensors.Parse(file)
	if err != nil {
		t.Fatal(err)
	}
	out := &safetensors.File{Metadata: map[string]string{}}
	for k, v := range f.Metadata {
		out.Metadata[k] = v
	}
	if meta != nil {
		meta(out.Metadata)
	}
	for _, tn := range f.Tensors {
		if tn.Name == "layer_0_key"+CodesSuffix && codes != nil {
			tn.Data, tn.Shape = codes, []int{len(codes)}
		}
		out.Tensors = append(out.Tensors, tn)
	}
	return out
}

// A truncated or corrupted CacheGen part is refused in one line, a typed
// error naming the tensor, never a panic, within the memory its data
// supports; a file that decodes gives finite values.
func TestCacheGenHostileStreams(t *testing.T) {
	file, res := cacheGenFile(t)
	codes := res.Compressed.Tensor("layer_0_key" + CodesSuffix).Data
	// the first chunk's regions: 256 maxima (bf16), 128 CDFs, 128 lengths, then the streams
	const c = 128
	maxAt, cdfAt, lenAt, streamAt := 0, 2*256, 2*256+66*c, 2*256+70*c
	mutate := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), codes...)) }
	put32 := func(b []byte, at int, v uint32) []byte { binary.LittleEndian.PutUint32(b[at:], v); return b }
	cases := []struct {
		name  string
		codes []byte
		meta  func(map[string]string)
		want  string // "" accepts a clean decode too
	}{
		{"truncated by one byte", codes[:len(codes)-1], nil, "CacheGen stream"},
		{"truncated to the first chunk", codes[:len(codes)/2], nil, "want"},
		{"one byte more", append(append([]byte(nil), codes...), 0), nil, "after the last chunk"},
		{"empty", []byte{}, nil, "want"},
		{"NaN maximum", mutate(func(b []byte) []byte { b[maxAt], b[maxAt+1] = 0xc0, 0x7f; return b }), nil, "not a finite |x|"},
		{"negative maximum", mutate(func(b []byte) []byte { b[maxAt+3] |= 0x80; return b }), nil, "not a finite |x|"},
		{"infinite maximum", mutate(func(b []byte) []byte { b[maxAt+2], b[maxAt+3] = 0x80, 0x7f; return b }), nil, "not a finite |x|"},
		{"CDF entry changed", mutate(func(b []byte) []byte { b[cdfAt+2*5] ^= 1; return b }), nil, "CDF's counts"},
		{"CDF reversed", mutate(func(b []byte) []byte { b[cdfAt+2*3], b[cdfAt+2*3+1] = 0xff, 0xff; return b }), nil, "CacheGen stream"},
		{"length 0", mutate(func(b []byte) []byte { return put32(b, lenAt, 0) }), nil, "stream length 0"},
		{"length 257", mutate(func(b []byte) []byte { return put32(b, lenAt, 257) }), nil, "stream length 257"},
		{"length 2^32-1", mutate(func(b []byte) []byte { return put32(b, lenAt+4*7, 0xffffffff) }), nil, "stream length"},
		{"lengths shifted", mutate(func(b []byte) []byte {
			v := binary.LittleEndian.Uint32(b[lenAt:])
			put32(b, lenAt, v+1)
			return put32(b, lenAt+4, binary.LittleEndian.Uint32(b[lenAt+4:])-1)
		}), nil, "CacheGen stream"},
		{"stream byte flipped", mutate(func(b []byte) []byte { b[streamAt+3] ^= 0x10; return b }), nil, "CacheGen stream"},
		{"stream's last byte flipped", mutate(func(b []byte) []byte {
			n := binary.LittleEndian.Uint32(b[lenAt:])
			b[streamAt+int(n)-1] ^= 0x01
			return b
		}), nil, "CacheGen stream"},
		{"bins 7", nil, func(m map[string]string) {
			m[metaTensors] = strings.Replace(m[metaTensors], `"bins":32`, `"bins":7`, 1)
		}, "bins 7"},
		{"bins missing", nil, func(m map[string]string) { m[metaTensors] = strings.Replace(m[metaTensors], `,"bins":32`, ``, 1) }, "bins 0"},
		{"bins 16 for a 32-bin tensor", nil, func(m map[string]string) {
			m[metaTensors] = strings.Replace(m[metaTensors], `"bins":32`, `"bins":16`, 1)
		}, "past bins 16"},
		{"bins on another scheme", nil, func(m map[string]string) {
			m[metaTensors] = strings.Replace(m[metaTensors], `"method":"lmcache:cachegen","bits":5`, `"method":"lmcache:fp8","bits":8`, 1)
		}, "bins 32 recorded for scheme lmcache:fp8, which has none"},
		{"shape claims more tokens", nil, func(m map[string]string) {
			m[metaTensors] = strings.Replace(m[metaTensors], `[1,2,259,64]`, `[1,2,1000000,64]`, 1)
		}, "want"},
		{"shape claims fewer tokens", nil, func(m map[string]string) {
			m[metaTensors] = strings.Replace(m[metaTensors], `[1,2,259,64]`, `[1,2,258,64]`, 1)
		}, "CacheGen stream"},
		{"shape claims 2^40 tokens", nil, func(m map[string]string) { // refused at once: the size check is closed-form
			m[metaTensors] = strings.Replace(m[metaTensors], `[1,2,259,64]`, `[1,1,1099511627776,1]`, 1)
		}, "want"},
		{"3-D shape", nil, func(m map[string]string) {
			m[metaTensors] = strings.Replace(m[metaTensors], `[1,2,259,64]`, `[2,259,64]`, 1)
		}, "needs a 4-D"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := withCodes(t, file, tc.codes, tc.meta)
			var back *safetensors.File
			var err error
			used := allocated(func() { back, _, err = Decompress(f, 2) })
			if used > memoryBound(len(file)) {
				t.Errorf("allocated %d bytes for a %d-byte file", used, len(file))
			}
			if err == nil {
				if tc.want != "" {
					t.Fatalf("accepted, want an error containing %q", tc.want)
				}
				for _, tn := range back.Tensors {
					x, _ := tn.Float32s(nil)
					if i := firstNonFinite(x); i >= 0 {
						t.Fatalf("%s: element %d decoded as %v", tn.Name, i, x[i])
					}
				}
				return
			}
			var te *TensorError
			if !errors.As(err, &te) || te.Tensor != "layer_0_key" || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want a one-line *TensorError on layer_0_key containing %q", err, tc.want)
			}
			if strings.Contains(tc.want, "CacheGen") && !errors.Is(err, ErrCacheGen) {
				t.Errorf("error %v is not ErrCacheGen", err)
			}
		})
	}
	// the untouched file decodes to Compress's reconstruction
	f, _ := safetensors.Parse(file)
	back, _, err := Decompress(f, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i := range back.Tensors {
		if !bytes.Equal(back.Tensors[i].Data, res.Restored.Tensors[i].Data) {
			t.Errorf("%s decompresses differently", back.Tensors[i].Name)
		}
	}
}

// The stored bytes, part by part, against the formula of LMCache's payload
// (docs/kv-compress/format.md): per chunk n·e maxima, 132·C CDF, 4·C
// lengths and the streams; and bits_per_element counts all of it.
func TestCacheGenStoredSize(t *testing.T) {
	_, res := cacheGenFile(t)
	for _, tr := range res.Report.Tensors {
		codes := res.Compressed.Tensor(tr.Name + CodesSuffix).Data
		streams := 0
		p := codes
		for _, n := range []int{256, 3} {
			fixed := n*2 + 128*(66+4)
			for ch := 0; ch < 128; ch++ {
				streams += int(binary.LittleEndian.Uint32(p[n*2+128*66+4*ch:]))
			}
			p = p[fixed+streams:]
			if tr.CompressedSizeBytes != int64(len(codes)) {
				t.Errorf("%s: reported %d bytes, stored %d", tr.Name, tr.CompressedSizeBytes, len(codes))
			}
			streams = 0
		}
		if len(p) != 0 {
			t.Errorf("%s: %d bytes unaccounted for", tr.Name, len(p))
		}
		if len(tr.HeadSums) != 2 || tr.Bins != 32 {
			t.Errorf("%s: %d heads, bins %d", tr.Name, len(tr.HeadSums), tr.Bins)
		}
	}
}

// FuzzCacheGenDecompress feeds mutated CacheGen parts to the decoder: it
// may refuse them, in one line, but never panics or allocates beyond what
// the file supports, and what it accepts is finite.
func FuzzCacheGenDecompress(f *testing.F) {
	file, res := cacheGenFileOf(f, 1, 260, 4) // small, for many runs: two chunks of 4 channels
	codes := res.Compressed.Tensor("layer_0_key" + CodesSuffix).Data
	f.Add(codes[:len(codes)-5], uint16(0), uint8(0))
	f.Add(codes, uint16(3), uint8(0x40))   // a maximum
	f.Add(codes, uint16(530), uint8(1))    // a CDF
	f.Add(codes, uint16(780), uint8(0x80)) // a length, or a stream
	f.Fuzz(func(t *testing.T, data []byte, at uint16, flip uint8) {
		b := append([]byte(nil), data...)
		if len(b) > 0 {
			b[int(at)%len(b)] ^= flip
		}
		ff := withCodes(t, file, b, nil)
		var back *safetensors.File
		var err error
		if used := allocated(func() { back, _, err = Decompress(ff, 2) }); used > memoryBound(len(file)+len(b)) {
			t.Fatalf("allocated %d bytes", used)
		}
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error of more than one line: %v", err)
			}
			return
		}
		for _, tn := range back.Tensors {
			x, _ := tn.Float32s(nil)
			if i := firstNonFinite(x); i >= 0 {
				t.Fatalf("%s: element %d decoded as %v", tn.Name, i, x[i])
			}
		}
	})
}

// FuzzLMCacheCompress: caches of any shape, dtype and values through the
// LMCache formats: whatever compresses decompresses to exactly the
// restored bytes, CacheGen's streams are all LMCache's (each under 256
// bytes), and the only errors are the refusals.
func FuzzLMCacheCompress(f *testing.F) {
	f.Add(uint8(1), uint8(2), uint16(3), uint8(64), uint8(2), uint8(0), []byte("0123456789abcdef"))
	f.Add(uint8(2), uint8(1), uint16(300), uint8(8), uint8(2), uint8(2), bytes.Repeat([]byte{0xff, 0x7b, 0x00, 0x3c}, 60))
	f.Add(uint8(1), uint8(3), uint16(1), uint8(1), uint8(0), uint8(1), bytes.Repeat([]byte{1, 0, 0, 0x80}, 99))
	f.Add(uint8(1), uint8(1), uint16(5), uint8(16), uint8(2), uint8(0), []byte{0, 0, 0, 0, 0, 0, 0x80, 0x80})
	f.Fuzz(func(t *testing.T, b, h uint8, tok uint16, d, specIdx, dtIdx uint8, values []byte) {
		dt := []safetensors.DType{safetensors.F32, safetensors.F16, safetensors.BF16}[int(dtIdx)%3]
		shape := []int{int(b%2) + 1, int(h%3) + 1, int(tok % 600), int(d%130) + 1}
		n := product(shape)
		if n > 1<<16 {
			return
		}
		data := make([]byte, n*dt.Size())
		for i := 0; i < len(data) && len(values) > 0; i += len(values) {
			copy(data[i:], values)
		}
		src := &safetensors.File{Tensors: []safetensors.Tensor{
			{Name: "layer_0_key", DType: dt, Shape: shape, Data: data},
			{Name: "layer_0_value", DType: dt, Shape: shape, Data: data},
		}}
		spec, _ := ParseSpec([]string{"lmcache:fp8", "lmcache:kivi", "lmcache:cachegen", "k=lmcache:cachegen,v=lmcache:fp8"}[int(specIdx)%4])
		var res *Result
		var err error
		if used := allocated(func() { res, err = Compress(src, Config{Spec: spec, Workers: 2}) }); used > memoryBound(2*len(data)) {
			t.Fatalf("compress allocated %d bytes for %d bytes", used, 2*len(data))
		}
		if err != nil {
			if !strings.Contains(err.Error(), "NaN or Inf cannot be quantized") {
				t.Fatalf("%s %v %s: %v", spec, shape, dt, err)
			}
			return
		}
		back := lmcacheRoundTrip(t, res)
		for i := range back.Tensors {
			if !bytes.Equal(back.Tensors[i].Data, res.Restored.Tensors[i].Data) {
				t.Fatalf("%s %v %s: %s decompresses differently", spec, shape, dt, back.Tensors[i].Name)
			}
		}
	})
}

// fp8 and kivi take the lossless stage, which changes the file, never the
// reconstruction (CacheGen refuses it: TestLMCacheSpecs).
func TestLMCacheLossless(t *testing.T) {
	src := randomCache(9, 2, 2, 40, 64)
	for _, name := range []string{"lmcache:fp8", "lmcache:kivi", "k=lmcache:cachegen,v=lmcache:kivi"} {
		plain, _ := ParseSpec(name)
		with := plain
		with.Lossless = plain.Key.Method != "lmcache:cachegen"
		a, err := Compress(src, Config{Spec: plain, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		b, err := Compress(src, Config{Spec: with, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		back := lmcacheRoundTrip(t, b)
		for i := range back.Tensors {
			if !bytes.Equal(back.Tensors[i].Data, a.Restored.Tensors[i].Data) {
				t.Errorf("%s: %s decompresses differently with +lossless", name, back.Tensors[i].Name)
			}
		}
	}
}

// cacheGenEncodeStreamRef appends the arithmetic code of syms to dst:
// _encode_single_channel (cachegen_kernels.py:11-98, LMCache 0.5.6), the
// 32-bit coder of csrc/cuda/ac_enc.cu's encode_with_accessor_kernel. A
// symbol s codes as [cdf[s], cdf[s+1]) of 2^16, the last one (31) as
// [cdf[31], 2^16); bits MSB first, the last byte padded with zeros.
func cacheGenEncodeStreamRef(dst []byte, syms []uint8, cdf *[cacheGenLp]uint16) []byte {
	low, high := uint32(0), uint32(0xFFFFFFFF)
	pending := 0
	var reg uint32
	regLen := 0
	emit := func(bit uint32) {
		reg = reg<<1 | bit
		if regLen++; regLen == 8 {
			dst = append(dst, byte(reg))
			reg, regLen = 0, 0
		}
	}
	for _, s := range syms {
		span := uint64(high) - uint64(low) + 1
		cl, ch := uint64(cdf[s]), uint64(0x10000)
		if int(s) != cacheGenLp-2 {
			ch = uint64(cdf[s+1])
		}
		high = uint32(uint64(low) + span*ch>>16 - 1)
		low = uint32(uint64(low) + span*cl>>16)
		for {
			if high&0x80000000 == low&0x80000000 {
				bit := high >> 31
				emit(bit)
				for ; pending > 0; pending-- {
					emit(1 - bit)
				}
				low, high = low<<1, high<<1|1
			} else if low&0x40000000 != 0 && high&0x40000000 == 0 {
				pending++
				low, high = low<<1&0x7FFFFFFF, high<<1|0x80000001
			} else {
				break
			}
		}
	}
	pending++
	bit := low >> 30 & 1
	emit(bit)
	for ; pending > 0; pending-- {
		emit(1 - bit)
	}
	if regLen > 0 {
		dst = append(dst, byte(reg<<(8-regLen)))
	}
	return dst
}

// cacheGenDecodeStreamRef decodes len(out) symbols from the stream b:
// _decode_single_channel (cachegen_kernels.py:131-213, LMCache 0.5.6;
// csrc/ac_dec.cu's decode_prefix_with_accessor_kernel), bytes past the
// stream read as 0 as the CUDA kernel reads them. (The numba port starts
// from the 4 bytes at the stream's offset whatever its length, so a stream
// shorter than 4 bytes reads its successor's first bytes: the coder's
// termination leaves the value inside the last interval whatever follows,
// and the symbols are the same, as the tests check on LMCache's own run.)
func cacheGenDecodeStreamRef(out []uint8, b []byte, cdf *[cacheGenLp]uint16) {
	at := func(i int) uint32 {
		if i < len(b) {
			return uint32(b[i])
		}
		return 0
	}
	value := at(0)<<24 | at(1)<<16 | at(2)<<8 | at(3)
	low, high := uint32(0), uint32(0xFFFFFFFF)
	off, bitIdx := 4, 1
	buf := at(off)
	for i := range out {
		span := uint64(high) - uint64(low) + 1
		count := ((uint64(value-low)+1)*0x10000 - 1) / span & 0xFFFF
		left, right := 0, cacheGenLp-1
		for left+1 < right {
			m := (left + right) / 2
			if c := uint64(cdf[m]); c < count {
				left = m
			} else if c > count {
				right = m
			} else {
				left = m
				break
			}
		}
		out[i] = uint8(left)
		if i == len(out)-1 {
			break
		}
		cl, ch := uint64(cdf[left]), uint64(0x10000)
		if left != cacheGenLp-2 {
			ch = uint64(cdf[left+1])
		}
		high = uint32(uint64(low) + span*ch>>16 - 1)
		low = uint32(uint64(low) + span*cl>>16)
		for {
			if low >= 0x80000000 || high < 0x80000000 {
				low, high = low<<1, high<<1|1
			} else if low >= 0x40000000 && high < 0xC0000000 {
				value -= 0x40000000
				low, high = low<<1&0x7FFFFFFF, high<<1|0x80000001
			} else {
				break
			}
			value = value<<1 | buf>>(8-bitIdx)&1
			if bitIdx++; bitIdx == 9 {
				bitIdx, off = 1, off+1
				buf = at(off)
			}
		}
	}
}

// The stream coders against the kernel's loop as written
// (cacheGenEncodeStreamRef, cacheGenDecodeStreamRef): the same bytes and
// symbols on random, skewed and extreme CDFs (a symbol of one count in
// 65503, the widest underflow runs), every length.
func TestCacheGenCoderMatchesKernelLoop(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	for trial := 0; trial < 20000; trial++ {
		n := 1 + r.Intn(cacheGenChunk)
		syms := make([]uint8, n)
		var hist [cacheGenNB]int
		switch trial % 4 {
		case 0: // uniform over some levels
			lv := 1 + r.Intn(cacheGenNB)
			for i := range syms {
				syms[i] = uint8(r.Intn(lv))
			}
		case 1: // one symbol nearly always, rare others anywhere
			for i := range syms {
				syms[i] = 15
				if r.Intn(64) == 0 {
					syms[i] = uint8(r.Intn(cacheGenNB))
				}
			}
		case 2: // Gaussian around the middle
			for i := range syms {
				syms[i] = uint8(min(31, max(0, 15+int(r.NormFloat64()*4))))
			}
		default: // the extremes only
			for i := range syms {
				syms[i] = uint8([]int{0, 31}[r.Intn(2)])
			}
		}
		for _, s := range syms {
			hist[s]++
		}
		var cdf [cacheGenLp]uint16
		cacheGenCDF(&cdf, &hist)
		if !cacheGenCDFValid(&cdf) {
			t.Fatalf("trial %d: calculate_cdf's cdf %v is not valid", trial, cdf)
		}
		want := cacheGenEncodeStreamRef(nil, syms, &cdf)
		got := cacheGenEncodeStream(nil, syms, &cdf)
		if !bytes.Equal(got, want) {
			t.Fatalf("trial %d: stream %x, the kernel's loop writes %x", trial, got, want)
		}
		tail := append(append([]byte{}, want...), byte(r.Intn(256)), byte(r.Intn(256)), byte(r.Intn(256)))
		for _, b := range [][]byte{want, tail, want[:max(0, len(want)-1)]} {
			a, c := make([]uint8, n), make([]uint8, n)
			cacheGenDecodeStream(a, b, &cdf)
			cacheGenDecodeStreamRef(c, b, &cdf)
			if !bytes.Equal(a, c) {
				t.Fatalf("trial %d: decodes %x as %v, the kernel's loop as %v", trial, b, a, c)
			}
		}
	}
}

// Any bytes decode as the kernel's loop decodes them (a hostile stream
// under a valid CDF).
func FuzzCacheGenDecodeStream(f *testing.F) {
	f.Add([]byte{0x91, 0xa8, 0x00}, uint8(8), int64(1))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x00}, uint8(200), int64(2))
	f.Fuzz(func(t *testing.T, b []byte, n uint8, seed int64) {
		r := rand.New(rand.NewSource(seed))
		var hist [cacheGenNB]int
		for i := 0; i < 1+int(n); i++ {
			hist[r.Intn(1+r.Intn(cacheGenNB))]++
		}
		var cdf [cacheGenLp]uint16
		cacheGenCDF(&cdf, &hist)
		a, c := make([]uint8, 1+int(n)), make([]uint8, 1+int(n))
		cacheGenDecodeStream(a, b, &cdf)
		cacheGenDecodeStreamRef(c, b, &cdf)
		if !bytes.Equal(a, c) {
			t.Fatalf("decodes %x as %v, the kernel's loop as %v", b, a, c)
		}
	})
}
