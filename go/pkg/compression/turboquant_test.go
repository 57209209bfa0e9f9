package compression

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"kvlib/pkg/safetensors"
)

// tqEnginePath is what vLLM's own TurboQuant code gave on the vector
// caches (tests/vllm_turboquant_harness.py): its centroid tables and its
// boundary layers among them.
const tqEnginePath = "../../../tests/vectors/vllm_turboquant_engine.json"

type tqEngineFile struct {
	Centroids      map[string][]string `json:"centroids"`
	BoundaryLayers map[string][]int    `json:"boundary_layers"`
}

func loadTQEngine(t testing.TB) *tqEngineFile {
	t.Helper()
	data, err := os.ReadFile(tqEnginePath)
	if err != nil {
		t.Fatal(err)
	}
	var f tqEngineFile
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	return &f
}

// The embedded centroid tables are the output of vLLM's own solver, bit
// for bit, and there is no other.
func TestTurboQuantCentroidTables(t *testing.T) {
	f := loadTQEngine(t)
	if len(f.Centroids) != 12 || len(tqCentroidTables) != 12 {
		t.Fatalf("%d tables recorded, %d held", len(f.Centroids), len(tqCentroidTables))
	}
	for key, hexes := range f.Centroids {
		var d, b int
		if _, err := fmt.Sscanf(key, "%d/%d", &d, &b); err != nil {
			t.Fatal(err)
		}
		got := tqCentroids(d, b)
		if len(got) != len(hexes) || len(got) != 1<<b {
			t.Fatalf("%s: %d centroids held, %d recorded", key, len(got), len(hexes))
		}
		for i, h := range hexes {
			u, _ := strconv.ParseUint(h, 16, 32)
			if math.Float32bits(got[i]) != uint32(u) {
				t.Errorf("%s[%d]: %08x, vLLM's solver %s", key, i, math.Float32bits(got[i]), h)
			}
		}
		m := tqCentroidTables[[2]int{d, b}].mids
		for k := range m {
			if !(got[k] < m[k] && m[k] < got[k+1]) {
				t.Errorf("%s: midpoint %d = %g outside (%g, %g)", key, k, m[k], got[k], got[k+1])
			}
		}
	}
}

// PiT's entry is torch's float32 1/float32(sqrt(d)): a power of two for
// d = 64 and 256, the float32 nearest 1/sqrt(128) for 128 (torch's
// division of the float32 1.0, checked by tests/test_vllm_formats.py).
func TestTurboQuantHadamardEntry(t *testing.T) {
	for _, tc := range []struct {
		d    int
		bits uint32
	}{{64, 0x3e000000}, {128, 0x3db504f3}, {256, 0x3d800000}} {
		if got := math.Float32bits(tqHadamardEntry(tc.d)); got != tc.bits {
			t.Errorf("d %d: %08x, want %08x", tc.d, got, tc.bits)
		}
	}
	// PiT is orthonormal up to that rounding: rotating twice returns x.
	x := make([]float32, 128)
	for i := range x {
		x[i] = float32(i%7) - 3
	}
	y := slices.Clone(x)
	tqRotate(y)
	tqRotate(y)
	for i := range x {
		if math.Abs(float64(y[i]-x[i])) > 1e-5 {
			t.Fatalf("PiT·PiT x [%d] = %g, x = %g", i, y[i], x[i])
		}
	}
}

// Codes pack as the kernels do: 4-bit even index low; 3-bit index k at
// bit 3k of 24 little-endian bits (0..7 -> 0xFAC688, the sum of k<<3k).
func TestTurboQuantPacking(t *testing.T) {
	codes := make([]byte, 3)
	for k := 0; k < 8; k++ {
		tqPut(codes, 3, k, uint32(k))
	}
	if codes[0] != 0x88 || codes[1] != 0xc6 || codes[2] != 0xfa {
		t.Errorf("3-bit 0..7: % x", codes)
	}
	four := make([]byte, 2)
	for k, v := range []uint32{1, 2, 15, 4} {
		tqPut(four, 4, k, v)
	}
	if four[0] != 0x21 || four[1] != 0x4f {
		t.Errorf("4-bit: % x", four)
	}
	r := rand.New(rand.NewSource(1))
	for _, b := range []int{3, 4} {
		for _, d := range []int{16, 64, 256} {
			want := make([]int, d)
			buf := make([]byte, (d*b+7)/8)
			for i := range want {
				want[i] = r.Intn(1 << b)
				tqPut(buf, b, i, uint32(want[i]))
			}
			for i := range want {
				if got := tqGet(buf, b, i); got != want[i] {
					t.Fatalf("b %d d %d: code %d reads %d, wrote %d", b, d, i, got, want[i])
				}
			}
		}
	}
}

