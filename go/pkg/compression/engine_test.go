package compression

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/rand"
	"os"
	"slices"
	"strings"
	"testing"

	"kvlib/pkg/safetensors"
)

// engineVectorsPath is the shared test-vector file of the engine formats,
// made by tests/make_engine_vectors.py from tests/engine_reference.py,
// which tests/test_engine_formats.py checks against llama.cpp's own C.
const engineVectorsPath = "../../../tests/vectors/engine_vectors.json"

type engineTensor struct {
	v2Tensor
	RotationSize int   `json:"rotation_size"`
	NonFinite    int   `json:"non_finite"`
	Saturated    int64 `json:"saturated"`
}

type engineVectors struct {
	Cases []struct {
		Name    string         `json:"name"`
		Spec    string         `json:"spec"`
		Tensors []engineTensor `json:"tensors"`
		Error   string         `json:"error"`
	} `json:"cases"`
	Blocks []struct {
		Name        string `json:"name"`
		Format      string `json:"format"`
		InputHex    string `json:"input_hex"`
		CodesHex    string `json:"codes_hex"`
		RestoredHex string `json:"restored_hex"`
	} `json:"blocks"`
	Rotations []struct {
		N         int    `json:"n"`
		InputHex  string `json:"input_hex"`
		OutputHex string `json:"output_hex"`
	} `json:"rotations"`
}

func loadEngineVectors(t testing.TB) *engineVectors {
	t.Helper()
	data, err := os.ReadFile(engineVectorsPath)
	if err != nil {
		t.Fatalf("engine test vectors: %v", err)
	}
	var v engineVectors
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Cases) < 80 || len(v.Blocks) < 100 || len(v.Rotations) < 4 {
		t.Fatalf("only %d cases, %d blocks, %d rotations", len(v.Cases), len(v.Blocks), len(v.Rotations))
	}
	return &v
}

func float32sOf(t testing.TB, h string) []float32 {
	b, err := hex.DecodeString(h)
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, len(b)/4)
	for i := range x {
		x[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return x
}

func bitsOf(x []float32) []byte {
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// TestEngineVectors: whole caches through Compress and Decompress give the
// reference's bytes (the engine's, see tests/test_engine_formats.py),
// the rotation the engine applies, and the same refusals.
func TestEngineVectors(t *testing.T) {
	for _, vc := range loadEngineVectors(t).Cases {
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
				if tr.Saturated != tv.Saturated {
					t.Errorf("%s: %d saturated, want %d", tv.Name, tr.Saturated, tv.Saturated)
				}
				if tr.RotationSize != tv.RotationSize || tr.NonFinite != tv.NonFinite {
					t.Errorf("%s: rotation %d (%s), %d non-finite; want %d, %d", tv.Name, tr.RotationSize, tr.Rotation, tr.NonFinite,
						tv.RotationSize, tv.NonFinite)
				}
			}
			var buf bytes.Buffer
			if err := safetensors.Encode(&buf, res.Compressed); err != nil {
				t.Fatal(err)
			}
			parsed, err := safetensors.Parse(buf.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			back, hdr, err := Decompress(parsed, 2)
			if err != nil {
				t.Fatal(err)
			}
			if hdr.Spec != vc.Spec {
				t.Errorf("header spec %q", hdr.Spec)
			}
			for i := range back.Tensors {
				if !bytes.Equal(back.Tensors[i].Data, res.Restored.Tensors[i].Data) {
					t.Errorf("%s: Decompress differs from Compress's reconstruction", back.Tensors[i].Name)
				}
			}
		})
	}
}

// TestEngineVectorsPortable runs the cases and blocks with the assembly
// kernels off, as a CPU without AVX2 does.
func TestEngineVectorsPortable(t *testing.T) {
	withPortable(func() {
		TestEngineVectors(t)
		TestLlamaCppBlockVectors(t)
	})
}

// TestLlamaCppBlockVectors: the block API on blocks of any bits (NaN with
// payloads, Inf, subnormals, ties, FLT_MAX) gives the engine's bytes and
// its read of them.
func TestLlamaCppBlockVectors(t *testing.T) {
	n := 0
	for _, bv := range loadEngineVectors(t).Blocks {
		if bv.Format == "q8_0_ref" { // the _ref rounding, which the CPU build does not run on x86
			continue
		}
		x := float32sOf(t, bv.InputHex)
		codes := make([]byte, len(x)/llamaFormat(bv.Format).elems*LlamaCppBlockBytes(bv.Format))
		LlamaCppQuantize(bv.Format, x, codes)
		if hex.EncodeToString(codes) != bv.CodesHex {
			t.Errorf("%s: codes\n got %x\nwant %s", bv.Name, codes, bv.CodesHex)
			continue
		}
		y := make([]float32, len(x))
		LlamaCppDequantize(bv.Format, codes, y)
		if hex.EncodeToString(bitsOf(y)) != bv.RestoredHex {
			t.Errorf("%s: dequantized values differ", bv.Name)
		}
		n++
	}
	if n < 100 {
		t.Errorf("only %d blocks", n)
	}
}

func TestLlamaCppRotateVectors(t *testing.T) {
	for _, rv := range loadEngineVectors(t).Rotations {
		for _, portable := range []bool{false, true} {
			x := float32sOf(t, rv.InputHex)
			rot := func() { LlamaCppRotate(x, rv.N) }
			if portable {
				withPortable(rot)
			} else {
				rot()
			}
			if hex.EncodeToString(bitsOf(x)) != rv.OutputHex {
				t.Errorf("n %d (portable %v): differs from the reference", rv.N, portable)
			}
		}
	}
}

