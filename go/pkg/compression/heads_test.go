package compression

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"kvlib/pkg/safetensors"
)

func TestHeadOverridesParse(t *testing.T) {
	cases := []struct{ in, want string }{
		{"int4,k3h1=lm2rot", "sym4/g64,k3h1=lm2/g64/rot"},
		{"int4,k3h1=int4", "sym4/g64"},                                   // the slot's own scheme: no override
		{"int4,k2=int8,k2h0=int8", "sym4/g64,k2=sym8/g64"},               // the layer override's
		{"int4,k2=int8,k2h0=int4", "sym4/g64,k2=sym8/g64,k2h0=sym4/g64"}, // over the layer override
		{"int4,kv0-2h1=q8_0", "sym4/g64,k0-2h1=q8_0,v0-2h1=q8_0"},
		{"int4,k1h2=int8,k0h2=int8,k0h0=rot3", "sym4/g64,k0h0=symf3/g64/rot,k0-1h2=sym8/g64"},
		{"int4,k0h1=q8_0,k0h1=int8", "sym4/g64,k0h1=sym8/g64"}, // a later part wins
		{"kivi2,v5h0=lm2rot+wire", "k=asym2/g32/channel,v=asym2/g32,v5h0=lm2/g64/rot+wire"},
		// the slot's scheme is its last override, as the canonical form keeps it
		{"int4,k3=llama.cpp:q4_0,k3=sym4/g32,k3h1=sym2", "sym4/g64,k3=sym4/g32,k3h1=sym2/g64"},
	}
	checkCanonical(t, cases)
	for _, tc := range []struct{ in, want string }{
		{"int4,k0h1=llama.cpp:q4_0", "llama.cpp:q4_0 is an engine's format"},
		{"llama.cpp:q4_0,k0h1=int4", "llama.cpp:q4_0 is an engine's format"},
		{"int4,k0h4096=int8", "head 4096 beyond 4095"},
		{"int4,k3=sym4/g32,k3=llama.cpp:q4_0,k3h1=sym2", "llama.cpp:q4_0 is an engine's format"},
		{"int4,k0h=int8", "each optionally for one head"},
		{`{"heads": [{"layer": 0, "role": "key", "scheme": {}}]}`, `field "heads[0].head" is required`},
		{`{"heads": [{"layer": 0, "role": "key", "head": -1, "scheme": {}}]}`, "layer 0 head -1: out of range"},
	} {
		if _, err := ParseSpec(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("ParseSpec(%q) = %v, want one line containing %q", tc.in, err, tc.want)
		}
	}
}

// restoredOf compresses src under spec and returns the reconstruction by tensor name.
func restoredOf(t *testing.T, src *safetensors.File, spec string) (*Result, map[string][]byte) {
	t.Helper()
	s, err := ParseSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Compress(src, Config{Spec: s, Thresholds: DefaultThresholds})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, x := range res.Restored.Tensors {
		out[x.Name] = x.Data
	}
	return res, out
}