// tqFormat is a TurboQuant half by name.
func tqFormat(t testing.TB, name string) *engineFormat {
	q := quantizerOf(Method("vllm:" + name))
	if q == nil || q.engine == nil {
		t.Fatalf("no format %s", name)
	}
	return q.engine
}

// The head sizes vLLM refuses (or kvlib does, where vLLM would write a
// padding lane's code), one line each, naming the reason and the tensor.
func TestTurboQuantHeadRules(t *testing.T) {
	for _, tc := range []struct {
		spec   string
		tensor string
		hd     int
		want   string // "" accepted
	}{
		{"vllm:turboquant_4bit_nc", "layer_0_key", 96, "vLLM refuses turboquant_k4_nc for head_dim 96: its Hadamard PiT is next_pow2(head_dim) wide"},
		{"vllm:turboquant_k3v4_nc", "layer_0_key", 80, "vLLM refuses turboquant_k3_nc for head_dim 80"},
		{"vllm:turboquant_k3v4_nc", "layer_0_key", 8, "kvlib refuses vLLM's turboquant_k3_nc for head_dim 8: it holds vLLM's Lloyd-Max centroids"},
		{"vllm:turboquant_4bit_nc", "layer_0_key", 1024, "for head_dim 16 to 512"},
		{"vllm:turboquant_4bit_nc", "layer_0_key", 16, ""},
		{"vllm:turboquant_3bit_nc", "layer_0_key", 512, ""},
		{"vllm:turboquant_3bit_nc", "layer_0_value", 20, "vLLM refuses turboquant_v3 for head_dim 20: its 3-bit codes go in whole groups of 8"},
		{"vllm:turboquant_3bit_nc", "layer_0_value", 24, ""},
		{"vllm:turboquant_k8v4", "layer_0_value", 7, "kvlib refuses vLLM's turboquant_v4 for head_dim 7"},
		{"vllm:turboquant_k8v4", "layer_0_value", 6, ""},
		{"vllm:turboquant_k8v4", "layer_0_key", 7, ""}, // FP8 keys: any head_dim
	} {
		t.Run(fmt.Sprintf("%s_%s_%d", tc.spec, tc.tensor, tc.hd), func(t *testing.T) {
			spec, err := ParseSpec(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			src := randomCache(3, 1, 1, 2, tc.hd)
			src.Tensors = slices.DeleteFunc(src.Tensors, func(x safetensors.Tensor) bool { return x.Name != tc.tensor })
			_, err = Compress(src, Config{Spec: spec, Thresholds: DefaultThresholds, Workers: 1})
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) ||
				!strings.Contains(err.Error(), `tensor "`+tc.tensor+`"`) || strings.Contains(err.Error(), "\n")):
				t.Fatalf("error = %v, want one line naming the tensor and containing %q", err, tc.want)
			}
		})
	}
}

