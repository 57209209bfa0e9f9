package compression

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"kvlib/pkg/safetensors"
)

// vectorsV2Path is the shared test-vector file of every scheme, made by
// tests/make_vectors_v2.py (ggml blocks by the gguf package's quantizer).
const vectorsV2Path = "../../../tests/vectors/kvq_v2_vectors.json"

type v2Tensor struct {
	Name        string            `json:"name"`
	DType       safetensors.DType `json:"dtype"`
	Shape       []int             `json:"shape"`
	InputHex    string            `json:"input_hex"`
	Outliers    int               `json:"outliers"`
	Parts       map[string]string `json:"parts"`
	RestoredHex string            `json:"restored_hex"`
}

type v2Case struct {
	Name    string     `json:"name"`
	Spec    string     `json:"spec"`
	Tensors []v2Tensor `json:"tensors"`
	Error   string     `json:"error"`
}

func loadV2Vectors(t *testing.T) []v2Case {
	t.Helper()
	data, err := os.ReadFile(vectorsV2Path)
	if err != nil {
		t.Fatalf("shared test vectors: %v", err)
	}
	var v struct{ Cases []v2Case }
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Cases) < 25 {
		t.Fatalf("only %d v2 vector cases", len(v.Cases))
	}
	return v.Cases
}