// The engine's kernel scales first: for n = 128, whose 1/sqrtf(n) is not a
// power of two, that is not kvlib's QuaRot transform (which scales last),
// and it is orthonormal: rotating twice gives x back to float32 rounding.
func TestLlamaCppRotateIsTheEnginesKernel(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	x := make([]float32, 128*50)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	a, b := append([]float32(nil), x...), append([]float32(nil), x...)
	LlamaCppRotate(a, 128)
	RotateRows(b, 128)
	if bytes.Equal(bitsOf(a), bitsOf(b)) {
		t.Error("LlamaCppRotate(128) is kvlib's RotateRows bit for bit: the scale is not applied first")
	}
	if got, want := llamaHadamardScale(128), float32(1)/float32(math.Sqrt(128)); got != want || llamaHadamardScale(64) != 0.125 {
		t.Errorf("scale %g, want %g", got, want)
	}
	LlamaCppRotate(a, 128)
	for i := range x {
		if d := math.Abs(float64(a[i] - x[i])); d > 1e-5*(1+math.Abs(float64(x[i]))) {
			t.Fatalf("H·H·x differs from x at %d: %g vs %g", i, a[i], x[i])
		}
	}
}

// The grammar: engine:format[/option], per role and per layer; the
// canonical spelling round-trips; a wrong name is one line naming it.
func TestParseEngineSpecs(t *testing.T) {
	for _, tc := range []struct{ in, canon string }{
		{"llama.cpp:q4_0", "llama.cpp:q4_0"},
		{"llama.cpp:q4_0/rot", "llama.cpp:q4_0"},
		{"llama.cpp:q4_0/norot", "llama.cpp:q4_0/norot"},
		{"llama.cpp:q4_0/norot/rot", "llama.cpp:q4_0"},
		{"llama.cpp:f16", "llama.cpp:f16"},
		{"llama.cpp:f16/norot", "llama.cpp:f16"},
		{"llama.cpp:iq4_nl/g32/token", "llama.cpp:iq4_nl"},
		{"k=llama.cpp:q8_0,v=llama.cpp:q4_0", "k=llama.cpp:q8_0,v=llama.cpp:q4_0"},
		{"k=llama.cpp:q8_0/norot,v=llama.cpp:q8_0/norot", "llama.cpp:q8_0/norot"},
		{"llama.cpp:q4_0,kv0-1=none", "llama.cpp:q4_0,k0-1=none,v0-1=none"},
		{"k=llama.cpp:q5_1,v=llama.cpp:iq4_nl,k3=llama.cpp:q8_0,v0=none", "k=llama.cpp:q5_1,v=llama.cpp:iq4_nl,k3=llama.cpp:q8_0,v0=none"},
		{"none", "none"},
		{"int4,kv2=llama.cpp:q4_1/norot", "sym4/g64,k2=llama.cpp:q4_1/norot,v2=llama.cpp:q4_1/norot"},
		{"llama.cpp:q4_0+lossless", "llama.cpp:q4_0+lossless"},
		{"rot4/norot", "sym4/g64"},
		{`{"key": {"method": "llama.cpp:q4_0"}, "value": {"method": "llama.cpp:q8_0", "rotate": false}}`,
			"k=llama.cpp:q4_0,v=llama.cpp:q8_0/norot"},
		{`{"key": {"method": "none"}, "value": {"method": "llama.cpp:f16"}}`, "k=none,v=llama.cpp:f16"},
		{"vllm:fp8_e4m3", "vllm:fp8_e4m3"},
		{"vllm:fp8/scale1", "vllm:fp8"},
		{"vllm:fp8_e5m2/scale0.1", "vllm:fp8_e5m2/scale0.1"},
		{"vllm:fp8_e4m3/scale0.1000000001", "vllm:fp8_e4m3/scale0.1"}, // the float32 the engine loads
		{"k=vllm:fp8_e4m3/scale2.5,v=vllm:fp8_e4m3,k0-1=none", "k=vllm:fp8_e4m3/scale2.5,v=vllm:fp8_e4m3,k0-1=none"},
		{"vllm:int8_per_token_head,kv3=vllm:fp8_per_token_head", "vllm:int8_per_token_head,k3=vllm:fp8_per_token_head,v3=vllm:fp8_per_token_head"},
		{`{"key": {"method": "vllm:fp8"}, "value": {"method": "vllm:fp8_e5m2", "scale": 0.25}}`, "k=vllm:fp8,v=vllm:fp8_e5m2/scale0.25"},
		{"vllm:nvfp4/scale1", "vllm:nvfp4"},
		{"k=vllm:nvfp4_4over6/scale0.0025,v=trtllm:nvfp4/scale0.5", "k=vllm:nvfp4_4over6/scale0.0025,v=trtllm:nvfp4/scale0.5"},
		{"vllm:nvfp4/g16/token", "vllm:nvfp4"},
	} {
		s, err := ParseSpec(tc.in)
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if s.String() != tc.canon {
			t.Errorf("%s is spelled %s, want %s", tc.in, s, tc.canon)
		}
		again, err := ParseSpec(s.String())
		if err != nil || !again.Equal(s) {
			t.Errorf("%s does not round-trip: %v %v", s, again, err)
		}
		js, _ := json.Marshal(s)
		fromJSON, err := ParseSpec(string(js))
		if err != nil || !fromJSON.Equal(s) {
			t.Errorf("%s: its JSON %s does not round-trip: %v", s, js, err)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"tgi:fp8", `unknown engine "tgi" in "tgi:fp8" (engines: llama.cpp, vllm, sglang, trtllm, exllamav2, exllamav3, ocp, lmcache)`},
		{"exllamav3:9", `exllamav3 has no KV-cache format "9" (its formats: 2, 3, 4, 5, 6, 7, 8)`},
		{"trtllm:mxfp4", `trtllm has no KV-cache format "mxfp4" (its formats: fp8, int8, nvfp4)`},
		{"exllamav2:q6/g32", "preset exllamav2:q6 differs by role"},
		{"exllamav2:q5", `exllamav2 has no KV-cache format "q5" (its formats: fp8, q4, q8, q6)`}, // q6: the named K/V pair
		{"sglang:fp4", `sglang has no KV-cache format "fp4" (its formats: fp8_e4m3, fp8_e5m2, fp4_e2m1)`},
		{"sglang:fp4_e2m1/scale2", "computes its own scales"},
		{"vllm:fp8/scale0", "vllm:fp8 takes a positive finite float32 scale"},
		{"vllm:fp8/scale-1", "vllm:fp8 takes a positive finite float32 scale"},
		{"vllm:fp8/scale1e39", "vllm:fp8 takes a positive finite float32 scale"},
		{"vllm:fp8/scalex", `option "scalex": not a finite number`},
		{"vllm:int8_per_token_head/scale2", "computes its own scales"},
		{"int4/scale2", "/scale is an engine format's static scale"},
		{"vllm:fp8_e4m3/rot", "never rotated"},
		{"vllm:fp8_inc", `vllm has no KV-cache format "fp8_inc"`},
		{"llama.cpp:q3_k", `llama.cpp has no KV-cache format "q3_k" (its formats: f16, q8_0, q5_1, q5_0, q4_1, q4_0, iq4_nl)`},
		{"llama.cpp:Q4_0", `llama.cpp has no KV-cache format "Q4_0"`},
		{"llama.cpp:", `llama.cpp has no KV-cache format ""`},
		{"k=llama.cpp:q4_0,v=llama:q4_0", `unknown engine "llama"`},
		{"llama.cpp:q4_0/g64", "llama.cpp:q4_0 is the engine's 4-bit format in blocks of 32 along head_dim, got bits 4 group 64 axis token"},
		{"llama.cpp:q4_0/channel", "axis channel"},
		{"llama.cpp:q8_0/out0.01", "takes no outliers, residual or sparsity"},
		{"llama.cpp:q8_0/res64", "takes no outliers, residual or sparsity"},
		{"llama.cpp:f16/rot", "llama.cpp:f16 is never rotated by the engine"},
		{"llama.cpp:q4_0/unrot", `unknown option "unrot"`},
		{"none/rot", "none stores the tensor unchanged"},
		{"none/g32", "none stores the tensor unchanged"},
		{"llama.cpp:q4_0,k0=llama.cpp:q9_0", `layers 0 key: llama.cpp has no KV-cache format "q9_0"`},
		{`{"key": {"method": "llama.cpp:q4_0", "bits": 8}}`, "got bits 8"},
		{`{"key": {"method": "vllm:fp9"}}`, `unknown method "vllm:fp9"`},
	} {
		_, err := ParseSpec(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error %v, want one line containing %q", tc.in, err, tc.want)
		}
	}
}