// Each half takes its own role only.
func TestTurboQuantRoles(t *testing.T) {
	for _, tc := range []struct{ spec, want string }{
		{"vllm:turboquant_v4", "key scheme: vllm:turboquant_v4 is the value half of vllm's TurboQuant presets"},
		{"vllm:turboquant_k4_nc", "value scheme: vllm:turboquant_k4_nc is the key half"},
		{"k=vllm:turboquant_k8,v=vllm:turboquant_k3_nc", "value scheme: vllm:turboquant_k3_nc is the key half"},
		{"vllm:turboquant_k8v4,k3=vllm:turboquant_v3", "layer 3 key scheme: vllm:turboquant_v3 is the value half"},
		{"vllm:turboquant_k8v4,v0=vllm:turboquant_k8", "layer 0 value scheme: vllm:turboquant_k8 is the key half"},
		{"vllm:turboquant_k3v4_nc", ""},
		{"k=vllm:turboquant_k3_nc,v=vllm:turboquant_v3", ""},
		{"vllm:turboquant_k3v4_nc,v2=vllm:turboquant_v3,kv5=none", ""},
		{"k=vllm:turboquant_k8,v=q8_0", ""}, // kvlib may pair a half with another format
	} {
		_, err := ParseSpec(tc.spec)
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.spec, err, tc.want)
		}
	}
	// The presets are the combos' names; a spec of their halves reads back as the preset.
	for _, c := range tqCombos {
		s, err := ParseSpec("vllm:" + c.name)
		if err != nil || s.Name() != "vllm:"+c.name || s.String() != "k=vllm:"+c.key+",v=vllm:"+c.value {
			t.Errorf("%s: %v %s %s", c.name, err, s.Name(), s)
		}
	}
	if _, err := ParseSpec("vllm:ultraquant_4bit"); err == nil || !strings.Contains(err.Error(), "ROCm only") {
		t.Errorf("ultraquant_4bit: %v", err)
	}
	if _, err := ParseSpec("vllm:turboquant_k2"); err == nil || !strings.Contains(err.Error(), "turboquant_3bit_nc)") ||
		strings.Contains(err.Error(), "turboquant_v4,") {
		t.Errorf("unknown: %v (the menu lists the presets, not their halves)", err)
	}
}