// compressVectorCase compresses a shared-vector case's inputs with its
// spec (canonical as the vectors write it) on workers goroutines (0: one
// per CPU). A case that expects an error must get one naming the tensor
// and containing wantErr, and then returns nil.
func compressVectorCase(t *testing.T, specText string, inputs []safetensors.Tensor, workers int, wantErr string) *Result {
	t.Helper()
	spec, err := ParseSpec(specText)
	if err != nil {
		t.Fatal(err)
	}
	if spec.String() != specText {
		t.Errorf("canonical spec %q, vectors say %q", spec, specText)
	}
	res, err := Compress(&safetensors.File{Tensors: inputs}, Config{Spec: spec, Thresholds: DefaultThresholds, Workers: workers})
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) || !strings.Contains(err.Error(), `tensor "`) {
			t.Fatalf("error = %v, want one naming the tensor and containing %q", err, wantErr)
		}
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestSharedVectorsV2(t *testing.T) {
	for _, vc := range loadV2Vectors(t) {
		t.Run(vc.Name, func(t *testing.T) {
			var inputs []safetensors.Tensor
			for _, tv := range vc.Tensors {
				inputs = append(inputs, safetensors.Tensor{Name: tv.Name, DType: tv.DType, Shape: tv.Shape, Data: mustHex(t, tv.InputHex)})
			}
			res := compressVectorCase(t, vc.Spec, inputs, 0, vc.Error)
			if res == nil {
				return
			}
			var storedBytes int
			for i, tv := range vc.Tensors {
				for suffix, want := range tv.Parts {
					got := res.Compressed.Tensor(tv.Name + suffix)
					if got == nil {
						t.Fatalf("%s%s missing", tv.Name, suffix)
					}
					if hex.EncodeToString(got.Data) != want {
						t.Errorf("%s%s differs from the reference\n got %x\nwant %s", tv.Name, suffix, got.Data, want)
					}
					storedBytes += len(got.Data)
				}
				if got := hex.EncodeToString(res.Restored.Tensors[i].Data); got != tv.RestoredHex {
					t.Errorf("%s: reconstruction differs from the reference\n got %s\nwant %s", tv.Name, got, tv.RestoredHex)
				}
				if res.Report.Tensors[i].Outliers != tv.Outliers {
					t.Errorf("%s: %d outliers, want %d", tv.Name, res.Report.Tensors[i].Outliers, tv.Outliers)
				}
			}
			if len(res.Compressed.Tensors) != countParts(vc) {
				t.Errorf("compressed file holds %d tensors, the reference %d", len(res.Compressed.Tensors), countParts(vc))
			}
			if int(res.Report.CompressedSizeBytes) != storedBytes {
				t.Errorf("compressed_size_bytes %d, stored parts are %d bytes", res.Report.CompressedSizeBytes, storedBytes)
			}
			// Decompressing the file gives the same bytes, through the encoder.
			var buf bytes.Buffer
			if err := safetensors.Encode(&buf, res.Compressed); err != nil {
				t.Fatal(err)
			}
			parsed, err := safetensors.Parse(buf.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			back, hdr, err := Decompress(parsed, 3)
			if err != nil {
				t.Fatal(err)
			}
			if hdr.Spec != vc.Spec {
				t.Errorf("header spec %q, want %q", hdr.Spec, vc.Spec)
			}
			for i := range back.Tensors {
				if !bytes.Equal(back.Tensors[i].Data, res.Restored.Tensors[i].Data) {
					t.Errorf("%s: Decompress differs from Compress's reconstruction", back.Tensors[i].Name)
				}
			}
		})
	}
}

func countParts(vc v2Case) int {
	n := 0
	for _, tv := range vc.Tensors {
		n += len(tv.Parts)
	}
	return n
}

// A version 1 file (one sym scheme in kvq.bits and kvq.group_size, no
// per-tensor scheme) still decompresses, to the same bytes.
func TestVersion1FilesStillDecompress(t *testing.T) {
	src := randomCache(9, 2, 3, 40, 64)
	res, err := Compress(src, symConfig(3, 32, 0))
	if err != nil {
		t.Fatal(err)
	}
	v1 := &safetensors.File{Tensors: res.Compressed.Tensors, Metadata: map[string]string{"model_name": "synthetic"}}
	var infos []map[string]any
	for _, ti := range src.Tensors {
		infos = append(infos, map[string]any{"name": ti.Name, "dtype": ti.DType, "shape": ti.Shape})
	}
	js, _ := json.Marshal(infos)
	v1.Metadata["kvq.format"], v1.Metadata["kvq.version"] = "kvq", "1"
	v1.Metadata["kvq.bits"], v1.Metadata["kvq.group_size"], v1.Metadata["kvq.sparsity"] = "3", "32", "0"
	v1.Metadata["kvq.tensors"] = string(js)
	back, hdr, err := Decompress(v1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if hdr.Version != 1 || hdr.Spec != "sym3/g32" || back.Metadata["model_name"] != "synthetic" {
		t.Errorf("header %+v", hdr)
	}
	for i := range back.Tensors {
		if !bytes.Equal(back.Tensors[i].Data, res.Restored.Tensors[i].Data) {
			t.Errorf("%s: v1 decompress differs", back.Tensors[i].Name)
		}
	}
}

func TestParseSpecRoundTripsAndRejects(t *testing.T) {
	for _, name := range PresetNames() {
		s, _ := Preset(name)
		back, err := ParseSpec(s.String())
		if err != nil || !back.Equal(s) || s.Name() != name {
			t.Errorf("%s: %q parses to %+v (%v), name %q", name, s, back, err, s.Name())
		}
		js, _ := json.Marshal(s)
		if back, err := ParseSpec(string(js)); err != nil || !back.Equal(s) {
			t.Errorf("%s: JSON %s parses to %+v (%v)", name, js, back, err)
		}
	}
	bad := []struct{ spec, want string }{
		{"", "unknown scheme"},
		{"int5", "unknown scheme"},
		{"sym1", "bits 1"},
		{"asym9", "bits 9"},
		{"sym4/g0", "group size 0"},
		{"sym4/g7", "group size 7"},
		{"sym4/g2147483648", "not an integer"},
		{"sym4/g1152921504606846976", "not an integer"},
		{"sym4/out1", "outlier fraction 1"},
		{"sym4/outNaN", "not a finite number"},
		{"sym4/sp-0.5", "sparsity -0.5"},
		{"sym4/res-1", "not an integer"},
		{"sym4/channel/rot", "rotation works along the token axis only"},
		{"q4_0/g64", "q4_0 is 4-bit blocks of 32"},
		{"q8_0/channel", "q8_0 is 8-bit blocks of 32"},
		{"kivi4/g32", "differs by role"},
		{"k=int4", "both k= and v="},
		{"k=int4,k=int8", "once each"},
		{"k=int4,v=int4,x=1", "once each"},
		{"sym4/foo", "unknown option"},
		{`{"key": {"method": "sym", "bits": 0}}`, "bits 0"},
		{`{"key": {}, "value": {}, "extra": 1}`, "unknown field"},
		{"int4,k3=sym9", "layer 3 key scheme: bits 9"},
		{"int4,k5-3=int8", "out of order"},
		{"int4,x3=int8", "want k=SCHEME"},
		{"int4,k3=int8,v=int4", "come before the layers"},
		{"k=int4,k0=int8,v=int4", "come before the layers"},
		{"int4,k3", "unknown scheme"},
		{"int4,k99999999=int8", "out of order or beyond"},
		{`{"key": {"method": "sym", "bits": 4, "group": 64, "axis": "token"}, "value": {"method": "sym", "bits": 4, "group": 64, "axis": "token"}, "layers": [{"layer": 1, "role": "keys", "scheme": {}}]}`, "unknown role"},
		{"lm5", "bits 5 out of range [2, 4] for lm"},
	}
	for _, tc := range bad {
		if _, err := ParseSpec(tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseSpec(%q) = %v, want an error containing %q", tc.spec, err, tc.want)
		}
	}
}

// A JSON spec may leave fields out: each takes the string grammar's
// default, so the JSON and the string forms parse to the same Spec and
// print the same canonical spec.
func TestParseSpecJSONDefaults(t *testing.T) {
	cases := []struct{ json, str string }{
		{`{}`, "int4"},
		{`{"key": {}, "value": {}}`, "sym4/g64"},
		{`{"key": null, "value": {"bits": null}}`, "sym4"},
		{`{"key": {"method": "asym", "axis": "channel"}}`, "k=asym4/g64/channel,v=int4"},
		{`{"key": {"method": "asym", "axis": "channel"}, "value": {"method": "asym"}}`, "kivi4"},
		{`{"key": {"method": "asym", "bits": 2, "group": 32, "axis": "channel"}, "value": {"method": "asym", "bits": 2, "group": 32}}`, "kivi2"},
		{`{"key": {"bits": 8}, "value": {"bits": 8}}`, "int8"},
		{`{"key": {"rotate": true}, "value": {"rotate": true}}`, "rot4"},
		{`{"key": {"method": "symf", "bits": 3, "rotate": true}, "value": {"method": "symf", "bits": 3, "rotate": true}}`, "rot3"},
		{`{"key": {"method": "lm", "rotate": true}, "value": {"method": "lm", "rotate": true}}`, "lm4rot"},
		{`{"key": {"method": "q4_0"}, "value": {"method": "q4_0"}}`, "q4_0"},
		{`{"key": {"method": "q5_1", "bits": 5, "group": 32, "axis": "token"}, "value": {"method": "q8_0"}}`, "k=q5_1,v=q8_0"},
		{`{"key": {"method": "q8_0", "outliers": 0.01, "residual": 16}}`, "k=q8_0/out0.01/res16,v=int4"},
		{`{"key": {"group": 32, "sparsity": 0.25}, "value": {"method": "asym", "bits": 3, "residual": 128}}`, "k=sym4/g32/sp0.25,v=asym3/g64/res128"},
		{`{"key": {"axis": "token", "rotate": false, "outliers": 0, "residual": 0, "sparsity": 0}}`, "int4"},
		{`{"lossless": true}`, "int4+lossless"},
		{`{"value": {"method": "q8_0"}}+lossless`, "k=int4,v=q8_0+lossless"},
		{`{"key": {"method": "lm", "bits": 3, "rotate": true}, "value": {"method": "lm", "bits": 3, "rotate": true},
		  "layers": [{"layer": 0, "role": "key", "scheme": {"method": "q8_0"}}, {"layer": 1, "role": "key", "scheme": {"method": "q8_0"}},
		             {"layer": 0, "role": "value", "scheme": {"method": "lm", "rotate": true}}]}`, "lm3rot,k0-1=q8_0,v0=lm4rot"},
		{`{"layers": [{"layer": 2, "role": "value", "scheme": {}}, {"layer": 3, "role": "value", "scheme": {"bits": 8}}]}`, "int4,v3=int8"},
		{`{"layers": null}`, "int4"},
	}
	for _, tc := range cases {
		fromJSON, err := ParseSpec(tc.json)
		if err != nil {
			t.Errorf("ParseSpec(%s): %v", tc.json, err)
			continue
		}
		fromString, err := ParseSpec(tc.str)
		if err != nil {
			t.Fatalf("ParseSpec(%q): %v", tc.str, err)
		}
		if !fromJSON.Equal(fromString) || fromJSON.String() != fromString.String() || fromJSON.Name() != fromString.Name() {
			t.Errorf("ParseSpec(%s) = %q (%+v), want %q (%+v)", tc.json, fromJSON, fromJSON, fromString, fromString)
		}
	}
}

// A JSON spec's mistakes are one-line errors naming the field by its path.
func TestParseSpecJSONErrors(t *testing.T) {
	cases := []struct{ spec, want string }{
		{`{"kee": {}}`, `unknown field "kee" (want key, value, layers, heads, lossless, wire)`},
		{`{"key": {"bitz": 4}}`, `unknown field "key.bitz" (want method, bits, group, axis, rotate, outliers, residual, sparsity, scale)`},
		{`{"key": {"Method": "sym"}}`, `unknown field "key.Method"`},
		{`{"layers": [{"layer": 0, "role": "key", "scheme": {}, "x": 1}]}`, `unknown field "layers[0].x" (want layer, role, scheme)`},
		{`{"layers": [{"layer": 0, "role": "key", "scheme": {"grup": 8}}]}`, `unknown field "layers[0].scheme.grup"`},
		{`{"key": {"bits": "4"}}`, `field "key.bits": want an integer, got "4"`},
		{`{"key": {"bits": 4.5}}`, `field "key.bits": want an integer, got 4.5`},
		{`{"key": {"group": 1e30}}`, `field "key.group": want an integer, got 1e30`},
		{`{"value": {"method": 4}}`, `field "value.method": want a string, got 4`},
		{`{"value": {"axis": ["token"]}}`, `field "value.axis": want a string, got an array`},
		{`{"value": {"rotate": "yes"}}`, `field "value.rotate": want true or false, got "yes"`},
		{`{"value": {"outliers": "0.1"}}`, `field "value.outliers": want a number, got "0.1"`},
		{`{"value": {"sparsity": {}}}`, `field "value.sparsity": want a number, got an object`},
		{`{"value": {"residual": -1.5}}`, `field "value.residual": want an integer, got -1.5`},
		{`{"lossless": 1}`, `field "lossless": want true or false, got 1`},
		{`{"key": "int4"}`, `field "key": want an object, got "int4"`},
		{`{"layers": {}}`, `field "layers": want an array, got an object`},
		{`{"layers": [3]}`, `field "layers[0]": want an object, got 3`},
		{`{"layers": [{"layer": "0", "role": "key", "scheme": {}}]}`, `field "layers[0].layer": want an integer, got "0"`},
		{`{"layers": [{"role": "key", "scheme": {}}]}`, `field "layers[0].layer" is required`},
		{`{"layers": [{"layer": 0, "scheme": {}}]}`, `field "layers[0].role" is required`},
		{`{"layers": [{"layer": 0, "role": "key", "scheme": null}]}`, `field "layers[0].scheme" is required`},
		{`{"layers": [{"layer": 0, "role": "key", "scheme": []}]}`, `field "layers[0].scheme": want an object, got an array`},
		{`{"key": {"bits": "` + strings.Repeat("x", 100) + `"}}`, `got "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...`},
		{`{"key": {}} x`, "invalid character 'x' after top-level value"},
		{`{"key": `, "JSON: unexpected end of JSON input"},
		// Given fields are not defaulted: an explicit zero or a wrong value
		// is the validator's error.
		{`{"key": {"bits": 0}}`, "key scheme: bits 0 out of range [2, 8] for sym"},
		{`{"value": {"group": 0}}`, "value scheme: group size 0"},
		{`{"key": {"method": ""}}`, `key scheme: unknown method ""`},
		{`{"key": {"method": "lm"}, "value": {"method": "lm", "bits": 8}}`, "value scheme: bits 8 out of range [2, 4] for lm"},
		{`{"key": {"method": "q4_0", "group": 64}}`, "key scheme: q4_0 is 4-bit blocks of 32"},
		{`{"key": {"method": "q8_0", "bits": 4}}`, "key scheme: q8_0 is 8-bit blocks of 32"},
		{`{"key": {"method": "q8_0", "axis": "channel"}}`, "key scheme: q8_0 is 8-bit blocks of 32"},
		{`{"key": {"axis": "row"}}`, `key scheme: unknown axis "row"`},
		{`{"key": {"axis": "channel", "rotate": true}}`, "rotation works along the token axis only"},
		{`{"layers": [{"layer": -1, "role": "key", "scheme": {"bits": 8}}]}`, "layer -1 out of range"},
		{`{"layers": [{"layer": 1, "role": "both", "scheme": {}}]}`, `unknown role "both"`},
	}
	for _, tc := range cases {
		_, err := ParseSpec(tc.spec)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.ContainsAny(err.Error(), "\n\r") {
			t.Errorf("ParseSpec(%s) = %v, want one line containing %q", tc.spec, err, tc.want)
		}
	}
}

// Overrides parse in every spelling, canonicalise (keys before values, by
// layer, runs as ranges, defaults dropped, the last setting wins) and round
// trip through the string and JSON forms.
func TestLayerOverrides(t *testing.T) {
	cases := []struct{ in, want string }{
		{"lm3rot,k0-1=q8_0,v0=lm4rot", "lm3/g64/rot,k0-1=q8_0,v0=lm4/g64/rot"},
		{"lm3rot,v0=lm4rot,k1=q8_0,k0=q8_0", "lm3/g64/rot,k0-1=q8_0,v0=lm4/g64/rot"},
		{"int4,kv2-4=int8", "sym4/g64,k2-4=sym8/g64,v2-4=sym8/g64"},
		{"int4,k2-4=int8,k3=int4", "sym4/g64,k2=sym8/g64,k4=sym8/g64"},
		{"int4,k0=int4", "sym4/g64"},
		{"kivi2,k0=q8_0", "k=asym2/g32/channel,v=asym2/g32,k0=q8_0"},
		{"k=int4,v=q8_0,v7=int4+lossless", "k=sym4/g64,v=q8_0,v7=sym4/g64+lossless"},
		{"int4, k1 = kivi4", "sym4/g64,k1=asym4/g64/channel"},
	}
	checkCanonical(t, cases)
	s, _ := ParseSpec("lm3rot,k0-1=q8_0,v0=lm4rot")
	for name, want := range map[string]string{"layer_0_key": "q8_0", "layer_1_key": "q8_0", "layer_2_key": "lm3/g64/rot",
		"layer_0_value": "lm4/g64/rot", "layer_1_value": "lm3/g64/rot", "other": "lm3/g64/rot", "layer_0_keys": "lm3/g64/rot"} {
		if got := s.For(name).String(); got != want {
			t.Errorf("For(%q) = %s, want %s", name, got, want)
		}
	}
}

// checkCanonical checks that each spec parses to its canonical string,
// which parses back to it, as does its JSON form.
func checkCanonical(t *testing.T, cases []struct{ in, want string }) {
	t.Helper()
	for _, tc := range cases {
		s, err := ParseSpec(tc.in)
		if err != nil || s.String() != tc.want {
			t.Errorf("ParseSpec(%q) = %q, %v; want %q", tc.in, s, err, tc.want)
			continue
		}
		back, err := ParseSpec(s.String())
		js, _ := json.Marshal(s)
		fromJSON, err2 := ParseSpec(string(js))
		if err != nil || err2 != nil || !back.Equal(s) || !fromJSON.Equal(s) {
			t.Errorf("%q does not round trip: %v %v %s", tc.in, err, err2, js)
		}
	}
}

// An override for a layer the cache does not have is an error, not a no-op.
func TestOverrideOfAMissingLayer(t *testing.T) {
	s, _ := ParseSpec("int4,k3=int8")
	_, err := Compress(randomCache(1, 2, 1, 4, 64), Config{Spec: s, Thresholds: DefaultThresholds})
	if err == nil || !strings.Contains(err.Error(), "layer 3 key") {
		t.Errorf("got %v, want an error naming layer 3 key", err)
	}
}

func ExampleParseSpec() {
	s, _ := ParseSpec("kivi4")
	fmt.Println(s)
	fmt.Println(s.Key.NominalBits(), s.Value.NominalBits())
	s, _ = ParseSpec("k=int4/out0.01,v=q8_0")
	fmt.Println(s.For("layer_3_key"), s.For("layer_3_value"))
	// Output:
	// k=asym4/g64/channel,v=asym4/g64
	// 4.5 4.5
	// sym4/g64/out0.01 q8_0
}

func ExampleSpec_For() {
	s, _ := ParseSpec("lm3rot,k0=q8_0")
	fmt.Println(s)
	fmt.Println(s.For("layer_0_key"), s.For("layer_1_key"), s.For("layer_0_value"))
	// Output:
	// lm3/g64/rot,k0=q8_0
	// q8_0 lm3/g64/rot lm3/g64/rot
}