// The rotation decisions of src/llama-kv-cache.cpp, per role and head_dim.
func TestEngineRotationDecisions(t *testing.T) {
	q4 := engineScheme(llamaFormat("q4_0"))
	norot := q4
	norot.Rotate = false
	f16 := engineScheme(llamaFormat("f16"))
	for _, tc := range []struct {
		s      Scheme
		role   Role
		shape  []int
		dims   []int
		size   int
		why    string
		errMsg string
	}{
		{q4, KeyRole, []int{1, 2, 3, 64}, nil, 64, "on (Hadamard 64 along head_dim 64)", ""},
		{q4, KeyRole, []int{1, 2, 3, 128}, nil, 128, "on (Hadamard 128", ""},
		{q4, ValueRole, []int{1, 2, 3, 128}, nil, 64, "on (Hadamard 64 along head_dim 128)", ""},
		{q4, KeyRole, []int{1, 2, 3, 256}, nil, 256, "on", ""},
		{q4, KeyRole, []int{1, 2, 3, 192}, nil, 64, "on (Hadamard 64 along head_dim 192)", ""},
		{q4, KeyRole, []int{1, 2, 3, 576}, nil, 64, "on", ""},
		{q4, KeyRole, []int{1, 2, 3, 1024}, nil, 1024, "on", ""},
		{q4, KeyRole, []int{1, 2, 3, 96}, nil, 0, "off (head_dim 96 is not a multiple of 64)", ""},
		{q4, ValueRole, []int{1, 2, 3, 160}, nil, 0, "off (head_dim 160 is not a multiple of 64)", ""},
		{q4, KeyRole, []int{1, 2, 3, 64}, []int{64, 128}, 0, "off (the key tensors have different head sizes [64 128]", ""},
		{norot, KeyRole, []int{1, 2, 3, 128}, nil, 0, "off (/norot, as LLAMA_ATTN_ROT_DISABLE=1)", ""},
		{norot, KeyRole, []int{4096}, nil, 0, "off (/norot", ""},
		{f16, KeyRole, []int{1, 2, 3, 80}, nil, 0, "off (f16 is not a quantized type", ""},
		{q4, KeyRole, []int{1, 2, 3, 80}, nil, 0, "", "llama.cpp refuses q4_0 for head_dim 80: its blocks of 32 must divide head_dim"},
		{q4, ValueRole, []int{64}, nil, 0, "", "needs a 4-D [batch, heads, tokens, head_dim] tensor, shape is [64] (llama.cpp:q4_0/norot does not)"},
	} {
		hd := headDims{tc.role: tc.dims}
		ri, err := engineRotation(tc.s, tc.role, tc.shape, hd)
		name := fmt.Sprintf("%s %s %v", tc.s, tc.role, tc.shape)
		if tc.errMsg != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errMsg) {
				t.Errorf("%s: %v, want %q", name, err, tc.errMsg)
			}
			continue
		}
		if err != nil || ri == nil || ri.Size != tc.size || !strings.HasPrefix(ri.Why, tc.why) {
			t.Errorf("%s: %+v %v, want size %d, %q", name, ri, err, tc.size, tc.why)
		}
	}
	if ri, err := engineRotation(DefaultSpec().Key, KeyRole, []int{1, 1, 1, 64}, nil); ri != nil || err != nil {
		t.Errorf("kvlib's own scheme: %v %v", ri, err)
	}
}