// skippedLayers compresses a cache of the given layers and roles under
// spec and returns the (layer, role) slots stored with none, from the
// file's own records.
func skippedLayers(t *testing.T, spec string, layers []int, roles []string) []string {
	t.Helper()
	s, err := ParseSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	src := &safetensors.File{}
	r := rand.New(rand.NewSource(5))
	for _, l := range layers {
		for _, role := range roles {
			x := make([]float32, 2*3*64)
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
			data := make([]byte, 2*len(x))
			safetensors.EncodeFloat32s(data, x, safetensors.BF16)
			src.Tensors = append(src.Tensors, safetensors.Tensor{Name: fmt.Sprintf("layer_%d_%s", l, role), DType: safetensors.BF16,
				Shape: []int{1, 2, 3, 64}, Data: data})
		}
	}
	res, err := Compress(src, Config{Spec: s, Thresholds: DefaultThresholds, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := ReadHeader(res.Compressed)
	if err != nil {
		t.Fatal(err)
	}
	if hdr.Spec != s.String() {
		t.Errorf("header spec %q, want the spec as given %q", hdr.Spec, s)
	}
	var out []string
	for i, ti := range hdr.Tensors {
		if ti.Scheme.Method == None {
			out = append(out, strings.TrimPrefix(ti.Name, "layer_"))
		}
		if res.Report.Tensors[i].Scheme != ti.Scheme.String() {
			t.Errorf("%s: report says %s, header %s", ti.Name, res.Report.Tensors[i].Scheme, ti.Scheme)
		}
	}
	return out
}

// The boundary rule: the first and last min(2, L/2) layers of the cache
// are stored with none, both roles; a slot the spec sets stays as set;
// formats without the rule skip nothing.
func TestTurboQuantBoundaryLayers(t *testing.T) {
	kv := []string{"key", "value"}
	seq := func(n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	both := func(ls ...int) []string {
		var out []string
		for _, l := range ls {
			out = append(out, fmt.Sprintf("%d_key", l), fmt.Sprintf("%d_value", l))
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		spec   string
		layers []int
		roles  []string
		want   []string
	}{
		{"one layer", "vllm:turboquant_k3v4_nc", seq(1), kv, nil},
		{"two layers", "vllm:turboquant_k3v4_nc", seq(2), kv, both(0, 1)},
		{"three layers", "vllm:turboquant_k8v4", seq(3), kv, both(0, 2)},
		{"four layers", "vllm:turboquant_4bit_nc", seq(4), kv, both(0, 1, 2, 3)},
		{"five layers", "vllm:turboquant_3bit_nc", seq(5), kv, both(0, 1, 3, 4)},
		{"32 layers", "vllm:turboquant_k3v4_nc", seq(32), kv, both(0, 1, 30, 31)},
		{"keys only", "vllm:turboquant_k3v4_nc", seq(6), []string{"key"}, []string{"0_key", "1_key", "4_key", "5_key"}},
		{"skip-layers beside the rule", "vllm:turboquant_k3v4_nc,kv2=none", seq(6), kv, both(0, 1, 2, 4, 5)},
		{"a boundary slot set by the user", "vllm:turboquant_3bit_nc,v0=vllm:turboquant_v4", seq(6), kv,
			[]string{"0_key", "1_key", "1_value", "4_key", "4_value", "5_key", "5_value"}},
		{"a part of a model: its own ends", "vllm:turboquant_k8v4", []int{3, 4, 5, 6, 7}, kv, both(3, 4, 6, 7)},
		{"one role's default alone", "k=vllm:turboquant_k8,v=q8_0", seq(5), kv, both(0, 1, 3, 4)},
		{"no rule", "vllm:int4_per_token_head", seq(6), kv, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := skippedLayers(t, tc.spec, tc.layers, tc.roles); !slices.Equal(got, tc.want) {
				t.Errorf("none: %v, want %v", got, tc.want)
			}
		})
	}
	// vLLM's own get_boundary_skip_layers (recorded by the harness) gives the same layers.
	for n, want := range loadTQEngine(t).BoundaryLayers {
		L, _ := strconv.Atoi(n)
		if L > 40 { // a cache that large is slow here; the rule is the same
			continue
		}
		var wantSlots []string
		for _, l := range want {
			wantSlots = append(wantSlots, both(l)...)
		}
		if got := skippedLayers(t, "vllm:turboquant_4bit_nc", seq(L), kv); !slices.Equal(got, wantSlots) {
			t.Errorf("%d layers: none %v, vLLM skips %v", L, got, want)
		}
	}
}

// tqRandomHead is a head vector with outlier channels and a scale.
func tqRandomHead(r *rand.Rand, d int, scale float64) []float32 {
	x := make([]float32, d)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
	}
	x[r.Intn(d)] *= 20
	return x
}

// Properties that hold whatever the order of vLLM's sums: each key index
// is the centroid nearest to the exactly rotated value (ties aside), the
// stored norm is fp16 of ||k||, the read has that norm; each value is
// within half a step of its code.
func TestTurboQuantCodecProperties(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	for _, name := range []string{"turboquant_k4_nc", "turboquant_k3_nc", "turboquant_v4", "turboquant_v3"} {
		f := tqFormat(t, name)
		for _, d := range []int{64, 128, 256} {
			for trial := 0; trial < 40; trial++ {
				x := tqRandomHead(r, d, math.Pow(10, float64(trial%7-3)))
				dst := make([]byte, f.headBytes(d))
				if f.quantize(x, dst) {
					t.Fatal("finite input reported non-finite")
				}
				y := make([]float32, d)
				f.dequantize(dst, y)
				if f.role == KeyRole {
					checkTQKey(t, name, f.bits, x, dst, y)
				} else {
					checkTQValue(t, name, f.bits, x, dst, y)
				}
			}
		}
	}
}

func checkTQKey(t testing.TB, name string, b int, x []float32, dst []byte, y []float32) {
	d := len(x)
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	norm := math.Sqrt(ss)
	n := (d*b + 7) / 8
	stored := safetensors.FP16ToFloat32(binary.LittleEndian.Uint16(dst[n:]))
	if norm < 60000 && math.Abs(float64(stored)-norm) > norm*(1.0/2048)+1e-7 {
		t.Fatalf("%s: stored norm %g, ||x|| %g", name, stored, norm)
	}
	if norm == 0 || norm > 60000 || norm < 1e-3 {
		return // an all-zero or tiny vector: x / (||x|| + 1e-8) is not a unit vector
	}
	// the rotation in float64: Σ_j (-1)^popcount(i&j) x_j / (||x|| sqrt(d))
	cents := tqCentroids(d, b)
	mids := tqCentroidTables[[2]int{d, b}].mids
	for i := 0; i < d; i++ {
		var s float64
		for j, v := range x {
			if bitsOnes(i&j)%2 == 1 {
				s -= float64(v)
			} else {
				s += float64(v)
			}
		}
		yi := s / (norm * math.Sqrt(float64(d)))
		k := tqGet(dst[:n], b, i)
		nearMid := false
		for _, m := range mids {
			nearMid = nearMid || math.Abs(yi-float64(m)) < 1e-6
		}
		lo, hi := math.Inf(-1), math.Inf(1)
		if k > 0 {
			lo = float64(mids[k-1])
		}
		if k < len(cents)-1 {
			hi = float64(mids[k])
		}
		if !nearMid && !(lo <= yi && yi < hi) {
			t.Fatalf("%s d %d: element %d rotates to %g, stored index %d (between %g and %g)", name, d, i, yi, k, lo, hi)
		}
	}
	var rs float64
	for _, v := range y {
		rs += float64(v) * float64(v)
	}
	if math.Abs(math.Sqrt(rs)-float64(stored)) > float64(stored)*1e-5 {
		t.Fatalf("%s: the read's norm %g, stored %g (norm correction makes them equal)", name, math.Sqrt(rs), stored)
	}
}

func bitsOnes(v int) int {
	n := 0
	for ; v != 0; v &= v - 1 {
		n++
	}
	return n
}

func checkTQValue(t testing.TB, name string, b int, x []float32, dst []byte, y []float32) {
	d := len(x)
	n := (d*b + 7) / 8
	lo, hi := float64(x[0]), float64(x[0])
	for _, v := range x {
		lo, hi = math.Min(lo, float64(v)), math.Max(hi, float64(v))
	}
	step := (hi - lo) / float64(int(1)<<b-1)
	s16 := float64(safetensors.FP16ToFloat32(binary.LittleEndian.Uint16(dst[n:])))
	z16 := float64(safetensors.FP16ToFloat32(binary.LittleEndian.Uint16(dst[n+2:])))
	if math.Abs(hi) > 60000 || math.Abs(lo) > 60000 {
		return // fp16 zero or scale past its range: the engine's Inf
	}
	for i, v := range x {
		k := float64(tqGet(dst[:n], b, i))
		if k > float64(int(1)<<b-1) {
			t.Fatalf("%s: code %g", name, k)
		}
		// half a step, plus what fp16 did to the scale and the zero, plus the floor of 1e-8
		bound := step/2 + k*math.Abs(s16-math.Max(step, 1e-8)) + math.Abs(z16-lo) + 1e-8 + 1e-6*math.Max(math.Abs(lo), math.Abs(hi))
		if e := math.Abs(float64(y[i]) - float64(v)); e > bound {
			t.Fatalf("%s d %d: |%g - %g| = %g > %g (scale %g, zero %g)", name, d, y[i], v, e, bound, s16, z16)
		}
	}
}

// FuzzTurboQuant: any finite head vector quantizes without a panic into
// codes in range whose read keeps the properties above; an input with a
// NaN or Inf is reported.
func FuzzTurboQuant(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 0, 192}, uint8(0))
	f.Add(make([]byte, 64), uint8(3))
	f.Add([]byte{0xff, 0xff, 0x7f, 0x7f, 1, 0, 0, 0, 0, 0, 0x80, 0x80}, uint8(6))
	names := []string{"turboquant_k4_nc", "turboquant_k3_nc", "turboquant_v4", "turboquant_v3"}
	f.Fuzz(func(t *testing.T, data []byte, sel uint8) {
		d := []int{16, 64}[int(sel)%2]
		name := names[int(sel/2)%len(names)]
		fm := tqFormat(t, name)
		x := make([]float32, d)
		for i := range x {
			if 4*i+4 <= len(data) {
				x[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
			}
		}
		dst := make([]byte, fm.headBytes(d))
		nonFinite := fm.quantize(x, dst)
		if nonFinite != (firstNonFinite(x) >= 0) {
			t.Fatalf("non-finite %v for %v", nonFinite, x)
		}
		y := make([]float32, d)
		fm.dequantize(dst, y)
		if nonFinite {
			return
		}
		if fm.role == KeyRole {
			checkTQKey(t, name, fm.bits, x, dst, y)
		} else {
			checkTQValue(t, name, fm.bits, x, dst, y)
		}
	})
}

// The FP8 keys: e4m3 with no scale, saturating, counted.
func TestTurboQuantFP8KeysSaturate(t *testing.T) {
	x := []float32{600, -448.5, 448, 464, 1, float32(math.Copysign(0, -1)), 3.1, 1e-9}
	src := &safetensors.File{Tensors: []safetensors.Tensor{{Name: "layer_0_key", DType: safetensors.F32, Shape: []int{1, 1, 1, 8},
		Data: bitsOf(x)}}}
	spec, _ := ParseSpec("vllm:turboquant_k8v4")
	res, err := Compress(src, Config{Spec: spec, Thresholds: DefaultThresholds, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	codes := res.Compressed.Tensor("layer_0_key" + CodesSuffix).Data
	want := []byte{0x7e, 0xfe, 0x7e, 0x7e, 0x38, 0x80, 0x44, 0x00} // 448 for the first four (464 is a tie: even), 1, -0, 3.0, 0
	if !slices.Equal(codes, want) || res.Report.Tensors[0].Saturated != 3 {
		t.Errorf("codes % x (want % x), %d saturated", codes, want, res.Report.Tensors[0].Saturated)
	}
}

// The key codes' binary search counts the midpoints <= v as the linear
// count did, on every table, at each midpoint, its neighbours and NaN.
func TestTurboQuantMidpointSearch(t *testing.T) {
	for key, tb := range tqCentroidTables {
		mid := tb.mids
		if len(mid) != 1<<key[1]-1 || !slices.IsSorted(mid) {
			t.Fatalf("%v: %d midpoints, sorted %v", key, len(mid), slices.IsSorted(mid))
		}
		var probe []float32
		for _, m := range mid {
			probe = append(probe, m, math.Nextafter32(m, -1), math.Nextafter32(m, 1), -m)
		}
		probe = append(probe, 0, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1, -1)
		for _, v := range probe {
			want := 0
			for want < len(mid) && v >= mid[want] {
				want++
			}
			k := 0
			for step := (len(mid) + 1) / 2; step > 0; step >>= 1 {
				if v >= mid[k+step-1] {
					k += step
				}
			}
			if k != want {
				t.Fatalf("%v: v=%g: %d, linear %d", key, v, k, want)
			}
		}
	}
}

// vllmNibble is clampNibble(roundHalfAway(t)) on a stride of every float32
// bit pattern (NaN and Inf included) and around the half steps; and the
// int4 codes' float64 product and sum are math.FMA's rounding.
func TestVLLMNibble(t *testing.T) {
	check := func(v float32) {
		if a, b := vllmNibble(v), uint8(clampNibble(roundHalfAway(v))); a != b {
			t.Fatalf("%g (%#x): %d, want %d", v, math.Float32bits(v), a, b)
		}
	}
	for u := uint64(0); u < 1<<32; u += 4099 {
		check(math.Float32frombits(uint32(u)))
	}
	for k := -40; k <= 40; k++ {
		h := float32(k) / 2
		for _, v := range []float32{h, math.Nextafter32(h, -100), math.Nextafter32(h, 100)} {
			check(v)
			check(v * 0x1p20)
		}
	}
	r := rand.New(rand.NewSource(4))
	for i := 0; i < 1e6; i++ {
		v := math.Float32frombits(r.Uint32())
		inv := math.Float32frombits(r.Uint32()&0x3fffffff | 0x10000000)
		zp := float64(r.Intn(16))
		if a, b := float32(float64(v)*float64(inv)+zp), float32(math.FMA(float64(v), float64(inv), zp)); math.Float32bits(a) != math.Float32bits(b) && a == a {
			t.Fatalf("%g·%g + %g: %g, FMA %g", v, inv, zp, a, b)
		}
	}
}

// tqPack and tqUnpack are tqPut and tqGet of each code, for every width
// and head size they take (and a head size only the generic path takes).
func TestTurboQuantPackIsPut(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	for _, b := range []int{3, 4} {
		for _, d := range []int{8, 10, 16, 64, 128, 512, 1024} {
			k := make([]int8, d)
			for i := range k {
				k[i] = int8(r.Intn(1 << b))
			}
			n := (d*b + 7) / 8
			want := make([]byte, n)
			for i, c := range k {
				tqPut(want, b, i, uint32(uint8(c)))
			}
			got := make([]byte, n)
			for i := range got {
				got[i] = 0xff // tqPack writes every byte
			}
			tqPack(got, b, k)
			if !slices.Equal(got, want) {
				t.Fatalf("b=%d d=%d: tqPack %x, tqPut %x", b, d, got, want)
			}
			back := make([]int8, d)
			tqUnpack(back, got, b)
			for i := range back {
				if int(back[i]) != tqGet(got, b, i) || back[i] != k[i] {
					t.Fatalf("b=%d d=%d: code %d read %d, tqGet %d, stored %d", b, d, i, back[i], tqGet(got, b, i), k[i])
				}
			}
		}
	}
}

// A run of head vectors (quantizeRun, dequantizeRun: the chunks' path)
// stores and reads the bytes and values of one head vector at a time on
// the portable code path, on both code paths, for runs not a multiple of
// the four vectors whose norms are summed together, head sizes past the
// stack buffers and not a multiple of 32 (values), with an all-zero head,
// outliers, values past any range, and a NaN and an Inf head.
func TestTurboQuantRunsMatchHeads(t *testing.T) {
	defer func() { useSIMD = haveSIMD }()
	r := rand.New(rand.NewSource(23))
	for _, name := range []string{"turboquant_k4_nc", "turboquant_k3_nc", "turboquant_v4", "turboquant_v3"} {
		f := tqFormat(t, name)
		for _, d := range []int{16, 64, 80, 96, 128, 256, 512, 1024} {
			if f.headRule(d) != nil {
				continue
			}
			for _, n := range []int{1, 3, 4, 5, 9} {
				x := make([]float32, 0, n*d)
				for h := 0; h < n; h++ {
					x = append(x, tqRandomHead(r, d, []float64{1, 30, 1e-3}[h%3])...)
				}
				if n > 3 {
					clear(x[d : 2*d])                               // an all-zero head
					x[3*d+1], x[2*d+5] = 7e4, float32(math.Inf(-1)) // past fp16's range; an Inf
				}
				if n > 5 {
					x[5*d+2] = float32(math.NaN())
				}
				hs := f.headSize(d)
				useSIMD = false // the definition: the Go loops, a head vector at a time
				want, wantNF := make([]byte, n*hs), false
				wantY := make([]float32, n*d)
				for h := 0; h < n; h++ {
					wantNF = f.quantize(x[h*d:(h+1)*d], want[h*hs:(h+1)*hs]) || wantNF
					f.dequantize(want[h*hs:(h+1)*hs], wantY[h*d:(h+1)*d])
				}
				for _, simd := range []bool{haveSIMD, false} {
					useSIMD = simd
					got := make([]byte, n*hs)
					nf, sat := f.quantizeRun(x, got, blockRun{k: 1, elems: d, bytes: hs})
					gotY := make([]float32, n*d)
					f.dequantizeRun(want, gotY, blockRun{k: 1, elems: d, bytes: hs})
					if !slices.Equal(got, want) || nf != wantNF || sat != 0 {
						t.Errorf("%s d=%d n=%d simd=%v: the run stores other bytes (nonFinite %v, want %v)", name, d, n, simd, nf, wantNF)
					}
					if !slices.Equal(bitsOf(gotY), bitsOf(wantY)) {
						t.Errorf("%s d=%d n=%d simd=%v: the run reads other values", name, d, n, simd)
					}
				}
			}
		}
	}
}
