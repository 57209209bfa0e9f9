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

// vectorsPath is the test-vector file shared with the Python tests.
const vectorsPath = "../../../tests/vectors/kvq_vectors.json"

type vectorCase struct {
	Name        string            `json:"name"`
	Bits        int               `json:"bits"`
	GroupSize   int               `json:"group_size"`
	DType       safetensors.DType `json:"dtype"`
	Shape       []int             `json:"shape"`
	InputHex    string            `json:"input_hex"`
	Codes       []int8            `json:"codes"`
	ScalesF16   []uint16          `json:"scales_f16"`
	PackedHex   string            `json:"packed_hex"`
	RestoredHex string            `json:"restored_hex"`
	Error       string            `json:"error"`
}

func loadVectors(t *testing.T) []vectorCase {
	t.Helper()
	data, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatalf("shared test vectors: %v", err)
	}
	var v struct{ Cases []vectorCase }
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Cases) < 10 {
		t.Fatalf("only %d vector cases", len(v.Cases))
	}
	return v.Cases
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSharedVectors(t *testing.T) {
	for _, vc := range loadVectors(t) {
		t.Run(vc.Name, func(t *testing.T) {
			src := &safetensors.File{Tensors: []safetensors.Tensor{{Name: "t", DType: vc.DType, Shape: vc.Shape, Data: mustHex(t, vc.InputHex)}}}
			res, err := Compress(src, symConfig(vc.Bits, vc.GroupSize, 0))
			if vc.Error != "" {
				if err == nil || !strings.Contains(err.Error(), vc.Error) || !strings.Contains(err.Error(), `tensor "t"`) {
					t.Fatalf("error = %v, want one naming the tensor and containing %q", err, vc.Error)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Compressed.Tensor("t" + CodesSuffix).Data; !bytes.Equal(got, mustHex(t, vc.PackedHex)) {
				t.Errorf("packed codes differ from the reference\n got %x\nwant %s", got, vc.PackedHex)
			}
			scales := res.Compressed.Tensor("t" + ScalesSuffix).Data
			for i, want := range vc.ScalesF16 {
				if got := binary.LittleEndian.Uint16(scales[2*i:]); got != want {
					t.Errorf("scale %d = %#04x, want %#04x", i, got, want)
				}
			}
			if got := res.Restored.Tensors[0].Data; !bytes.Equal(got, mustHex(t, vc.RestoredHex)) {
				t.Errorf("reconstruction differs from the reference")
			}
			// The codes themselves, group by group.
			x, _ := src.Tensors[0].Float32s(nil)
			q := make([]int8, len(x))
			for lo := 0; lo < len(x); lo += vc.GroupSize {
				hi := min(lo+vc.GroupSize, len(x))
				if _, err := QuantizeGroup(x[lo:hi], vc.Bits, q[lo:hi]); err != nil {
					t.Fatal(err)
				}
			}
			for i := range q {
				if q[i] != vc.Codes[i] {
					t.Fatalf("code %d = %d, want %d", i, q[i], vc.Codes[i])
				}
			}
			// Decompress of the packed form gives the same bytes as roundtrip.
			back, _, err := Decompress(res.Compressed, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back.Tensors[0].Data, res.Restored.Tensors[0].Data) {
				t.Error("Decompress differs from Compress's reconstruction")
			}
		})
	}
}

// symConfig is a sym scheme for both roles with the default gates.
func symConfig(bits, group int, sparsity float64) Config {
	s := Scheme{Method: Sym, Bits: bits, Group: group, Axis: Token, Sparsity: sparsity}
	return Config{Spec: Spec{Key: s, Value: s}, Thresholds: DefaultThresholds}
}

func TestRoundMagicMatchesRoundToEven(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 1_000_000; i++ {
		v := float32(r.NormFloat64() * 40)
		if i%3 == 0 {
			v = float32(math.Round(float64(v)*2) / 2) // exact halves
		}
		got := (v + roundMagic) - roundMagic
		if want := float32(math.RoundToEven(float64(v))); got != want {
			t.Fatalf("round(%v) = %v, want %v", v, got, want)
		}
	}
}

func TestPackUnpackAllWidths(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	for bits := MinBits; bits <= MaxBits; bits++ {
		for _, n := range []int{0, 1, 2, 3, 7, 8, 9, 63, 64, 65, 1001} {
			codes := make([]int8, n)
			lo, hi := -(1 << (bits - 1)), 1<<(bits-1)-1
			for i := range codes {
				codes[i] = int8(lo + r.Intn(hi-lo+1))
			}
			if n > 1 {
				codes[0], codes[n-1] = int8(lo), int8(hi)
			}
			buf := make([]byte, PackedLen(n, bits))
			Pack(buf, codes, bits)
			back := make([]int8, n)
			Unpack(back, buf, bits)
			for i := range codes {
				if back[i] != codes[i] {
					t.Fatalf("bits %d n %d: code %d = %d, want %d", bits, n, i, back[i], codes[i])
				}
			}
		}
	}
	// Layout: 4-bit codes, first in the low nibble.
	buf := make([]byte, 2)
	Pack(buf, []int8{1, -1, 7}, 4)
	if buf[0] != 0xf1 || buf[1] != 0x07 {
		t.Errorf("4-bit layout = %x, want f107", buf)
	}
}

func TestSparsify(t *testing.T) {
	tests := []struct {
		in   []float32
		p    float64
		want []float32
	}{
		{[]float32{5, -1, 3, -2}, 0.5, []float32{5, 0, 3, 0}},
		{[]float32{1, 1, 1, 1}, 0.5, []float32{0, 0, 1, 1}}, // ties in index order
		{[]float32{4, -3, 2}, 0, []float32{4, -3, 2}},
		{[]float32{4, -3, 2}, 0.34, []float32{4, -3, 0}},
	}
	for _, tc := range tests {
		x := append([]float32(nil), tc.in...)
		if err := Sparsify(x, tc.p); err != nil {
			t.Fatal(err)
		}
		for i := range x {
			if x[i] != tc.want[i] {
				t.Errorf("Sparsify(%v, %g) = %v, want %v", tc.in, tc.p, x, tc.want)
				break
			}
		}
	}
	if err := Sparsify([]float32{1}, 1); err == nil {
		t.Error("sparsity 1 accepted")
	}
}

func TestMetrics(t *testing.T) {
	var a Accumulator
	a.Add([]float32{3, 4}, []float32{3, 4})
	if a.RMSE() != 0 || !math.IsInf(a.SNRDB(), 1) || a.Cosine() != 1 {
		t.Errorf("exact: rmse %g snr %g cos %g", a.RMSE(), a.SNRDB(), a.Cosine())
	}
	var b Accumulator
	b.Add([]float32{1, 0, 0, 0}, []float32{0, 0, 0, 0})
	if b.RMSE() != 0.5 || b.SNRDB() != 0 || b.Cosine() != 0 || b.MaxError != 1 {
		t.Errorf("zeroed: rmse %g snr %g cos %g max %g", b.RMSE(), b.SNRDB(), b.Cosine(), b.MaxError)
	}
	// Pooling is over elements, not a mean of per-part values.
	var pooled Accumulator
	pooled.Merge(&a)
	pooled.Merge(&b)
	if want := math.Sqrt(1.0 / 6); math.Abs(pooled.RMSE()-want) > 1e-15 {
		t.Errorf("pooled rmse %g, want %g", pooled.RMSE(), want)
	}
	if want := 10 * math.Log10(26.0/1); math.Abs(pooled.SNRDB()-want) > 1e-12 {
		t.Errorf("pooled snr %g, want %g", pooled.SNRDB(), want)
	}
	var h Accumulator
	h.Add([]float32{0, 0, 0, 0}, []float32{0, 0x1p-20, 0.75, 1000})
	edges := HistogramEdges()
	want := map[int]int64{0: 1, 1: 1, 20: 1, HistBins - 1: 1}
	for i, c := range h.Hist {
		if c != want[i] {
			t.Errorf("bin %d [%g, %g) = %d, want %d", i, edges[i], edges[i+1], c, want[i])
		}
	}
}

func TestQualityLevelAndViolations(t *testing.T) {
	tests := []struct {
		rmse, snr float64
		want      string
	}{
		{0.005, 45, Excellent}, {0.005, 35, Good}, {0.04, 31, Good}, {0.04, 25, Acceptable}, {0.09, 18.5, Acceptable},
		{0.2, 50, Poor}, {0.01, 17, Poor}, {0.01, math.Inf(1), Good}, {0.005, math.Inf(1), Excellent},
	}
	for _, tc := range tests {
		if got := QualityLevel(tc.rmse, tc.snr); got != tc.want {
			t.Errorf("QualityLevel(%g, %g) = %s, want %s", tc.rmse, tc.snr, got, tc.want)
		}
	}
	var b Accumulator
	b.Add([]float32{1, 0, 0, 0}, []float32{0, 0, 0, 0})
	if v := DefaultThresholds.Violations(&b); len(v) != 3 {
		t.Errorf("violations %v, want 3", v)
	}
}

func randomCache(seed int64, layers, heads, seq, dim int) *safetensors.File {
	r := rand.New(rand.NewSource(seed))
	f := &safetensors.File{Metadata: map[string]string{"model_name": "synthetic"}}
	for l := 0; l < layers; l++ {
		for _, kind := range []string{"key", "value"} {
			x := make([]float32, heads*seq*dim)
			for i := range x {
				scale := 0.5
				if kind == "key" && i%dim < 4 {
					scale = 6 // outlier channels, as real keys have
				}
				x[i] = float32(r.NormFloat64() * scale)
			}
			t, _ := safetensors.NewFloatTensor("layer_"+string(rune('0'+l))+"_"+kind, safetensors.F32, []int{1, heads, seq, dim}, x)
			f.Tensors = append(f.Tensors, t)
		}
	}
	return f
}

func TestCompressDecompressFile(t *testing.T) {
	src := randomCache(3, 3, 4, 50, 64)
	res, err := Compress(src, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := safetensors.Encode(&buf, res.Compressed); err != nil {
		t.Fatal(err)
	}
	if int64(buf.Len()) != res.Report.CompressedFileBytes {
		t.Errorf("compressed_file_bytes %d, file is %d", res.Report.CompressedFileBytes, buf.Len())
	}
	parsed, err := safetensors.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	back, hdr, err := Decompress(parsed, 2)
	if err != nil {
		t.Fatal(err)
	}
	if hdr.Spec != "sym4/g64" || hdr.Version != 2 || back.Metadata["model_name"] != "synthetic" {
		t.Errorf("header %+v metadata %v", hdr, back.Metadata)
	}
	for i := range back.Tensors {
		if !bytes.Equal(back.Tensors[i].Data, res.Restored.Tensors[i].Data) {
			t.Errorf("tensor %s: decompress != roundtrip", back.Tensors[i].Name)
		}
	}
	rep := res.Report
	n := int64(3 * 2 * 4 * 50 * 64)
	if rep.NumElements != n || rep.OriginalSizeBytes != 2*n || rep.SourceSizeBytes != 4*n {
		t.Errorf("sizes %+v", rep)
	}
	if want := n/2 + n/64*2; rep.CompressedSizeBytes != want {
		t.Errorf("compressed_size_bytes %d, want %d", rep.CompressedSizeBytes, want)
	}
	if math.Abs(rep.CompressionRatio-16/4.25) > 1e-12 || rep.BitsPerElement != 4.25 {
		t.Errorf("ratio %g bits/elem %g", rep.CompressionRatio, rep.BitsPerElement)
	}
	if len(rep.Tensors) != 6 || len(rep.Tensors[0].HeadSNRDB) != 4 || len(rep.Tensors[0].ErrorHistogram) != HistBins {
		t.Fatalf("per-tensor report shape wrong: %+v", rep.Tensors[0])
	}
	var hist int64
	for _, c := range rep.Tensors[0].ErrorHistogram {
		hist += c
	}
	if hist != rep.Tensors[0].NumElements {
		t.Errorf("histogram counts %d of %d elements", hist, rep.Tensors[0].NumElements)
	}
	// Gaussian data at 4 bits / 64: about 19-21 dB; keys with outlier channels worse.
	if s := float64(rep.SNRDB); s < 12 || s > 25 {
		t.Errorf("snr %g dB out of the plausible range", s)
	}
}

func TestCompressIsDeterministicAcrossWorkers(t *testing.T) {
	src := randomCache(4, 2, 3, 700, 64)
	var first []byte
	for _, w := range []int{1, 2, 7} {
		cfg := DefaultConfig()
		cfg.Workers = w
		res, err := Compress(src, cfg)
		if err != nil {
			t.Fatal(err)
		}
		js, _ := json.Marshal(res.Report)
		var buf bytes.Buffer
		safetensors.Encode(&buf, res.Compressed)
		got := append(js, buf.Bytes()...)
		if first == nil {
			first = got
		} else if !bytes.Equal(first, got) {
			t.Fatalf("workers=%d gives a different result", w)
		}
	}
}

func TestCompressRejects(t *testing.T) {
	nan, _ := safetensors.NewFloatTensor("layer_3_key", safetensors.F32, []int{4}, []float32{1, float32(math.NaN()), 2, 3})
	inf, _ := safetensors.NewFloatTensor("layer_4_value", safetensors.F32, []int{2}, []float32{1, float32(math.Inf(-1))})
	ints := safetensors.Tensor{Name: "ids", DType: safetensors.I64, Shape: []int{1}, Data: make([]byte, 8)}
	ok, _ := safetensors.NewFloatTensor("ok", safetensors.F32, []int{2}, []float32{1, 2})
	done, _ := Measure(&safetensors.File{Tensors: []safetensors.Tensor{ok}}, DefaultConfig())
	tests := []struct {
		name string
		file *safetensors.File
		cfg  Config
		want string
	}{
		{"nan", &safetensors.File{Tensors: []safetensors.Tensor{nan}}, DefaultConfig(), `tensor "layer_3_key": element 1 is NaN`},
		{"inf", &safetensors.File{Tensors: []safetensors.Tensor{inf}}, DefaultConfig(), `tensor "layer_4_value": element 1 is -Inf`},
		{"int dtype", &safetensors.File{Tensors: []safetensors.Tensor{ints}}, DefaultConfig(), `tensor "ids": dtype I64`},
		{"bits 1", &safetensors.File{}, symConfig(1, 64, 0), "bits 1 out of range"},
		{"bits 9", &safetensors.File{}, symConfig(9, 64, 0), "bits 9 out of range"},
		{"odd group", &safetensors.File{}, symConfig(4, 63, 0), "group size 63"},
		{"zero group", &safetensors.File{}, symConfig(4, 0, 0), "group size 0"},
		{"sparsity", &safetensors.File{}, symConfig(4, 64, 1), "sparsity 1"},
		{"already compressed", done.Compressed, DefaultConfig(), "already kvq-compressed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compress(tc.file, tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want %q", err, tc.want)
			}
		})
	}
	_, err := Compress(&safetensors.File{Tensors: []safetensors.Tensor{{Name: "big", DType: safetensors.F32, Shape: []int{1}, Data: binary.LittleEndian.AppendUint32(nil, math.Float32bits(1e9))}}}, DefaultConfig())
	if !errors.Is(err, ErrScaleOverflow) || !strings.Contains(err.Error(), `tensor "big"`) {
		t.Errorf("overflow error = %v", err)
	}
}

