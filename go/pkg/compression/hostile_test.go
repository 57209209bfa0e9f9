package compression

import (
	"math"
	"runtime"
	"strings"
	"testing"

	"kvlib/pkg/safetensors"
)

// Issue 9's reproducers: sizes that overflow, shapes that would allocate
// gigabytes from a tiny header, values at a dtype's limits. Each must
// either work with memory in proportion to the data or fail cleanly.
func TestHostileShapesAndParameters(t *testing.T) {
	f32 := func(name string, shape []int, vals ...float32) safetensors.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		x := make([]float32, n)
		copy(x, vals)
		tn, err := safetensors.NewFloatTensor(name, safetensors.F32, shape, x)
		if err != nil {
			t.Fatal(err)
		}
		return tn
	}
	tests := []struct {
		name   string
		tensor safetensors.Tensor
		spec   string
		want   string // error substring; "" means it must succeed
	}{
		{"zero-size [1, 1e6, 0]", f32("t", []int{1, 1_000_000, 0}), "int4", ""},
		{"zero-size 4-D [1, 1e8, 0, 64]", f32("layer_0_key", []int{1, 100_000_000, 0, 64}), "kivi4", ""},
		{"zero-size [1, 2^40, 0]", f32("t", []int{1, 1 << 40, 0}), "int4", ""},
		{"zero-size residual", f32("t", []int{1, 1 << 40, 0, 8}), "sym4/g64/res1000000", ""},
		{"[1, N] has no head axis", f32("t", []int{1, 100_000}), "int4", ""},
		{"many heads: no per-head stats", f32("t", []int{1, 100_000, 1, 2}), "int4", ""},
		{"group larger than the tensor", f32("t", []int{3}, 1, 2, 3), "sym4/g1073741824", ""},
		{"channel group larger than tokens", f32("t", []int{1, 1, 3, 2}, 1, 2, 3), "asym4/g1073741824/channel", ""},
		{"residual larger than tokens", f32("t", []int{1, 2, 3, 4}, 1), "sym4/g64/res1073741824", ""},
		{"channel groups, residual covers every token", f32("t", []int{1, 1, 7, 32}, 1, 2), "asym8/g2/channel/res1073741824", ""},
		{"outliers of an empty tensor", f32("t", []int{1, 2, 0, 4}), "sym4/g64/out0.5", ""},
		{"channel on 2-D", f32("t", []int{4, 4}), "asym4/g4/channel", "needs a 4-D"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec, err := ParseSpec(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			res, err := Compress(&safetensors.File{Tensors: []safetensors.Tensor{tc.tensor}}, Config{Spec: spec, Thresholds: DefaultThresholds})
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			if grown := after.TotalAlloc - before.TotalAlloc; grown > 64<<20+uint64(20*len(tc.tensor.Data)) {
				t.Errorf("allocated %d MB for %d bytes of data", grown>>20, len(tc.tensor.Data))
			}
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `tensor "`) {
					t.Fatalf("error %v, want %q naming the tensor", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			rep := res.Report.Tensors[0]
			if len(rep.HeadSums) > MaxReportedHeads || (len(tc.tensor.Shape) != 4 && len(rep.HeadSums) != 0) {
				t.Errorf("%d per-head entries for shape %v", len(rep.HeadSums), tc.tensor.Shape)
			}
			back, _, err := Decompress(res.Compressed, 0)
			if err != nil {
				t.Fatal(err)
			}
			if string(back.Tensors[0].Data) != string(res.Restored.Tensors[0].Data) {
				t.Error("decompress differs from the restored tensor")
			}
		})
	}
}

// A reconstruction never leaves its dtype's finite range: F16 and BF16
// inputs at ±max, every bit width, sym, symf, asym and lm (issue 9, item 3).
func TestReconstructionSaturatesAtDTypeLimits(t *testing.T) {
	limits := map[safetensors.DType]float32{safetensors.F16: 65504, safetensors.BF16: 0x1.fep127}
	for dt, lim := range limits {
		x := []float32{lim, -lim, lim, lim / 3, -lim, 0, 7, lim}
		tn, _ := safetensors.NewFloatTensor("t", dt, []int{8}, x)
		for _, m := range []Method{Sym, SymF, Asym, LM} {
			for bits := MinBits; bits <= MaxBits && (m != LM || bits <= MaxLMBits); bits++ {
				s := Scheme{Method: m, Bits: bits, Group: 8, Axis: Token}
				res, err := Compress(&safetensors.File{Tensors: []safetensors.Tensor{tn}}, Config{Spec: Spec{Key: s, Value: s}})
				if err != nil {
					if dt == safetensors.BF16 { // a BF16 max has no FP16 scale: a clean error is the answer
						if !strings.Contains(err.Error(), "overflows FP16") {
							t.Errorf("%s %s: %v", dt, s, err)
						}
						continue
					}
					t.Fatalf("%s %s: %v", dt, s, err)
				}
				y, _ := res.Restored.Tensors[0].Float32s(nil)
				for i, v := range y {
					if math.IsInf(float64(v), 0) || math.IsNaN(float64(v)) {
						t.Errorf("%s %s: element %d restored as %v", dt, s, i, v)
					}
				}
			}
		}
	}
	// The saturation itself, on BF16 values whose reconstruction would round past max.
	y := []float32{0x1.fep127 * 1.0001, -math.MaxFloat32, 65520, -70000}
	roundToDType(y[:2], safetensors.BF16, make([]byte, 4))
	roundToDType(y[2:], safetensors.F16, make([]byte, 4))
	if y[0] != 0x1.fep127 || y[1] != -0x1.fep127 || y[2] != 65504 || y[3] != -65504 {
		t.Errorf("saturated to %v", y)
	}
}

// A decompressed file's header cannot make the decoder allocate more than
// its data supports: a shape must be backed by codes of the right length.
func TestDecompressHeaderCannotInflate(t *testing.T) {
	tn, _ := safetensors.NewFloatTensor("t", safetensors.F32, []int{1, 1, 4, 16}, make([]float32, 64))
	res, err := Compress(&safetensors.File{Tensors: []safetensors.Tensor{tn}}, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	md := res.Compressed.Metadata
	for _, shape := range []string{"[1,1,4,1000000000]", "[1,1,1125899906842624,64]", "[281474976710656,2]", "[1,1,4,-16]"} {
		bad := &safetensors.File{Tensors: res.Compressed.Tensors, Metadata: map[string]string{}}
		for k, v := range md {
			bad.Metadata[k] = v
		}
		bad.Metadata["kvq.tensors"] = strings.Replace(md["kvq.tensors"], "[1,1,4,16]", shape, 1)
		if _, _, err := Decompress(bad, 0); err == nil {
			t.Errorf("shape %s accepted", shape)
		}
	}
}