// kv-compress schemes -engine: every format with its release and evidence.
func TestEngineReport(t *testing.T) {
	rows, err := EngineReport("llama.cpp")
	if err != nil || len(rows) != 7 {
		t.Fatalf("%d rows, %v", len(rows), err)
	}
	for i, r := range rows {
		if r.Name != "llama.cpp:"+LlamaCppFormats()[i] || r.Scheme != r.Name || r.Evidence != EvidenceExecuted ||
			!strings.Contains(r.EngineVersion, "0c1e57098") || !strings.Contains(r.EngineVersion, "0.3.36") ||
			r.Flags != "-ctk "+r.Format+" -ctv "+r.Format || r.Source == "" {
			t.Errorf("row %d: %+v", i, r)
		}
	}
	if rows[0].KeyBits != 16 || rows[6].KeyBits != 4.5 || rows[1].KeyBits != 8.5 {
		t.Errorf("bits %g %g %g", rows[0].KeyBits, rows[6].KeyBits, rows[1].KeyBits)
	}
	if all, err := EngineReport("all"); err != nil || len(all) != 34+3+4 { // + lmcache's fp8, kivi, cachegen; vLLM's four TurboQuant presets
		t.Errorf("all: %d, %v", len(all), err)
	}
	if _, err := EngineReport("tgi"); err == nil || err.Error() != `unknown engine "tgi" (engines: llama.cpp, vllm, sglang, trtllm, exllamav2, exllamav3, ocp, lmcache, or all)` {
		t.Errorf("tgi: %v", err)
	}
	if all, _ := EngineReport("all"); true {
		tops := map[string]float64{}
		for _, r := range all {
			if r.ScaleMax != 0 {
				tops[r.Name] = r.ScaleMax
			}
		}
		want := map[string]float64{"vllm:fp8": 448, "vllm:fp8_e4m3": 448, "vllm:fp8_e5m2": 57344, "sglang:fp8_e4m3": 448, "sglang:fp8_e5m2": 57344,
			"trtllm:fp8": 448, "trtllm:int8": 127, "vllm:nvfp4": 2688, "vllm:nvfp4_4over6": 2688, "trtllm:nvfp4": 2688}
		if len(tops) != len(want) {
			t.Errorf("scale_max: %v", tops)
		}
		for k, v := range want {
			top := float64(fp8Of(k).decode[fp8Of(k).maxCode])
			if strings.Contains(k, "nvfp4") { // E2M1's largest times E4M3's: what one block scale can hold
				top *= float64(e2m1Values[7])
			}
			if tops[k] != v || !strings.HasSuffix(k, "int8") && top != v {
				t.Errorf("scale_max of %s: %g, want %g", k, tops[k], v)
			}
		}
	}
	// ExLlamaV2's Q6 is a named pairing: K q8, V q4, spelled as the engine's option.
	q6, err := ParseSpec("exllamav2:q6")
	if err != nil || q6.String() != "k=exllamav2:q8,v=exllamav2:q4" || q6.Name() != "exllamav2:q6" {
		t.Errorf("exllamav2:q6: %v %s %s", err, q6.String(), q6.Name())
	}
	if both, err := ParseSpec("k=exllamav2:q6,v=exllamav2:q6"); err != nil || both.Key.Method != "exllamav2:q8" || both.Value.Method != "exllamav2:q4" {
		t.Errorf("k=exllamav2:q6,v=exllamav2:q6: %v %v", both, err)
	}
	rows, err = EngineReport("exllamav2")
	if err != nil || len(rows) != 4 || rows[3].Name != "exllamav2:q6" || rows[3].Flags != "ExLlamaV2Cache_Q6" ||
		rows[3].KeyBits != 8.5 || rows[3].ValueBits != 4.5 || rows[0].Flags != "ExLlamaV2Cache_8bit" {
		t.Errorf("exllamav2: %+v %v", rows, err)
	}
	rows, err = EngineReport("vllm")
	want := []struct {
		format string
		bits   float64
	}{{"fp8", 8}, {"fp8_e4m3", 8}, {"fp8_e5m2", 8}, {"int8_per_token_head", 8.25}, {"fp8_per_token_head", 8.25},
		{"int4_per_token_head", 4.25}, {"nvfp4", 4.5}, {"nvfp4_4over6", 4.5},
		// the TurboQuant presets at head_dim 128: K codes + an fp16 norm (or FP8), V codes + fp16 scale and zero
		{"turboquant_k8v4", 8}, {"turboquant_4bit_nc", 4.125}, {"turboquant_k3v4_nc", 3.125}, {"turboquant_3bit_nc", 3.125}}
	if err != nil || len(rows) != len(want) {
		t.Fatalf("vllm: %d rows, %v", len(rows), err)
	}
	for i, r := range rows {
		evidence := EvidenceRead
		if strings.HasPrefix(r.Format, "turboquant_") && r.Format != "turboquant_k8v4" {
			evidence = EvidenceExecuted // vLLM's own store and read ran on the vector caches
		}
		if r.Format == "int8_per_token_head" || r.Format == "int4_per_token_head" {
			evidence = EvidenceExecuted // vLLM's own writer ran (tests/vllm_triton_harness.py)
		}
		if r.Format != want[i].format || r.KeyBits != want[i].bits || r.Flags != "--kv-cache-dtype "+r.Format ||
			!strings.Contains(r.EngineVersion, "0.33.0") || r.Evidence != evidence || r.Source == "" {
			t.Errorf("vllm row %d: %+v", i, r)
		}
	}
	if rows[8].ValueBits != 4.25 || rows[11].ValueBits != 3.25 || rows[8].Scheme != "k=vllm:turboquant_k8,v=vllm:turboquant_v4" {
		t.Errorf("turboquant rows: %+v %+v", rows[8], rows[11])
	}
}