func TestDecompressRejects(t *testing.T) {
	src := randomCache(5, 1, 2, 10, 64)
	res, _ := Measure(src, DefaultConfig())
	mutate := func(fn func(f *safetensors.File)) *safetensors.File {
		f := &safetensors.File{Metadata: map[string]string{}}
		for k, v := range res.Compressed.Metadata {
			f.Metadata[k] = v
		}
		for _, t := range res.Compressed.Tensors {
			t.Data = append([]byte(nil), t.Data...)
			f.Tensors = append(f.Tensors, t)
		}
		fn(f)
		return f
	}
	tests := []struct {
		name string
		file *safetensors.File
		want string
	}{
		{"plain file", src, "not a kvq-compressed file"},
		{"version", mutate(func(f *safetensors.File) { f.Metadata["kvq.version"] = "9" }), "unsupported kvq version"},
		{"bits", mutate(func(f *safetensors.File) {
			f.Metadata["kvq.tensors"] = strings.Replace(f.Metadata["kvq.tensors"], `"bits":4`, `"bits":12`, 1)
		}), `tensor "layer_0_key": scheme: bits 12`},
		{"v1 bits", mutate(func(f *safetensors.File) {
			f.Metadata["kvq.version"], f.Metadata["kvq.bits"], f.Metadata["kvq.group_size"], f.Metadata["kvq.sparsity"] = "1", "12", "64", "0"
		}), "bits 12"},
		{"tensors json", mutate(func(f *safetensors.File) { f.Metadata["kvq.tensors"] = "[" }), "kvq.tensors"},
		{"missing codes", mutate(func(f *safetensors.File) { f.Tensors = f.Tensors[1:] }), `tensor "layer_0_key": .codes is missing`},
		{"short codes", mutate(func(f *safetensors.File) {
			f.Tensors[0].Data = f.Tensors[0].Data[:10]
			f.Tensors[0].Shape = []int{10}
		}), `tensor "layer_0_key": .codes is 10 bytes of U8, want 640`},
		{"inf scale", mutate(func(f *safetensors.File) { f.Tensors[1].Data[0], f.Tensors[1].Data[1] = 0x00, 0x7c }), `tensor "layer_0_key": group 0: scale is not finite`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Decompress(tc.file, 0)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestSparsityIsMeasuredAgainstTheOriginal(t *testing.T) {
	src := randomCache(6, 1, 2, 64, 64)
	dense, _ := Measure(src, DefaultConfig())
	sparse, err := Measure(src, symConfig(4, 64, 0.5))
	if err != nil {
		t.Fatal(err)
	}
	if !(sparse.Report.RMSE > dense.Report.RMSE) {
		t.Errorf("50%% sparsity did not raise the error: %g vs %g", sparse.Report.RMSE, dense.Report.RMSE)
	}
}

// benchCache is the cache the benchmarks run on: the safetensors file named
// by $KVQ_BENCH_FILE (make bench passes a real SmolLM2 cache at 2048
// tokens), else synthetic data of SmolLM2 geometry at 256 tokens (11.8 MB).
var benchCache = func() *safetensors.File {
	if p := os.Getenv("KVQ_BENCH_FILE"); p != "" {
		f, err := safetensors.ReadFile(p)
		if err != nil {
			panic(err)
		}
		return f
	}
	return randomCache(7, 30, 3, 256, 64)
}()

// benchConfig is the scheme named by $KVQ_BENCH_SCHEME (make bench runs
// every preset), else the default. $KVQ_BENCH_PORTABLE=1 switches the
// assembly kernels off, so make bench can measure what they bring.
func benchConfig(b *testing.B) Config {
	if os.Getenv("KVQ_BENCH_PORTABLE") == "1" {
		saved, savedConv := useSIMD, safetensors.SetSIMD(false)
		useSIMD = false
		b.Cleanup(func() { useSIMD = saved; safetensors.SetSIMD(savedConv) })
	}
	cfg := DefaultConfig()
	if s := os.Getenv("KVQ_BENCH_SCHEME"); s != "" {
		spec, err := ParseSpec(s)
		if err != nil {
			b.Fatal(err)
		}
		cfg.Spec = spec
	}
	return cfg
}

func BenchmarkCompressRestore(b *testing.B) {
	cfg := benchConfig(b)
	b.SetBytes(int64(benchBytes()))
	for i := 0; i < b.N; i++ {
		if _, err := Compress(benchCache, cfg); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecompress(b *testing.B) {
	res, err := Measure(benchCache, benchConfig(b))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(benchBytes()))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, _, err := Decompress(res.Compressed, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMemcopy is the baseline: copying the same bytes once.
func BenchmarkMemcopy(b *testing.B) {
	dst := make([]byte, benchBytes())
	b.SetBytes(int64(len(dst)))
	for i := 0; i < b.N; i++ {
		off := 0
		for _, t := range benchCache.Tensors {
			off += copy(dst[off:], t.Data)
		}
	}
}

func benchBytes() int {
	n := 0
	for _, t := range benchCache.Tensors {
		n += len(t.Data)
	}
	return n
}

func FuzzQuantizeRoundTrip(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 0, 192}, uint8(4), uint8(2))
	f.Fuzz(func(t *testing.T, raw []byte, bits, g uint8) {
		b := int(bits)%7 + 2
		gs := (int(g)%32 + 1) * 2
		n := len(raw) / 4
		x := make([]float32, n)
		for i := range x {
			x[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
			if math.IsNaN(float64(x[i])) || math.IsInf(float64(x[i]), 0) {
				x[i] = 0
			}
		}
		tns, _ := safetensors.NewFloatTensor("t", safetensors.F32, []int{n}, x)
		res, err := Compress(&safetensors.File{Tensors: []safetensors.Tensor{tns}}, symConfig(b, gs, 0))
		if err != nil {
			if errors.Is(err, ErrScaleOverflow) {
				return
			}
			t.Fatal(err)
		}
		y, _ := res.Restored.Tensors[0].Float32s(nil)
		for lo := 0; lo < n; lo += gs {
			hi := min(lo+gs, n)
			s := safetensors.FP16ToFloat32(binary.LittleEndian.Uint16(res.Compressed.Tensors[1].Data[2*(lo/gs):]))
			for i := lo; i < hi; i++ {
				// Each error is at most half a step, except where codes clamp.
				if e := math.Abs(float64(y[i]) - float64(x[i])); s > 0x1p-14 && e > float64(s)*0.5*(1+1e-6)+math.Abs(float64(x[i]))*1e-3 {
					t.Fatalf("element %d: |%g - %g| = %g > s/2 = %g", i, y[i], x[i], e, s/2)
				}
			}
		}
	})
}

// TestMisalignedSourceMatches compresses F32 data that cannot be viewed in
// place (it starts at an odd address) and checks that the decoded copy
// gives the same file and reconstruction as the aligned view.
func TestMisalignedSourceMatches(t *testing.T) {
	src := randomCache(9, 1, 2, 40, 32)
	odd := &safetensors.File{Metadata: src.Metadata}
	for _, tn := range src.Tensors {
		buf := make([]byte, len(tn.Data)+1)
		copy(buf[1:], tn.Data)
		if _, ok := safetensors.Float32View(buf[1:]); ok {
			t.Fatal("an odd address was viewed in place")
		}
		tn.Data = buf[1:]
		odd.Tensors = append(odd.Tensors, tn)
	}
	for _, name := range []string{"int4", "kivi2", "rot4", "q4_1", "k=asym4/g64/res8/out0.01,v=sym4/g32"} {
		spec, _ := ParseSpec(name)
		cfg := Config{Spec: spec, Thresholds: DefaultThresholds}
		a, err := Compress(src, cfg)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Compress(odd, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for i := range a.Compressed.Tensors {
			if !bytes.Equal(a.Compressed.Tensors[i].Data, b.Compressed.Tensors[i].Data) {
				t.Errorf("%s: stored tensor %s differs", name, a.Compressed.Tensors[i].Name)
			}
		}
		for i := range a.Restored.Tensors {
			if !bytes.Equal(a.Restored.Tensors[i].Data, b.Restored.Tensors[i].Data) {
				t.Errorf("%s: reconstruction of %s differs", name, a.Restored.Tensors[i].Name)
			}
		}
		if a.Report.RMSE != b.Report.RMSE {
			t.Errorf("%s: rmse %v vs %v", name, a.Report.RMSE, b.Report.RMSE)
		}
	}
}