// A head stored under its override is exactly that head of the tensor stored
// whole under the override's scheme; the other heads are the slot's; the file
// decompresses to the same tensors, and the report shows the tensor once.
func TestHeadPartsAreTheWholeTensorsCodes(t *testing.T) {
	for _, dt := range []safetensors.DType{safetensors.F32, safetensors.BF16} {
		src := wireCache(7, dt, 2, 3, 130, 64)
		for _, suffix := range []string{"", LosslessSuffix, WireSuffix} {
			mixed := "int4,k1h2=lm2rot,v0h0=q8_0,v0h1=kivi2" + suffix
			res, got := restoredOf(t, src, mixed)
			_, int4 := restoredOf(t, src, "int4")
			_, lm2 := restoredOf(t, src, "lm2rot")
			_, q8 := restoredOf(t, src, "q8_0")
			_, kivi := restoredOf(t, src, "kivi2")
			head := func(b []byte, h int) []byte { n := len(b) / 3; return b[h*n : (h+1)*n] }
			for name, want := range map[string][][]byte{
				"layer_1_key":   {head(int4["layer_1_key"], 0), head(int4["layer_1_key"], 1), head(lm2["layer_1_key"], 2)},
				"layer_0_value": {head(q8["layer_0_value"], 0), head(kivi["layer_0_value"], 1), head(int4["layer_0_value"], 2)},
			} {
				for h, w := range want {
					if !bytes.Equal(head(got[name], h), w) {
						t.Errorf("%s %s: %s head %d differs from its scheme's whole-tensor reconstruction", dt, mixed, name, h)
					}
				}
			}
			if !bytes.Equal(got["layer_0_key"], int4["layer_0_key"]) || len(res.Restored.Tensors) != 4 {
				t.Errorf("%s: the tensors without a head override changed, or the parts were not joined", mixed)
			}
			var buf bytes.Buffer
			if err := safetensors.Encode(&buf, res.Compressed); err != nil {
				t.Fatal(err)
			}
			f, err := safetensors.Parse(buf.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			back, hdr, err := Decompress(f, 2)
			if err != nil {
				t.Fatal(err)
			}
			if hdr.Version != HeadsFormatVersion || len(hdr.Tensors) != 2+3+3 {
				t.Errorf("header: version %d, %d tensors", hdr.Version, len(hdr.Tensors))
			}
			for i, x := range back.Tensors {
				r := res.Restored.Tensors[i]
				if x.Name != r.Name || !bytes.Equal(x.Data, r.Data) || len(x.Shape) != 4 || x.Shape[1] != 3 {
					t.Errorf("%s: decompressed %s %v differs from the compressor's reconstruction", mixed, x.Name, x.Shape)
				}
			}
			var row *TensorReport
			for i := range res.Report.Tensors {
				if res.Report.Tensors[i].Name == "layer_1_key" {
					row = &res.Report.Tensors[i]
				}
			}
			if len(res.Report.Tensors) != 4 || row == nil || len(row.HeadSums) != 3 ||
				row.Scheme != "h0=sym4/g64|h1=sym4/g64|h2=lm2/g64/rot" || row.Shape[1] != 3 {
				t.Errorf("%s: report rows %d, layer_1_key %+v", mixed, len(res.Report.Tensors), row)
			}
		}
	}
	// no head override: the file stays version 2, as before
	res, _ := restoredOf(t, wireCache(7, safetensors.F32, 1, 2, 16, 64), "int4")
	if res.Compressed.Metadata[metaVersion] != "2" {
		t.Errorf("a file without head parts is version %s", res.Compressed.Metadata[metaVersion])
	}
}

func TestHeadOverridesRefuseWhatTheTensorCannotTake(t *testing.T) {
	for _, tc := range []struct {
		spec, want string
	}{
		{"int4,k0h3=int8", `tensor "layer_0_key": the scheme names head 3, but the tensor has 3 heads`},
		{"int4,k4h0=int8", "the scheme names layer 4 key head 0, but there is no tensor layer_4_key"},
	} {
		s, _ := ParseSpec(tc.spec)
		_, err := Compress(randomCache(1, 2, 3, 8, 64), Config{Spec: s})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.spec, err, tc.want)
		}
	}
	flat := &safetensors.File{}
	x, _ := safetensors.NewFloatTensor("layer_0_key", safetensors.F32, []int{2, 3, 4, 64}, make([]float32, 2*3*4*64))
	flat.Tensors = append(flat.Tensors, x)
	s, _ := ParseSpec("int4,k0h1=int8")
	if _, err := Compress(flat, Config{Spec: s}); err == nil || !strings.Contains(err.Error(), "needs a [1, heads, tokens, head_dim] tensor") {
		t.Errorf("batch of 2: got %v", err)
	}
	wide := &safetensors.File{}
	x, _ = safetensors.NewFloatTensor("layer_0_key", safetensors.F32, []int{1, MaxHead + 2, 1, 8}, make([]float32, (MaxHead+2)*8))
	wide.Tensors = append(wide.Tensors, x)
	if _, err := Compress(wide, Config{Spec: s}); err == nil || !strings.Contains(err.Error(), "at most 4096 heads, not 4097") {
		t.Errorf("4097 heads: got %v", err)
	}
}

