package compression

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
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

func TestSharedVectorsV2(t *testing.T) {
	for _, vc := range loadV2Vectors(t) {
		t.Run(vc.Name, func(t *testing.T) {
			spec, err := ParseSpec(vc.Spec)
			if err != nil {
				t.Fatal(err)
			}
			if spec.String() != vc.Spec {
				t.Errorf("canonical spec %q, vectors say %q", spec, vc.Spec)
			}
			src := &safetensors.File{}
			for _, tv := range vc.Tensors {
				src.Tensors = append(src.Tensors, safetensors.Tensor{Name: tv.Name, DType: tv.DType, Shape: tv.Shape, Data: mustHex(t, tv.InputHex)})
			}
			res, err := Compress(src, Config{Spec: spec, Thresholds: DefaultThresholds})
			if vc.Error != "" {
				if err == nil || !strings.Contains(err.Error(), vc.Error) || !strings.Contains(err.Error(), `tensor "`) {
					t.Fatalf("error = %v, want one naming the tensor and containing %q", err, vc.Error)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
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