// The per-tensor report says what the rotation did.
func TestEngineReportFields(t *testing.T) {
	src := randomCache(4, 1, 2, 8, 96)
	k, _ := safetensors.NewFloatTensor("layer_1_key", safetensors.F32, []int{1, 2, 8, 128}, make([]float32, 2*8*128))
	src.Tensors = append(src.Tensors, k)
	spec, _ := ParseSpec("llama.cpp:q4_0")
	res, err := Compress(src, Config{Spec: spec, Thresholds: DefaultThresholds})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(res.Report.Tensors[0])
	if !strings.Contains(string(js), `"rotation":"off (the key tensors have different head sizes [96 128]; llama.cpp rotates only one head size per cache)"`) {
		t.Errorf("report: %s", js)
	}
	spec, _ = ParseSpec("int4")
	res, _ = Compress(src, Config{Spec: spec, Thresholds: DefaultThresholds})
	if js, _ := json.Marshal(res.Report.Tensors[0]); strings.Contains(string(js), "rotation") || strings.Contains(string(js), "non_finite") {
		t.Errorf("kvlib's scheme reports an engine field: %s", js)
	}
}

// none stores the source bytes and gives them back exactly, in every dtype.
func TestNoneIsTheIdentity(t *testing.T) {
	spec, _ := ParseSpec("none")
	for _, dt := range []safetensors.DType{safetensors.F32, safetensors.F16, safetensors.BF16} {
		x := make([]float32, 3*5*7)
		r := rand.New(rand.NewSource(int64(len(dt))))
		for i := range x {
			x[i] = float32(r.NormFloat64() * 1000)
		}
		x[0] = float32(math.Copysign(0, -1))
		tn, _ := safetensors.NewFloatTensor("t", dt, []int{3, 5, 7}, x)
		res, err := Compress(&safetensors.File{Tensors: []safetensors.Tensor{tn}}, Config{Spec: spec, Thresholds: DefaultThresholds})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(res.Compressed.Tensor("t"+CodesSuffix).Data, tn.Data) || !bytes.Equal(res.Restored.Tensors[0].Data, tn.Data) ||
			res.Report.RMSE != 0 || res.Report.BitsPerElement != float64(8*dt.Size()) || len(res.Compressed.Tensors) != 1 {
			t.Errorf("%s: not the identity (rmse %g, %g bits)", dt, res.Report.RMSE, res.Report.BitsPerElement)
		}
	}
}

// The x86 q8_0 and the _ref (gguf's) differ exactly on ties: 127/amax
// times x on a half rounds to even, the _ref away from zero.
func TestQ8_0TiesX86NotRef(t *testing.T) {
	x := make([]float32, 32)
	x[0] = 127
	for i := 1; i < 32; i++ {
		x[i] = float32(i-16) + 0.5 // -14.5 ... 15.5
	}
	b := make([]byte, 34)
	LlamaCppQuantize("q8_0", x, b)
	for i := 1; i < 32; i++ {
		want := int8(math.RoundToEven(float64(x[i])))
		if int8(b[2+i]) != want {
			t.Errorf("%g -> %d, want %d (half to even)", x[i], int8(b[2+i]), want)
		}
	}
	ref := make([]byte, 34)
	if err := QuantizeBlockGGML(Q8_0, x, ref); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(b, ref) || int8(ref[2+1]) != -15 || int8(b[2+1]) != -14 {
		t.Errorf("x86 %v, ref %v: the tie -14.5 should split them", b[2:4], ref[2:4])
	}
}