// A slot an engine keeps exact (vLLM's TurboQuant boundary layers) is exact
// whole: its head overrides go with it; a boundary slot the spec overrides
// keeps them.
func TestHeadOverridesOnLayersAnEngineKeepsExact(t *testing.T) {
	src := randomCache(5, 6, 2, 16, 64)
	_, exact := restoredOf(t, src, "none")
	_, int8 := restoredOf(t, src, "int8")
	_, int4 := restoredOf(t, src, "int4")
	_, got := restoredOf(t, src, "k=vllm:turboquant_k8,v=int4,v0h1=int8,v1=int8,v1h1=int4")
	if !bytes.Equal(got["layer_0_value"], exact["layer_0_value"]) {
		t.Errorf("layer 0's values: the boundary rule keeps them exact, head overrides and all")
	}
	half := len(got["layer_1_value"]) / 2
	if !bytes.Equal(got["layer_1_value"][:half], int8["layer_1_value"][:half]) ||
		!bytes.Equal(got["layer_1_value"][half:], int4["layer_1_value"][half:]) {
		t.Errorf("layer 1's values, overridden by the spec: head 0 its override, head 1 its head override")
	}
}

// A header's head parts are checked before anything is decoded: one-line
// errors naming the whole tensor.
func TestHeadPartsRejectBadHeaders(t *testing.T) {
	res, _ := restoredOf(t, randomCache(2, 1, 3, 8, 64), "int4,k0h1=int8")
	var infos []TensorInfo
	if err := json.Unmarshal([]byte(res.Compressed.Metadata[metaTensors]), &infos); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(f *safetensors.File, in []TensorInfo) []TensorInfo
		want   string
	}{
		{"version 2", func(f *safetensors.File, in []TensorInfo) []TensorInfo { f.Metadata[metaVersion] = "2"; return in },
			`tensor "layer_0_key": head parts in a version 2 file`},
		{"a head twice", func(_ *safetensors.File, in []TensorInfo) []TensorInfo {
			in[1].Head, in[1].Name = 0, "layer_0_key.h0"
			return in
		},
			`tensor "layer_0_key.h0": recorded twice in kvq.tensors`},
		{"a head missing", func(_ *safetensors.File, in []TensorInfo) []TensorInfo {
			in[2].Head, in[2].Name = 5, "layer_0_key.h5"
			return in
		},
			`tensor "layer_0_key": head parts do not hold heads 0 to 2 once each (head 5)`},
		{"a wrong name", func(_ *safetensors.File, in []TensorInfo) []TensorInfo { in[1].Head = 2; return in },
			`tensor "layer_0_key": head part "layer_0_key.h1" records head 2`},
		{"a shape", func(_ *safetensors.File, in []TensorInfo) []TensorInfo { in[1].Shape = []int{1, 2, 8, 64}; return in },
			"not [1, 1, tokens, head_dim]"},
		{"whole and parts", func(_ *safetensors.File, in []TensorInfo) []TensorInfo {
			in[3].Name, in[3].Of = "layer_0_key", ""
			return in
		}, `tensor "layer_0_key": recorded both whole and as head parts`},
	} {
		in := append([]TensorInfo(nil), infos...)
		for i := range in {
			in[i].Shape = append([]int(nil), in[i].Shape...)
		}
		f := &safetensors.File{Metadata: map[string]string{}, Tensors: res.Compressed.Tensors}
		for k, v := range res.Compressed.Metadata {
			f.Metadata[k] = v
		}
		b, _ := json.Marshal(tc.mutate(f, in))
		f.Metadata[metaTensors] = string(b)
		_, _, err := Decompress(f, 1)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: got %v, want one line containing %q", tc.name, err, tc.want)
		}
	}
}

func ExampleSpec_heads() {
	s, _ := ParseSpec("lm2rot,k3h1=rot3,k4h1=rot3")
	fmt.Println(s)
	// Output:
	// lm2/g64/rot,k3-4h1=symf3/g64/rot
}
