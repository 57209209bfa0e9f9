package compression

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"strings"
	"testing"

	"kvlib/pkg/safetensors"
)

func roundTripFile(t *testing.T, f *safetensors.File) *safetensors.File {
	t.Helper()
	var buf bytes.Buffer
	if err := safetensors.Encode(&buf, f); err != nil {
		t.Fatal(err)
	}
	parsed, err := safetensors.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return parsed
}

// stageCheckSame compresses src with spec and spec+suffix (an entropy stage:
// LosslessSuffix or WireSuffix) and checks that the stage changes nothing of
// the reconstruction, in memory and through a file, and grows no payload.
func stageCheckSame(t *testing.T, src *safetensors.File, name, suffix string) (*Result, *Result, *Header) {
	t.Helper()
	plain, err := ParseSpec(name)
	if err != nil {
		t.Fatal(err)
	}
	coded, err := ParseSpec(name + suffix)
	if err != nil || coded.Wire != (suffix == WireSuffix) || coded.Lossless != (suffix == LosslessSuffix) || coded.String() != plain.String()+suffix {
		t.Fatalf("%q parses to %+v (%v)", name+suffix, coded, err)
	}
	a, err := Compress(src, Config{Spec: plain})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Compress(src, Config{Spec: coded})
	if err != nil {
		t.Fatal(err)
	}
	back, hdr, err := Decompress(roundTripFile(t, b.Compressed), 3)
	if err != nil {
		t.Fatal(err)
	}
	for i := range back.Tensors {
		if !bytes.Equal(back.Tensors[i].Data, a.Restored.Tensors[i].Data) || !bytes.Equal(b.Restored.Tensors[i].Data, a.Restored.Tensors[i].Data) {
			t.Fatalf("%s: the stage changed the reconstruction", back.Tensors[i].Name)
		}
	}
	if b.Report.CompressedSizeBytes > a.Report.CompressedSizeBytes {
		t.Errorf("the stage grew the payload: %d > %d bytes", b.Report.CompressedSizeBytes, a.Report.CompressedSizeBytes)
	}
	return a, b, hdr
}

// The stage changes the file, never the reconstruction: every preset, with
// and without it, decodes to the same bytes.
func TestLosslessIsBitIdenticalForEveryPreset(t *testing.T) {
	src := randomCache(21, 2, 3, 300, 64)
	for _, name := range append(PresetNames(), "k=asym3/g16/channel/out0.01/res5,v=sym5/g32/rot") {
		t.Run(name, func(t *testing.T) {
			a, b, hdr := stageCheckSame(t, src, name, LosslessSuffix)
			if len(hdr.Tensors[0].Lossless) == 0 || b.Report.Lossless == nil {
				t.Fatal("no part was coded")
			}
			l := b.Report.Lossless
			if l.WithoutBytes != a.Report.CompressedSizeBytes || b.Report.CompressedSizeBytes >= a.Report.CompressedSizeBytes {
				t.Errorf("sizes: without %d (plain run %d), with %d", l.WithoutBytes, a.Report.CompressedSizeBytes, b.Report.CompressedSizeBytes)
			}
			if b.Report.SchemeName != a.Report.SchemeName+LosslessSuffix && !strings.Contains(name, "=") {
				t.Errorf("scheme name %q", b.Report.SchemeName)
			}
		})
	}
}