// cRef is a line-by-line transliteration of llama.cpp's C for one block,
// independent of the production code's kernels and fast paths: the
// fuzzer's oracle.
func cRef(format string, x []float32) []byte {
	out := make([]byte, LlamaCppBlockBytes(format)*len(x)/llamaFormat(format).elems)
	cvt := func(v float32) int32 { // cvttss2si
		if v != v || v >= 2147483648 || v < -2147483648 {
			return math.MinInt32
		}
		return int32(v)
	}
	fp16 := safetensors.Float32ToFP16
	put := func(o int, h uint16) { binary.LittleEndian.PutUint16(out[o:], h) }
	fabs := func(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }
	switch format {
	case "f16":
		for i, v := range x {
			put(2*i, fp16F16CRef(v))
		}
	case "q4_0", "q5_0":
		var amax, mx float32
		for _, v := range x {
			if amax < fabs(v) {
				amax, mx = fabs(v), v
			}
		}
		div, off, qmax := float32(-8), float32(8.5), 15
		if format == "q5_0" {
			div, off, qmax = -16, 16.5, 31
		}
		d := mx / div
		var id float32
		if d != 0 {
			id = 1 / d
		}
		put(0, fp16(d))
		var qh uint32
		for j := 0; j < 16; j++ {
			xi0 := uint8(min(qmax, int(int8(cvt(float32(x[j]*id)+off)))))
			xi1 := uint8(min(qmax, int(int8(cvt(float32(x[j+16]*id)+off)))))
			if format == "q4_0" {
				out[2+j] = xi0 | xi1<<4
				continue
			}
			out[6+j] = xi0&0x0f | (xi1&0x0f)<<4
			qh |= uint32(xi0&0x10) >> 4 << j
			qh |= uint32(xi1&0x10) >> 4 << (j + 16)
		}
		if format == "q5_0" {
			binary.LittleEndian.PutUint32(out[2:], qh)
		}
	case "q4_1", "q5_1":
		mn, mx := float32(math.MaxFloat32), float32(-math.MaxFloat32)
		for _, v := range x {
			if v < mn {
				mn = v
			}
			if v > mx {
				mx = v
			}
		}
		qmax := float32(15)
		if format == "q5_1" {
			qmax = 31
		}
		d := (mx - mn) / qmax
		var id float32
		if d != 0 {
			id = 1 / d
		}
		put(0, fp16(d))
		put(2, fp16(mn))
		var qh uint32
		for j := 0; j < 16; j++ {
			v0, v1 := float32(float32(x[j]-mn)*id)+0.5, float32(float32(x[j+16]-mn)*id)+0.5
			if format == "q4_1" {
				out[4+j] = uint8(min(15, int(int8(cvt(v0))))) | uint8(min(15, int(int8(cvt(v1)))))<<4
				continue
			}
			xi0, xi1 := uint8(cvt(v0)), uint8(cvt(v1))
			out[8+j] = xi0&0x0f | (xi1&0x0f)<<4
			qh |= uint32(xi0&0x10) >> 4 << j
			qh |= uint32(xi1&0x10) >> 4 << (j + 16)
		}
		if format == "q5_1" {
			binary.LittleEndian.PutUint32(out[4:], qh)
		}
	case "q8_0":
		mx := func(a, b float32) float32 { // MAXPS
			if a > b {
				return a
			}
			return b
		}
		var lane [8]float32
		for i := 0; i < 8; i++ {
			lane[i] = fabs(x[i])
		}
		for k := 1; k < 4; k++ {
			for i := 0; i < 8; i++ {
				lane[i] = mx(lane[i], fabs(x[8*k+i]))
			}
		}
		m := [4]float32{mx(lane[4], lane[0]), mx(lane[5], lane[1]), mx(lane[6], lane[2]), mx(lane[7], lane[3])}
		m = [4]float32{mx(m[0], m[2]), mx(m[1], m[3]), m[2], m[3]}
		amax := mx(m[0], m[1])
		put(0, fp16F16CRef(amax/127))
		var id float32
		if amax != 0 {
			id = 127 / amax
		}
		for j, v := range x {
			r := float32(math.RoundToEven(float64(float32(v * id))))
			c := cvt(r)
			out[2+j] = uint8(int8(min(max(c, -128), 127)))
		}
	case "iq4_nl":
		var amax, mx float32
		for _, v := range x {
			if ax := fabs(v); ax > amax {
				amax, mx = ax, v
			}
		}
		var l [32]uint8
		var d float32
		if amax < 1e-15 {
			for i := range l {
				l[i] = iq4nlEmptyCode
			}
		} else {
			d = mx / -127
			id := 1 / d
			var sumqx, sumq2 float32
			for j, v := range x {
				al := id * v
				k := bestIndexRef(al)
				l[j] = uint8(k)
				q := float32(kvaluesIQ4NL[k])
				w := v * v
				sumqx = sumqx + float32(float32(w*q)*v)
				sumq2 = sumq2 + float32(float32(w*q)*q)
			}
			d = 0
			if sumq2 > 0 {
				d = sumqx / sumq2
			}
		}
		put(0, fp16(d))
		for j := 0; j < 16; j++ {
			out[2+j] = l[j] | l[j+16]<<4
		}
	}
	return out
}

func bestIndexRef(x float32) int {
	val := kvaluesIQ4NL
	if x <= float32(val[0]) {
		return 0
	}
	if x >= float32(val[15]) {
		return 15
	}
	ml, mu := 0, 15
	for mu-ml > 1 {
		mav := (ml + mu) / 2
		if x < float32(val[mav]) {
			mu = mav
		} else {
			ml = mav
		}
	}
	if x-float32(val[mu-1]) < float32(val[mu])-x {
		return mu - 1
	}
	return mu
}

// fp16F16CRef is VCVTPS2PH's result by its definition, for the fuzzer.
func fp16F16CRef(f float32) uint16 {
	if f != f {
		b := math.Float32bits(f)
		return uint16(b>>16)&0x8000 | 0x7c00 | 0x200 | uint16(b>>13)&0x3ff
	}
	return safetensors.Float32ToFP16(f)
}

