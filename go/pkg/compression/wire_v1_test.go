package compression

import (
	"bytes"
	"os"
	"testing"

	"kvlib/pkg/safetensors"
)

// Streams of the wire coder's first version (model version 1: four
// interleaved states a chunk), written by that code on
// wireCache(41, BF16, 1, 2, 1100, 64) and committed under testdata, still
// decode to the scheme's reconstruction, on the assembly and the Go paths.
func TestWireDecodesVersion1Streams(t *testing.T) {
	defer func() { useSIMD = haveSIMD }()
	src := wireCache(41, safetensors.BF16, 1, 2, 1100, 64)
	for _, name := range []string{"int4", "kivi2", "rot3"} {
		data, err := os.ReadFile("testdata/wire_v1_" + name + ".kvq")
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
		wired := 0
		for _, ti := range h.Tensors {
			for _, s := range ti.Wire {
				if m := f.Tensor(ti.Name + s + WireModelSuffix); m == nil || len(m.Data) == 0 || m.Data[0] != 1 {
					t.Fatalf("%s: %s%s is not a version 1 model", name, ti.Name, s)
				}
				wired++
			}
		}
		if wired == 0 {
			t.Fatalf("%s: no wire-coded part", name)
		}
		spec, _ := ParseSpec(name)
		plain, err := Compress(src, Config{Spec: spec})
		if err != nil {
			t.Fatal(err)
		}
		for _, simd := range []bool{haveSIMD, false} {
			useSIMD = simd
			back, _, err := Decompress(f, 2)
			if err != nil {
				t.Fatalf("%s (simd %v): %v", name, simd, err)
			}
			for i := range back.Tensors {
				if !bytes.Equal(back.Tensors[i].Data, plain.Restored.Tensors[i].Data) {
					t.Fatalf("%s (simd %v): %s decodes differently", name, simd, back.Tensors[i].Name)
				}
			}
		}
	}
}
