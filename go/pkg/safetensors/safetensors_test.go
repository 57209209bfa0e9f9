package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// raw builds a file from a header string and a data section.
func raw(header string, data []byte) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint64(len(header)))
	b.WriteString(header)
	b.Write(data)
	return b.Bytes()
}

func sample(t testing.TB) *File {
	t.Helper()
	a, err := NewFloatTensor("layer_0_key", F32, []int{1, 2, 3}, []float32{1, -2, 3.5, 0, 1e-3, -7})
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewFloatTensor("layer_0_value", F16, []int{2, 2}, []float32{0.5, -0.25, 2, 65504})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewFloatTensor("scalar", BF16, nil, []float32{3})
	if err != nil {
		t.Fatal(err)
	}
	return &File{Metadata: map[string]string{"model_name": "x"}, Tensors: []Tensor{a, b, c}}
}

func TestEncodeParseRoundTrip(t *testing.T) {
	f := sample(t)
	var buf bytes.Buffer
	if err := Encode(&buf, f); err != nil {
		t.Fatal(err)
	}
	if n, _ := EncodedSize(f); n != int64(buf.Len()) {
		t.Errorf("EncodedSize = %d, Encode wrote %d", n, buf.Len())
	}
	if hl := binary.LittleEndian.Uint64(buf.Bytes()); hl%8 != 0 {
		t.Errorf("header length %d not padded to 8", hl)
	}
	g, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if g.Metadata["model_name"] != "x" || len(g.Tensors) != 3 {
		t.Fatalf("got %+v", g)
	}
	for i := range f.Tensors {
		a, b := &f.Tensors[i], g.Tensor(f.Tensors[i].Name)
		if b == nil || a.DType != b.DType || !bytes.Equal(a.Data, b.Data) || len(a.Shape) != len(b.Shape) {
			t.Errorf("tensor %q: round trip mismatch", a.Name)
		}
	}
	v, err := g.Tensor("layer_0_value").Float32s(nil)
	if err != nil || v[3] != 65504 || v[1] != -0.25 {
		t.Errorf("Float32s = %v, %v", v, err)
	}
}

