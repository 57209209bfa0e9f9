package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"kvlib/pkg/compression"
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
	v1NaN := filepath.Join(dir, "v1nan.kvq.safetensors")
	writeV1(t, in, v1NaN, "NaN")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no args", nil, "a command is required"},
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
		// Issue 9: sizes that cannot exist, non-finite gates, devices.
		{"group 2^60", []string{"compress", "-input", in, "-output", out, "-group-size", "1152921504606846976"}, "group size 1152921504606846976 must be"},
		{"group 2^61", []string{"roundtrip", "-input", in, "-output", out, "-group-size", "2305843009213693952"}, "group size"},
		{"group 2^40", []string{"compress", "-input", in, "-output", out, "-group-size", "1099511627776"}, "group size"},
		{"group 2^64", []string{"compress", "-input", in, "-output", out, "-group-size", "18446744073709551616"}, "invalid value"},
		{"workers 1e11", []string{"compress", "-input", in, "-output", out, "-workers", "100000000000"}, "-workers 100000000000 out of range"},
		{"workers negative", []string{"compress", "-input", in, "-output", out, "-workers", "-1"}, "-workers -1 out of range"},
		{"min-snr NaN", []string{"compress", "-input", in, "-output", out, "-min-snr", "NaN"}, "-min-snr NaN is not a finite number"},
		{"max-rmse Inf", []string{"roundtrip", "-input", in, "-output", out, "-max-rmse", "Inf"}, "-max-rmse +Inf is not a finite number"},
		{"min-cosine -Inf", []string{"compress", "-input", in, "-output", out, "-min-cosine", "-Inf"}, "not a finite number"},
		{"input /dev/zero", []string{"compress", "-input", "/dev/zero", "-output", out}, "/dev/zero: not a regular file"},
		{"input directory", []string{"compress", "-input", dir, "-output", out}, "not a regular file"},
		{"v1 sparsity NaN", []string{"decompress", "-input", v1NaN, "-output", out}, "sparsity NaN out of range"},
		{"unknown scheme", []string{"compress", "-input", in, "-output", out, "-scheme", "int5"}, `scheme "int5": unknown scheme`},
		{"bits with ggml", []string{"compress", "-input", in, "-output", out, "-scheme", "q4_0", "-bits", "4"}, "do not apply to q4_0"},
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
			if strings.Count(stderr, "\n") != 1 || strings.Contains(stderr, "goroutine") {
				t.Errorf("stderr is not one line: %q", stderr)
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

// writeV1 writes a version 1 kvq file of the cache at in, with the given
// kvq.sparsity value (version 1 kept one scheme in the file's metadata).
func writeV1(t *testing.T, in, path, sparsity string) {
	t.Helper()
	if code, _, stderr := runCLI("compress", "-input", in, "-output", path); code > 1 {
		t.Fatal(stderr)
	}
	f, err := safetensors.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var infos []map[string]any
	json.Unmarshal([]byte(f.Metadata["kvq.tensors"]), &infos)
	for _, ti := range infos {
		delete(ti, "scheme")
		delete(ti, "outliers")
	}
	js, _ := json.Marshal(infos)
	f.Metadata = map[string]string{"kvq.format": "kvq", "kvq.version": "1", "kvq.bits": "4", "kvq.group_size": "64",
		"kvq.sparsity": sparsity, "kvq.tensors": string(js)}
	if err := safetensors.WriteFile(path, f); err != nil {
		t.Fatal(err)
	}
}

// Issue 9, item 7: the output honours the umask; a device path is refused.
func TestOutputModeAndNonRegularOutput(t *testing.T) {
	dir := t.TempDir()
	in := writeCache(t, dir)
	os.Chmod(in, 0o600)
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	out := filepath.Join(dir, "out.safetensors")
	if code, _, stderr := runCLI("roundtrip", "-input", in, "-output", out); code > 1 {
		t.Fatal(stderr)
	}
	if st, _ := os.Stat(out); st.Mode().Perm() != 0o600 {
		t.Errorf("output mode %v under umask 077", st.Mode().Perm())
	}
	code, stdout, stderr := runCLI("roundtrip", "-input", in, "-output", "/dev/null")
	if code != 2 || stdout != "" || !strings.Contains(stderr, "/dev/null: not a regular file") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
}

// The check and schemes commands describe schemes for Python.
func TestCheckAndSchemes(t *testing.T) {
	code, stdout, stderr := runCLI("check", "-scheme", "kivi4", "-bits", "3")
	if code != 0 {
		t.Fatal(stderr)
	}
	var c map[string]any
	json.Unmarshal([]byte(stdout), &c)
	if c["scheme"] != "k=asym3/g64/channel,v=asym3/g64" {
		t.Errorf("check printed %s", stdout)
	}
	code, stdout, _ = runCLI("schemes")
	var list []map[string]any
	if code != 0 || json.Unmarshal([]byte(stdout), &list) != nil || len(list) != len(compression.PresetNames()) || list[0]["name"] != "int4" {
		t.Errorf("schemes printed %s", stdout)
	}
}

// check prints the same object for a JSON spec with fields left out as for
// the string spec it stands for, and names a JSON spec's bad field.
func TestCheckJSONSpec(t *testing.T) {
	for _, tc := range []struct{ json, str string }{
		{`{"key": {"method": "asym", "axis": "channel"}}`, "k=asym4/g64/channel,v=sym4/g64"},
		{`{"key": {"method": "asym", "axis": "channel"}, "value": {"method": "asym"}}`, "kivi4"},
		{`{"key": {"method": "q8_0"}, "value": {"rotate": true, "outliers": 0.01}}`, "k=q8_0,v=sym4/g64/rot/out0.01"},
		{`{"layers": [{"layer": 0, "role": "key", "scheme": {"method": "q8_0"}}]}`, "int4,k0=q8_0"},
		{`{}`, "int4"},
	} {
		code, fromJSON, stderr := runCLI("check", "-scheme", tc.json)
		if code != exitOK {
			t.Errorf("check -scheme %s: exit %d, %s", tc.json, code, stderr)
			continue
		}
		_, fromString, _ := runCLI("check", "-scheme", tc.str)
		if fromJSON != fromString {
			t.Errorf("check -scheme %s printed\n%s\ncheck -scheme %s printed\n%s", tc.json, fromJSON, tc.str, fromString)
		}
	}
	code, stdout, stderr := runCLI("check", "-scheme", `{"key": {"bitz": 3}}`)
	if code != exitError || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, `unknown field "key.bitz"`) {
		t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}
