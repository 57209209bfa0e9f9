package compression

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"kvlib/pkg/safetensors"
)

// fuzzSpecs are the schemes FuzzCompress draws from: every preset, and
// the optional stages in combinations.
var fuzzSpecs = append(PresetNames(),
	"asym3/g6/channel/res2", "sym5/g10/rot/out0.1", "asym2/g4/out0.3/sp0.2", "k=sym8/g2/channel,v=q8_0/res1",
	"sym4/g1073741824", "asym8/g2/channel/res1073741824", "k=kivi2,v=rot4/out0.05/res3", "int4+lossless",
	"k=asym3/g6/channel/res2,v=q8_0+lossless", "symf5/g10", "lm3/g6/channel/res2", "lm2/g4/out0.3/sp0.2",
	"lm4rot,k0=symf3/g8,v1-2=q8_0", "k=lm3/g8/rot,v=symf2/g4,kv0=lm2/g2")

// memoryBound is how much a codec call may allocate for n bytes of input:
// in proportion to the data, never to what a header claims. (A lossless
// payload may inflate up to 8 times, and the F32 output is up to 8 times
// the 4-bit codes: hence the factor.)
func memoryBound(n int) uint64 { return 32<<20 + 80*uint64(n) }

func allocated(fn func()) uint64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	fn()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// FuzzCompress drives whole files of arbitrary shape, dtype, scheme and
// values through compress, the file encoder and parser, and decompress.
// Whatever compresses must decompress to exactly the restored bytes, and
// memory stays in proportion to the input.
func FuzzCompress(f *testing.F) {
	f.Add([]byte{1, 2, 3, 64}, uint8(0), uint8(0), []byte("0123456789abcdef0123456789abcdef"))
	f.Add([]byte{2, 3, 5, 8}, uint8(3), uint8(1), bytes.Repeat([]byte{0, 0, 0x80, 0x3f, 0, 0, 0x80, 0xbf}, 40))
	f.Add([]byte{1, 1, 7, 32}, uint8(11), uint8(2), bytes.Repeat([]byte{0xff, 0x7b, 0x00, 0x3c}, 60))
	f.Add([]byte{0, 200, 0, 4}, uint8(5), uint8(0), []byte{})
	f.Add([]byte{1, 4, 9}, uint8(14), uint8(0), bytes.Repeat([]byte{1, 2, 3, 4}, 30))
	f.Fuzz(func(t *testing.T, dims []byte, specIdx, dtIdx uint8, values []byte) {
		if len(dims) > 5 {
			dims = dims[:5]
		}
		dt := []safetensors.DType{safetensors.F32, safetensors.F16, safetensors.BF16}[int(dtIdx)%3]
		shape := make([]int, len(dims))
		n := 1
		for i, d := range dims {
			shape[i] = int(d)
			n *= int(d)
		}
		if n*dt.Size() > 1<<16 { // keep each run small: the fuzzer wants many
			return
		}
		data := make([]byte, n*dt.Size())
		copy(data, values)
		src := &safetensors.File{Tensors: []safetensors.Tensor{
			{Name: "layer_0_key", DType: dt, Shape: shape, Data: data},
			{Name: "layer_0_value", DType: dt, Shape: shape, Data: data},
		}}
		spec, err := ParseSpec(fuzzSpecs[int(specIdx)%len(fuzzSpecs)])
		if err != nil {
			t.Fatal(err)
		}
		var res *Result
		var cerr error
		if used := allocated(func() { res, cerr = Compress(src, Config{Spec: spec, Workers: 2}) }); used > memoryBound(2*len(data)) {
			t.Fatalf("compress allocated %d bytes for %d bytes of input", used, 2*len(data))
		}
		if cerr != nil {
			return // a clean error (NaN input, overflow, shape the scheme cannot take)
		}
		var buf bytes.Buffer
		if err := safetensors.Encode(&buf, res.Compressed); err != nil {
			t.Fatal(err)
		}
		parsed, err := safetensors.Parse(buf.Bytes())
		if err != nil {
			t.Fatalf("compressed file does not parse: %v", err)
		}
		var back *safetensors.File
		if used := allocated(func() { back, _, err = Decompress(parsed, 2) }); used > memoryBound(buf.Len()+2*len(data)) {
			t.Fatalf("decompress allocated %d bytes", used)
		}
		if err != nil {
			t.Fatalf("own output does not decompress: %v", err)
		}
		for i := range back.Tensors {
			if !bytes.Equal(back.Tensors[i].Data, res.Restored.Tensors[i].Data) {
				t.Fatalf("%s: decompress differs from the restored tensor", back.Tensors[i].Name)
			}
		}
	})
}