func TestParseBadInput(t *testing.T) {
	okData := make([]byte, 8)
	tests := []struct {
		name string
		file []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"short length", []byte{1, 2, 3}, "truncated"},
		{"header past end", raw("{}", nil)[:9], "runs past the end"},
		{"header over limit", binary.LittleEndian.AppendUint64(nil, MaxHeaderSize+1), "exceeds"},
		{"invalid json", raw(`{"a":`, nil), "invalid header JSON"},
		{"not an object", raw(`[1,2]`, nil), "invalid header JSON"},
		{"trailing garbage", raw(`{} x`, nil), "trailing data"},
		{"bad metadata", raw(`{"__metadata__":{"a":1}}`, nil), "__metadata__"},
		{"unknown dtype", raw(`{"t":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}}`, okData), `tensor "t": unknown dtype`},
		{"entry not an object", raw(`{"t":[1]}`, okData), `tensor "t": invalid header entry`},
		{"offsets out of range", raw(`{"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, okData), `tensor "t": data_offsets [0, 16] out of range`},
		{"offsets reversed", raw(`{"t":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}}`, okData), "out of range"},
		{"offsets wrong count", raw(`{"t":{"dtype":"U8","shape":[2],"data_offsets":[2]}}`, okData), "data_offsets must be"},
		{"shape mismatch", raw(`{"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, okData), `tensor "t": shape [3] of F32 needs 12 bytes`},
		{"negative dim", raw(`{"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, okData), "negative dimension"},
		{"shape overflow", raw(`{"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, okData), "overflows"},
		{"overlap", raw(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, okData), "overlap"},
		// The safetensors library's own rules (issue 9, item 5): each of
		// these is rejected by safetensors 0.8 too.
		{"gap between tensors", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`, make([]byte, 12)), `tensor "b": data_offsets [8, 12] leave a gap of 4 bytes`},
		{"leading gap", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, okData), `tensor "a": data_offsets [4, 8] leave a gap`},
		{"trailing bytes", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, okData), "4 bytes after the last tensor"},
		{"duplicate tensor", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, okData), `duplicate key "a"`},
		{"duplicate metadata", raw(`{"__metadata__":{"x":"1"},"__metadata__":{"y":"2"}}`, nil), `duplicate key "__metadata__"`},
		{"invalid utf-8 name", raw("{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", okData), "not valid UTF-8"},
		{"lone surrogate", raw(`{"a\ud800":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, okData), "unpaired surrogate"},
		{"low surrogate alone", raw(`{"a\udc00x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, okData), "unpaired surrogate"},
		{"null metadata value", raw(`{"__metadata__":{"x":null}}`, nil), `value of "x" is not a string`},
		{"header of 100000001 bytes", binary.LittleEndian.AppendUint64(nil, 100_000_001), "exceeds the 100000000-byte limit"},
		{"nul padding", raw("{}\x00", nil), "trailing data"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.file)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// What the safetensors library accepts, this reader accepts too.
func TestParseAcceptsWhatTheLibraryAccepts(t *testing.T) {
	okData := make([]byte, 8)
	tests := []struct {
		name  string
		file  []byte
		names []string
	}{
		{"unknown entry field", raw(`{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}}`, okData), []string{"t"}},
		{"leading space", raw(` {"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, okData), []string{"t"}},
		{"null metadata", raw(`{"__metadata__":null,"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, okData), []string{"t"}},
		{"empty", raw(`{}`, nil), nil},
		{"zero-size tensors", raw(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"c":{"dtype":"U8","shape":[0],"data_offsets":[8,8]}}`, okData), []string{"a", "b", "c"}},
		{"escaped names", raw(`{"a\u00ff\ud83d\ude00":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, okData), []string{"a\u00ff\U0001F600"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, x := range f.Tensors {
				got = append(got, x.Name)
			}
			if strings.Join(got, ",") != strings.Join(tc.names, ",") {
				t.Errorf("tensors %q, want %q", got, tc.names)
			}
		})
	}
}

func TestReadFileRefusesNonRegularFiles(t *testing.T) {
	for _, p := range []string{"/dev/zero", t.TempDir()} {
		if _, err := ReadFile(p); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("ReadFile(%s) = %v", p, err)
		}
	}
}

func TestWriteFileHonoursUmaskAndRefusesNonRegular(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "out.safetensors")
	if err := WriteFile(p, sample(t)); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(p)
	if want := os.FileMode(0o666 &^ umask()); st.Mode().Perm() != want {
		t.Errorf("mode %v, want %v (umask %03o)", st.Mode().Perm(), want, umask())
	}
	for _, bad := range []string{"/dev/null", dir} {
		if err := WriteFile(bad, sample(t)); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("WriteFile(%s) = %v", bad, err)
		}
	}
}

func TestReadFileNamesPath(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bad.safetensors")
	os.WriteFile(p, []byte{1, 2}, 0o644)
	_, err := ReadFile(p)
	if err == nil || !strings.HasPrefix(err.Error(), p+": ") {
		t.Fatalf("error %v does not start with the path", err)
	}
	// The path is a value too, for errors.As, for reading and writing.
	dir := t.TempDir()
	for _, err := range []error{err, WriteFile(dir, sample(t)), WriteFile(filepath.Join(dir, "no", "x"), sample(t))} {
		var fe *FileError
		if !errors.As(err, &fe) || !strings.HasPrefix(err.Error(), fe.Path+": ") || fe.Err == nil {
			t.Errorf("%v: not a *FileError naming its path", err)
		}
	}
}

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "out.safetensors")
	if err := WriteFile(p, sample(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(p); err != nil {
		t.Fatal(err)
	}
	bad := &File{Tensors: []Tensor{{Name: "t", DType: F32, Shape: []int{3}, Data: make([]byte, 4)}}}
	if err := WriteFile(p, bad); err == nil || !strings.Contains(err.Error(), `tensor "t"`) {
		t.Fatalf("WriteFile of a bad tensor: %v", err)
	}
	if _, err := ReadFile(p); err != nil {
		t.Fatalf("a failed write damaged the previous file: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temp files left behind: %v", entries)
	}
	if err := WriteFile(filepath.Join(dir, "missing", "x.safetensors"), sample(t)); err == nil {
		t.Fatal("WriteFile into a missing directory succeeded")
	}
}

func TestFP16AllValuesRoundTrip(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := FP16ToFloat32(uint16(h))
		if math.IsNaN(float64(f)) {
			continue
		}
		if got := Float32ToFP16(f); got != uint16(h) {
			t.Fatalf("fp16 %#04x -> %g -> %#04x", h, f, got)
		}
	}
}

func TestFP16RoundsHalfToEven(t *testing.T) {
	// Midpoints between consecutive finite FP16 values must round to the even one.
	for h := uint16(0); h < 0x7bff; h++ {
		lo, hi := float64(FP16ToFloat32(h)), float64(FP16ToFloat32(h+1))
		mid := float32((lo + hi) / 2) // exact: FP16 midpoints fit in float32
		want := h
		if h&1 == 1 {
			want = h + 1
		}
		if got := Float32ToFP16(mid); got != want {
			t.Fatalf("midpoint %g of %#04x and %#04x -> %#04x, want %#04x", mid, h, h+1, got, want)
		}
		if got := Float32ToFP16(-mid); got != want|0x8000 {
			t.Fatalf("negative midpoint %g -> %#04x", -mid, got)
		}
	}
	tests := []struct {
		in   float32
		want uint16
	}{
		{65504, 0x7bff}, {65519, 0x7bff}, {65520, 0x7c00}, {1e10, 0x7c00},
		{float32(math.Inf(-1)), 0xfc00}, {0x1p-24, 0x0001}, {0x1p-25, 0}, {0x1.8p-25, 0x0001}, {0x1p-14, 0x0400},
	}
	for _, tc := range tests {
		if got := Float32ToFP16(tc.in); got != tc.want {
			t.Errorf("Float32ToFP16(%g) = %#04x, want %#04x", tc.in, got, tc.want)
		}
	}
}

func TestBF16(t *testing.T) {
	tests := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80}, {-2, 0xc000}, {math.Float32frombits(0x3f808000), 0x3f80}, {math.Float32frombits(0x3f818000), 0x3f82},
		{math.Float32frombits(0x3f808001), 0x3f81},
	}
	for _, tc := range tests {
		if got := Float32ToBF16(tc.in); got != tc.want {
			t.Errorf("Float32ToBF16(%#08x) = %#04x, want %#04x", math.Float32bits(tc.in), got, tc.want)
		}
		if back := BF16ToFloat32(tc.want); Float32ToBF16(back) != tc.want {
			t.Errorf("bf16 %#04x does not round trip", tc.want)
		}
	}
}

func FuzzReader(f *testing.F) {
	var buf bytes.Buffer
	Encode(&buf, sample(f))
	f.Add(buf.Bytes())
	f.Add(raw(`{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f.Add([]byte{})
	f.Add(raw(`{"__metadata__":{"a":"b"},"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}`, []byte{1, 2, 3}))
	f.Add(raw(`{"a\ud83d\ude00":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}}`, []byte{0, 60}))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data)
		if err != nil {
			return
		}
		// What is accepted keeps the safetensors library's rules: the
		// tensors tile the data section exactly, names are unique UTF-8.
		n := binary.LittleEndian.Uint64(data)
		body := len(data) - 8 - int(n)
		covered := 0
		names := map[string]bool{}
		for _, x := range file.Tensors {
			if names[x.Name] || !utf8.ValidString(x.Name) || strings.ContainsRune(x.Name, utf8.RuneError) && !bytes.Contains(data, []byte(x.Name)) {
				t.Fatalf("tensor name %q duplicated, not UTF-8 or made up", x.Name)
			}
			names[x.Name] = true
			covered += len(x.Data)
		}
		if covered != body {
			t.Fatalf("tensors cover %d of %d data bytes", covered, body)
		}
		// Whatever parses must re-encode and parse to the same tensors.
		var out bytes.Buffer
		if err := Encode(&out, file); err != nil {
			t.Fatalf("parsed file does not re-encode: %v", err)
		}
		again, err := Parse(out.Bytes())
		if err != nil {
			t.Fatalf("re-encoded file does not parse: %v", err)
		}
		if len(again.Tensors) != len(file.Tensors) {
			t.Fatalf("tensor count %d != %d", len(again.Tensors), len(file.Tensors))
		}
		for i := range file.Tensors {
			if file.Tensors[i].DType.IsFloat() {
				if _, err := file.Tensors[i].Float32s(nil); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}