// Bad payloads: one-line errors, never a panic or an allocation beyond the
// declared size.
func TestLosslessRejectsBadPayloads(t *testing.T) {
	src := randomCache(22, 1, 2, 2100, 64) // codes of 134 KB: three chunks
	spec, _ := ParseSpec("int4+lossless")
	res, err := Compress(src, Config{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	name := "layer_0_key" + CodesSuffix
	mutate := func(fn func(f *safetensors.File, codes, offs *safetensors.Tensor)) *safetensors.File {
		f := &safetensors.File{Metadata: res.Compressed.Metadata}
		for _, tn := range res.Compressed.Tensors {
			tn.Data = append([]byte(nil), tn.Data...)
			f.Tensors = append(f.Tensors, tn)
		}
		fn(f, f.Tensor(name), f.Tensor(name+ChunksSuffix))
		return f
	}
	off := func(t *safetensors.Tensor, c int) uint64 { return binary.LittleEndian.Uint64(t.Data[8*c:]) }
	setOff := func(t *safetensors.Tensor, c int, v uint64) { binary.LittleEndian.PutUint64(t.Data[8*c:], v) }
	bomb := func() []byte { // a valid stream of 1 MB of zeros: far more than a chunk
		var b bytes.Buffer
		w, _ := flate.NewWriter(&b, flate.BestCompression)
		w.Write(make([]byte, 1<<20))
		w.Close()
		return b.Bytes()
	}()
	tests := []struct {
		name string
		fn   func(f *safetensors.File, codes, offs *safetensors.Tensor)
		want string
	}{
		{"corrupted stream", func(f *safetensors.File, c, o *safetensors.Tensor) {
			for i := 10; i < 40; i++ {
				c.Data[i] ^= 0x5a
			}
		}, "chunk 0"},
		{"truncated payload", func(f *safetensors.File, c, o *safetensors.Tensor) {
			c.Data = c.Data[:len(c.Data)-100]
			c.Shape = []int{len(c.Data)}
		}, "past the"},
		{"offsets not ascending", func(f *safetensors.File, c, o *safetensors.Tensor) { setOff(o, 1, off(o, 0)) }, "not ascending"},
		{"offset past the end", func(f *safetensors.File, c, o *safetensors.Tensor) { setOff(o, 2, 1<<40) }, "past the"},
		{"missing offsets", func(f *safetensors.File, c, o *safetensors.Tensor) {
			o.Data = o.Data[:8]
			o.Shape = []int{1}
		}, "holds 1 offsets, want 3"},
		{"bytes after the last chunk", func(f *safetensors.File, c, o *safetensors.Tensor) {
			c.Data = append(c.Data, 1, 2, 3)
			c.Shape = []int{len(c.Data)}
		}, "3 bytes after its last chunk"},
		{"decompression bomb", func(f *safetensors.File, c, o *safetensors.Tensor) {
			c.Data = append(append([]byte(nil), bomb...), c.Data[off(o, 0):]...)
			c.Shape = []int{len(c.Data)}
			d := uint64(len(bomb)) - off(o, 0)
			for i := 0; i < 3; i++ {
				setOff(o, i, off(o, i)+d)
			}
		}, "cannot hold"},
		{"stream longer than declared", func(f *safetensors.File, c, o *safetensors.Tensor) {
			var b bytes.Buffer
			w, _ := flate.NewWriter(&b, flate.HuffmanOnly)
			w.Write(bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, LosslessChunk/10))
			w.Close()
			c.Data = append(b.Bytes(), c.Data[off(o, 0):]...)
			c.Shape = []int{len(c.Data)}
			d := uint64(b.Len()) - off(o, 0)
			for i := 0; i < 3; i++ {
				setOff(o, i, off(o, i)+d)
			}
		}, "inflates beyond its declared 65536 bytes"},
		{"offsets table missing", func(f *safetensors.File, c, o *safetensors.Tensor) {
			for i := range f.Tensors {
				if f.Tensors[i].Name == name+ChunksSuffix {
					f.Tensors = append(f.Tensors[:i], f.Tensors[i+1:]...)
					break
				}
			}
		}, "want .codes (U8) and .codes.chunks (U64)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := mutate(tc.fn)
			used := allocated(func() { _, _, err = Decompress(f, 2) })
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `tensor "layer_0_key`) {
				t.Fatalf("error = %v, want %q naming the tensor", err, tc.want)
			}
			if used > memoryBound(4*len(src.Tensors[0].Data)) {
				t.Errorf("allocated %d bytes", used)
			}
		})
	}
}

// BenchmarkLosslessCoder compares the two stdlib coders the stage could use
// on int4 codes in 64 KiB chunks (make bench prints it): the ratio metric is
// coded bytes over raw bytes, MB/s is of raw codes on one goroutine.
func BenchmarkLosslessCoder(b *testing.B) {
	res, err := Measure(benchCache, DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	var codes []byte
	for _, t := range res.Compressed.Tensors {
		if strings.HasSuffix(t.Name, CodesSuffix) {
			codes = append(codes, t.Data...)
		}
	}
	for _, c := range []struct {
		name  string
		level int
	}{{"huffman-only", flate.HuffmanOnly}, {"best-speed", flate.BestSpeed}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(codes)))
			var out int
			for i := 0; i < b.N; i++ {
				out = 0
				for lo := 0; lo < len(codes); lo += LosslessChunk {
					var buf bytes.Buffer
					w, _ := flate.NewWriter(&buf, c.level)
					w.Write(codes[lo:min(lo+LosslessChunk, len(codes))])
					w.Close()
					out += buf.Len()
				}
			}
			b.ReportMetric(float64(out)/float64(len(codes)), "ratio")
		})
	}
}