// FuzzDecompress feeds mutated compressed files, header fields included,
// to the decoder: it may refuse them, but never panic or allocate beyond
// what the file's own data supports.
func FuzzDecompress(f *testing.F) {
	for _, name := range []string{"int4", "kivi2", "q5_1", "rot4", "int4+lossless", "kivi4+lossless",
		"int4,k0h1=lm2rot", "kivi2,v0h0=q8_0+wire"} {
		spec, _ := ParseSpec(name)
		for _, extra := range []string{"", "/out0.1/res2"} {
			if extra != "" {
				spec.Key, _ = parseScheme(spec.Key.String()+extra, roleKey)
			}
			src := randomCache(11, 1, 2, 6, 32)
			res, err := Compress(src, Config{Spec: spec})
			if err != nil {
				f.Fatal(err)
			}
			var buf bytes.Buffer
			safetensors.Encode(&buf, res.Compressed)
			f.Add(buf.Bytes())
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		parsed, err := safetensors.Parse(data)
		if err != nil {
			return
		}
		if used := allocated(func() { _, _, _ = Decompress(parsed, 2) }); used > memoryBound(len(data)) {
			n := binary.LittleEndian.Uint64(data)
			t.Fatalf("decompress allocated %d bytes for a %d-byte file (header %d bytes)", used, len(data), n)
		}
	})
}

// FuzzHeader rewrites the kvq.tensors record of a valid file (schemes,
// shapes, outlier counts, residuals): every record the decoder accepts
// must decode within the memory its data supports.
func FuzzHeader(f *testing.F) {
	spec, _ := ParseSpec("k=asym3/g8/channel/out0.05/res2,v=q4_1+lossless")
	res, err := Compress(randomCache(12, 1, 2, 6, 32), Config{Spec: spec})
	if err != nil {
		f.Fatal(err)
	}
	base := res.Compressed
	f.Add(base.Metadata[metaTensors], "2")
	heads, _ := ParseSpec("int4,k0h1=lm2rot")
	if parts, err := Compress(randomCache(12, 1, 2, 6, 32), Config{Spec: heads}); err == nil {
		f.Add(parts.Compressed.Metadata[metaTensors], "3")
	}
	f.Add(`[{"name":"layer_0_key","dtype":"F32","shape":[1,2,6,32],"scheme":{"method":"asym","bits":3,"group":8,"axis":"channel","rotate":false,"outliers":0.05,"residual":2,"sparsity":0},"outliers":9}]`, "2")
	f.Add(`[{"name":"layer_0_value","dtype":"F16","shape":[1,2,1000000000,0],"scheme":{"method":"q4_1","bits":4,"group":32,"axis":"token"},"outliers":0}]`, "1")
	f.Fuzz(func(t *testing.T, tensors, version string) {
		md := map[string]string{}
		for k, v := range base.Metadata {
			md[k] = v
		}
		md[metaTensors], md[metaVersion] = tensors, version
		md[metaBits], md[metaGroupSize], md[metaSparsity] = "4", "64", "0"
		file := &safetensors.File{Metadata: md, Tensors: base.Tensors}
		var size int
		for _, tn := range base.Tensors {
			size += len(tn.Data)
		}
		var out *safetensors.File
		var err error
		if used := allocated(func() { out, _, err = Decompress(file, 2) }); used > memoryBound(size+len(tensors)) {
			t.Fatalf("decompress allocated %d bytes for %d bytes of data", used, size)
		}
		if err == nil {
			for _, tn := range out.Tensors { // what decodes is finite
				x, _ := tn.Float32s(nil)
				if i := firstNonFinite(x); i >= 0 {
					t.Fatalf("%s: element %d decoded as %v", tn.Name, i, x[i])
				}
			}
		}
	})
}

// FuzzParseSpec feeds arbitrary specs, JSON ones with fields left out
// among them: ParseSpec may refuse one, in one line, but what it accepts
// is valid and canonical, and reads back the same from its string and its
// full JSON form.
func FuzzParseSpec(f *testing.F) {
	for _, s := range fuzzSpecs {
		f.Add(s)
	}
	for _, s := range []string{`{}`, `{"key": {"method": "asym", "axis": "channel"}}`, `{"key": null, "value": {"bits": 3}}`,
		`{"value": {"method": "q5_0"}, "lossless": true}`, `{"key": {"method": "lm", "bits": 2, "rotate": true, "outliers": 0.01}}`,
		`{"layers": [{"layer": 1, "role": "key", "scheme": {"method": "q8_0"}}]}+lossless`,
		`{"key": {"bitz": 1}}`, `{"key": {"bits": "4"}}`, `{"layers": [{"layer": 0}]}`, `{"key": {"residual": 1e99}}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		s, err := ParseSpec(text)
		if err != nil {
			if strings.ContainsAny(err.Error(), "\n\r") {
				t.Fatalf("ParseSpec(%q): error of more than one line: %v", text, err)
			}
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("ParseSpec(%q) accepted an invalid spec: %v", text, err)
		}
		back, err := ParseSpec(s.String())
		if err != nil || !back.Equal(s) {
			t.Fatalf("ParseSpec(%q) = %q, which reads back as %+v (%v)", text, s, back, err)
		}
		js, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if back, err := ParseSpec(string(js)); err != nil || !back.Equal(s) {
			t.Fatalf("ParseSpec(%q): its JSON %s reads back as %+v (%v)", text, js, back, err)
		}
	})
}