// FuzzLlamaCppBlocks: any 32 float32 bit patterns give the transliterated
// C's bytes, with and without the assembly kernels, and read back as the
// engine reads them.
func FuzzLlamaCppBlocks(f *testing.F) {
	f.Add(bytes.Repeat([]byte{0, 0, 0x80, 0x3f}, 32), uint8(0))
	f.Add(bytes.Repeat([]byte{1, 0, 0, 0}, 32), uint8(5))
	f.Add(bytes.Repeat([]byte{0xff, 0xff, 0x7f, 0x7f, 0, 0, 0xc0, 0x7f}, 16), uint8(1))
	f.Add(append(bytes.Repeat([]byte{0, 0, 0, 0x80}, 16), bytes.Repeat([]byte{0, 0, 0, 0}, 16)...), uint8(3))
	f.Fuzz(func(t *testing.T, raw []byte, which uint8) {
		buf := make([]byte, 128)
		copy(buf, raw)
		x := make([]float32, 32)
		for i := range x {
			x[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
		}
		format := LlamaCppFormats()[int(which)%len(LlamaCppFormats())]
		want := cRef(format, x)
		got := make([]byte, len(want))
		LlamaCppQuantize(format, x, got)
		portable := make([]byte, len(want))
		withPortable(func() { LlamaCppQuantize(format, x, portable) })
		if !bytes.Equal(got, want) || !bytes.Equal(portable, want) {
			t.Fatalf("%s of %x:\n got %x\nport %x\nwant %x", format, bitsOf(x), got, portable, want)
		}
		y, yp := make([]float32, 32), make([]float32, 32)
		LlamaCppDequantize(format, got, y)
		withPortable(func() { LlamaCppDequantize(format, got, yp) })
		if !bytes.Equal(bitsOf(y), bitsOf(yp)) {
			t.Fatalf("%s: dequantized values differ between the kernels", format)
		}
	})
}

// engineFuzzSpecs are what FuzzEngineCompress draws from.
var engineFuzzSpecs = []string{"llama.cpp:f16", "llama.cpp:q8_0", "llama.cpp:q5_1", "llama.cpp:q5_0", "llama.cpp:q4_1",
	"llama.cpp:q4_0", "llama.cpp:iq4_nl", "llama.cpp:q4_0/norot", "k=llama.cpp:q8_0,v=llama.cpp:iq4_nl/norot",
	"llama.cpp:q5_1,kv0=none", "none", "k=none,v=llama.cpp:q4_1+lossless", "sglang:fp4_e2m1", "sglang:fp8_e4m3/scale0.25",
	"vllm:int8_per_token_head", "k=vllm:fp8_per_token_head,v=sglang:fp4_e2m1", "vllm:nvfp4", "vllm:nvfp4_4over6/scale0.05", "k=trtllm:nvfp4/scale3,v=trtllm:nvfp4", "exllamav2:q4", "exllamav2:q6", "exllamav2:fp8",
	"trtllm:fp8/scale0.125", "k=trtllm:int8/scale0.02,v=trtllm:fp8", "exllamav3:3", "k=exllamav3:4,v=exllamav3:7", "vllm:int4_per_token_head", "ocp:mxfp4", "k=ocp:mxfp8_e4m3,v=ocp:mxfp4"}

// FuzzEngineCompress: caches of any shape, dtype and values through the
// engine formats: whatever compresses decompresses to exactly the
// restored bytes, and the only errors are the refusals.
func FuzzEngineCompress(f *testing.F) {
	f.Add(uint8(1), uint8(2), uint8(3), uint8(2), uint8(0), uint8(0), []byte("0123456789abcdef"))
	f.Add(uint8(1), uint8(1), uint8(2), uint8(4), uint8(5), uint8(2), bytes.Repeat([]byte{0xff, 0x7b, 0x00, 0x3c}, 60))
	f.Add(uint8(2), uint8(3), uint8(1), uint8(3), uint8(6), uint8(1), bytes.Repeat([]byte{1, 0, 0, 0x80}, 99))
	f.Fuzz(func(t *testing.T, b, h, tok, d32, specIdx, dtIdx uint8, values []byte) {
		dt := []safetensors.DType{safetensors.F32, safetensors.F16, safetensors.BF16}[int(dtIdx)%3]
		shape := []int{int(b%3) + 1, int(h%4) + 1, int(tok % 9), 32 * (int(d32)%8 + 1)}
		n := product(shape)
		data := make([]byte, n*dt.Size())
		for i := 0; i < len(data) && len(values) > 0; i += len(values) {
			copy(data[i:], values)
		}
		src := &safetensors.File{Tensors: []safetensors.Tensor{
			{Name: "layer_0_key", DType: dt, Shape: shape, Data: data},
			{Name: "layer_0_value", DType: dt, Shape: shape, Data: data},
		}}
		spec, err := ParseSpec(engineFuzzSpecs[int(specIdx)%len(engineFuzzSpecs)])
		if err != nil {
			t.Fatal(err)
		}
		res, err := Compress(src, Config{Spec: spec, Workers: 2})
		if err != nil {
			if !strings.Contains(err.Error(), "NaN or Inf cannot be quantized") && !strings.Contains(err.Error(), "refuses") {
				t.Fatalf("%s %v %s: %v", spec, shape, dt, err)
			}
			return
		}
		var buf bytes.Buffer
		if err := safetensors.Encode(&buf, res.Compressed); err != nil {
			t.Fatal(err)
		}
		parsed, err := safetensors.Parse(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		back, _, err := Decompress(parsed, 3)
		if err != nil {
			t.Fatal(err)
		}
		for i := range back.Tensors {
			if !bytes.Equal(back.Tensors[i].Data, res.Restored.Tensors[i].Data) {
				t.Fatalf("%s %v %s: %s decompresses differently", spec, shape, dt, back.Tensors[i].Name)
			}
		}
	})
}

// BenchmarkLlamaCpp is compress and restore (Compress, the reconstruction
// kept) of the benchmark cache per llama.cpp format, rotation on (the
// engine's default) and off; MB/s is of the source bytes. hd128 runs the
// keys' Hadamard of 128, whose scale is not a power of two.
func BenchmarkLlamaCpp(b *testing.B) {
	hd128 := randomCache(8, 15, 3, 256, 128)
	for _, format := range LlamaCppFormats() {
		for _, opt := range []string{"", "/norot", "@hd128"} {
			if format == "f16" && opt != "" {
				continue
			}
			cache, spec := benchCache, "llama.cpp:"+format+opt
			if opt == "@hd128" {
				cache, spec = hd128, "llama.cpp:"+format
			}
			s, err := ParseSpec(spec)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(format+strings.ReplaceAll(opt, "/", "_"), func(b *testing.B) {
				n := 0
				for _, t := range cache.Tensors {
					n += len(t.Data)
				}
				b.SetBytes(int64(n))
				for i := 0; i < b.N; i++ {
					if _, err := Compress(cache, Config{Spec: s, Thresholds: DefaultThresholds}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// bestIndexIQ4NL's table is best_index_int8's binary search: on every
// float32 within 300 ulps of each codebook value and midpoint (both
// signs of the steps), on the range's ends, specials and random values.
func TestBestIndexIQ4NLIsTheCs(t *testing.T) {
	var probes []float32
	for k := 0; k < 16; k++ {
		probes = append(probes, float32(kvaluesIQ4NL[k]))
		if k < 15 {
			probes = append(probes, float32(int(kvaluesIQ4NL[k])+int(kvaluesIQ4NL[k+1]))/2)
		}
	}
	probes = append(probes, 0, -0.0, 127.5, -127.5, 113.5, 1e-30, -1e-30)
	var xs []float32
	for _, p := range probes {
		v, w := p, p
		for i := 0; i < 300; i++ {
			xs = append(xs, v, w)
			v, w = math.Nextafter32(v, float32(math.Inf(1))), math.Nextafter32(w, float32(math.Inf(-1)))
		}
	}
	r := rand.New(rand.NewSource(9))
	for i := 0; i < 2_000_000; i++ {
		xs = append(xs, float32(r.NormFloat64()*80), math.Float32frombits(r.Uint32()))
	}
	xs = append(xs, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.MaxFloat32, -math.MaxFloat32)
	for _, x := range xs {
		if got, want := bestIndexIQ4NL(x), bestIndexIQ4NLC(x); got != want {
			t.Fatalf("bestIndex(%v = %#08x) = %d, the C's %d", x, math.Float32bits(x), got, want)
		}
	}
}

// fp8Of is the float8 format of a per-tensor engine format's name.
func fp8Of(name string) *fp8Format {
	if strings.HasSuffix(name, "e5m2") {
		return fp8E5M2
	}
	return fp8E4M3
}

// compressCodesCase compresses a case's tensors (want: the expected error,
// if any) and checks each tensor's one part, its codes, and its
// reconstruction against the reference's bytes; nil when it failed as
// expected.
func compressCodesCase(t *testing.T, spec string, tensors []v2Tensor, want string) *Result {
	t.Helper()
	var inputs []safetensors.Tensor
	for _, tv := range tensors {
		inputs = append(inputs, safetensors.Tensor{Name: tv.Name, DType: tv.DType, Shape: tv.Shape, Data: mustHex(t, tv.InputHex)})
	}
	res := compressVectorCase(t, spec, inputs, 3, want)
	if res == nil {
		return nil
	}
	for i, tv := range tensors {
		got := res.Compressed.Tensor(tv.Name + CodesSuffix)
		if got == nil || hex.EncodeToString(got.Data) != tv.Parts[CodesSuffix] || len(tv.Parts) != 1 {
			t.Errorf("%s: codes differ from the reference", tv.Name)
		}
		if hex.EncodeToString(res.Restored.Tensors[i].Data) != tv.RestoredHex {
			t.Errorf("%s: reconstruction differs from the reference", tv.Name)
		}
	}
	return res
}

// Every engine block format's run path (runQuantize, runDequantize: the
// chunks' path where groups are whole blocks; its own quantizeRun where it
// has one) stores and reads, on both code paths, the bytes and values of
// its block-by-block path on the portable one (the definition), for each
// cache dtype, scales 1 and calibrated, runs of 1 to 9 blocks of each
// block size it takes, with an all-zero block, outliers, values past any
// range, an Inf and a NaN.
func TestEngineRunsMatchBlocks(t *testing.T) {
	defer func() { useSIMD = haveSIMD }()
	r := rand.New(rand.NewSource(31))
	for _, e := range engines {
		for _, f := range e.formats {
			if f.quantize == nil && f.quantizeDT == nil && f.quantizeScaled == nil {
				continue // a chunk conversion (encodeAll) or a whole-tensor format
			}
			sizes := []int{f.elems}
			if f.perHead {
				sizes = []int{16, 64, 128, 256}
			}
			for _, d := range sizes {
				if f.headRule != nil && f.headRule(d) != nil {
					continue
				}
				bb := f.bytes
				if f.headSize != nil {
					bb = f.headSize(d)
				} else if f.perHead {
					bb = d*f.bits/8 + 4
				}
				for _, dt := range []safetensors.DType{safetensors.F32, safetensors.F16, safetensors.BF16} {
					for _, k := range []float32{1, 0.37} {
						for _, n := range []int{1, 3, 4, 5, 9} {
							x := make([]float32, n*d)
							for i := range x {
								x[i] = float32(r.NormFloat64() * []float64{1, 40, 1e-3}[i/d%3])
							}
							if n > 3 {
								clear(x[d : 2*d])
								x[3*d+1%d], x[2*d+5%d] = 7e4, float32(math.Inf(-1))
							}
							if n > 5 {
								x[5*d+2%d] = float32(math.NaN())
							}
							checkRun(t, f, x, d, bb, blockRun{k: k, elems: d, bytes: bb, dtype: dt})
						}
					}
				}
			}
		}
	}
}

func checkRun(t *testing.T, f *engineFormat, x []float32, d, bb int, r blockRun) {
	t.Helper()
	n := len(x) / d
	useSIMD = false // the definition: the Go loops, a block at a time
	want, wantY := make([]byte, n*bb), make([]float32, n*d)
	wantNF, wantSat := false, 0
	for h := 0; h < n; h++ {
		xb, db, yb := x[h*d:(h+1)*d], want[h*bb:(h+1)*bb], wantY[h*d:(h+1)*d]
		var nf bool
		switch {
		case f.quantizeScaled != nil:
			var s int
			nf, s = f.quantizeScaled(xb, db, r.k)
			wantSat += s
		case f.quantizeDT != nil:
			nf = f.quantizeDT(xb, db, r.dtype)
		default:
			nf = f.quantize(xb, db)
		}
		wantNF = wantNF || nf
		if f.dequantizeScaled != nil {
			f.dequantizeScaled(db, yb, r.k)
		} else {
			f.dequantize(db, yb)
		}
	}
	for _, simd := range []bool{haveSIMD, false} {
		useSIMD = simd
		got, gotY := make([]byte, n*bb), make([]float32, n*d)
		nf, sat := f.runQuantize(x, got, r)
		f.runDequantize(want, gotY, r)
		if !slices.Equal(got, want) || nf != wantNF || sat != wantSat {
			t.Errorf("%s d=%d n=%d %+v simd=%v: the run stores other bytes (nonFinite %v, saturated %d; want %v, %d)",
				f.name, d, n, r, simd, nf, sat, wantNF, wantSat)
		}
		if !slices.Equal(bitsOf(gotY), bitsOf(wantY)) {
			t.Errorf("%s d=%d n=%d %+v simd=%v: the run reads other values", f.name, d, n, r, simd)
		}
	}
}
