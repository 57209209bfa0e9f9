package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvlib/pkg/safetensors"
)

func writeCache(t *testing.T, dir string) string {
	t.Helper()
	var tensors []safetensors.Tensor
	for _, name := range []string{"layer_0_key", "layer_0_value"} {
		x := make([]float32, 2*8*64)
		for i := range x {
			x[i] = float32(math.Sin(float64(i)*0.37)) * 2
		}
		tn, err := safetensors.NewFloatTensor(name, safetensors.F32, []int{1, 2, 8, 64}, x)
		if err != nil {
			t.Fatal(err)
		}
		tensors = append(tensors, tn)
	}
	p := filepath.Join(dir, "kv.safetensors")
	if err := safetensors.WriteFile(p, &safetensors.File{Metadata: map[string]string{"model_name": "test"}, Tensors: tensors}); err != nil {
		t.Fatal(err)
	}
	return p
}

func runCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestCommands(t *testing.T) {
	dir := t.TempDir()
	in := writeCache(t, dir)
	kvq := filepath.Join(dir, "kv.kvq.safetensors")
	restored := filepath.Join(dir, "kv.restored.safetensors")
	rt := filepath.Join(dir, "kv.rt.safetensors")
	tests := []struct {
		args     []string
		code     int
		writes   string
		wantJSON map[string]any
	}{
		{[]string{"compress", "-input", in, "-output", kvq}, 0, kvq, map[string]any{"command": "compress", "passed": true, "bits": 4.0}},
		{[]string{"-input", in, "-output", kvq, "-group-size", "32"}, 0, kvq, map[string]any{"command": "compress", "group_size": 32.0}},
		{[]string{"compress", "-input", in, "-output", kvq}, 0, kvq, nil},
		{[]string{"decompress", "-input", kvq, "-output", restored}, 0, restored, map[string]any{"command": "decompress", "rmse": nil}},
		{[]string{"roundtrip", "-input", in, "-output", rt, "-verbose"}, 0, rt, map[string]any{"command": "roundtrip"}},
		{[]string{"metrics", "-input", in, "-bits", "6"}, 0, "", map[string]any{"command": "metrics", "bits": 6.0}},
		{[]string{"roundtrip", "-input", in, "-output", filepath.Join(dir, "strict.safetensors"), "-max-rmse", "1e-9"}, 1,
			filepath.Join(dir, "strict.safetensors"), map[string]any{"passed": false}},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args[:1], " "), func(t *testing.T) {
			code, stdout, stderr := runCLI(tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr: %s", code, tc.code, stderr)
			}
			var got map[string]any
			if err := json.Unmarshal([]byte(stdout), &got); err != nil {
				t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout)
			}
			for k, v := range tc.wantJSON {
				if got[k] != v {
					t.Errorf("%s = %v, want %v", k, got[k], v)
				}
			}
			if tc.writes != "" {
				if _, err := safetensors.ReadFile(tc.writes); err != nil {
					t.Errorf("output: %v", err)
				}
			}
		})
	}
	// decompress(compress(x)) is byte-identical to roundtrip(x).
	a, _ := os.ReadFile(rt)
	b, _ := os.ReadFile(restored)
	if !bytes.Equal(a, b) {
		t.Error("decompress(compress) file differs from roundtrip file")
	}
}

func TestBadInputExits2AndWritesNothing(t *testing.T) {
	dir := t.TempDir()
	in := writeCache(t, dir)
	good, _ := os.ReadFile(in)
	truncated := filepath.Join(dir, "truncated.safetensors")
	os.WriteFile(truncated, good[:len(good)-10], 0o644)
	nanFile := filepath.Join(dir, "nan.safetensors")
	nt, _ := safetensors.NewFloatTensor("layer_7_key", safetensors.F32, []int{2}, []float32{1, float32(math.NaN())})
	safetensors.WriteFile(nanFile, &safetensors.File{Tensors: []safetensors.Tensor{nt}})
	out := filepath.Join(dir, "out.safetensors")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no args", nil, "usage"},
		{"unknown command", []string{"squash", "-input", in}, `unknown command "squash"`},
		{"missing input", []string{"compress", "-output", out}, "-input is required"},
		{"missing output", []string{"compress", "-input", in}, "-output is required"},
		{"bad flag", []string{"compress", "-input", in, "-output", out, "-frobnicate"}, "flag provided but not defined"},
		{"bits", []string{"compress", "-input", in, "-output", out, "-bits", "9"}, "bits 9 out of range"},
		{"group size", []string{"compress", "-input", in, "-output", out, "-group-size", "0"}, "group size 0"},
		{"sparsity", []string{"compress", "-input", in, "-output", out, "-sparsity", "1.5"}, "sparsity 1.5 out of range"},
		{"same file", []string{"roundtrip", "-input", in, "-output", in}, "is the input file"},
		{"missing file", []string{"compress", "-input", filepath.Join(dir, "nope"), "-output", out}, "no such file"},
		{"truncated", []string{"compress", "-input", truncated, "-output", out}, truncated + ": tensor"},
		{"nan", []string{"roundtrip", "-input", nanFile, "-output", out}, nanFile + `: tensor "layer_7_key": element 1 is NaN`},
		{"decompress plain", []string{"decompress", "-input", in, "-output", out}, "not a kvq-compressed file"},
		{"unwritable", []string{"compress", "-input", in, "-output", filepath.Join(dir, "no", "such", "dir.safetensors")}, "cannot write"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(tc.args...)
			if code != 2 {
				t.Fatalf("exit %d, want 2", code)
			}
			if stdout != "" {
				t.Errorf("stdout not empty: %q", stdout)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr %q does not contain %q", stderr, tc.want)
			}
			if _, err := os.Stat(out); err == nil {
				t.Errorf("output file left behind")
			}
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if strings.Contains(e.Name(), ".tmp-") {
					t.Errorf("temp file %s left behind", e.Name())
				}
			}
		})
	}
	if again, _ := os.ReadFile(in); !bytes.Equal(again, good) {
		t.Error("the input file was modified")
	}
}
