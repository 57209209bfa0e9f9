package compression

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"kvlib/pkg/safetensors"
)

// Every entry of the methods table is complete and consistent: found by
// its name, parsed and spelled by it, its widths accepted and no others,
// and a cache round-trips through it and back through Decompress.
func TestMethodsTable(t *testing.T) {
	src := randomCache(11, 1, 2, 32, 64)
	seen := map[Method]bool{}
	for i := range methods {
		q := &methods[i]
		m := q.method
		if seen[m] || quantizerOf(m) != q || q.encode == nil || q.decode == nil || q.minBits > q.maxBits {
			t.Fatalf("%s: duplicate, not found, or incomplete: %+v", m, q)
		}
		seen[m] = true
		if m.IsGGML() != !q.packed() {
			t.Errorf("%s: IsGGML %v, packed %v", m, m.IsGGML(), q.packed())
		}
		var bases []string // every spelling ParseSpec takes for the method
		if q.packed() {
			for bits := q.minBits; bits <= q.maxBits; bits++ {
				bases = append(bases, fmt.Sprintf("%s%d", m, bits))
			}
			for _, bits := range []int{q.minBits - 1, q.maxBits + 1} {
				want := fmt.Sprintf("bits %d out of range [%d, %d] for %s", bits, q.minBits, q.maxBits, m)
				if _, err := ParseSpec(fmt.Sprintf("%s%d", m, bits)); err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("%s%d: %v, want %q", m, bits, err, want)
				}
			}
		} else {
			b := q.block
			want := 2 + GGMLBlock*b.bits/8 // d, the codes' low bits and (q5) their high bits
			if b.hasMin {
				want += 2
			}
			if b.blockSize != want || q.minBits != b.bits || q.maxBits != b.bits || GGMLBlockBytes(m) != b.blockSize {
				t.Errorf("%s: block %+v, bits [%d, %d]; want %d bytes", m, *b, q.minBits, q.maxBits, want)
			}
			bases = append(bases, string(m))
		}
		for _, base := range bases {
			s, err := ParseSpec(base + "/g32")
			if q.packed() {
				s, err = ParseSpec(base)
			}
			if err != nil || s.Key.Method != m || s.String() != s.Key.String() {
				t.Fatalf("%s: %v %v", base, s, err)
			}
			if got := s.Key.String(); q.packed() && got != base+"/g64" || !q.packed() && got != base {
				t.Errorf("%s is spelled %s", base, got)
			}
			res, err := Compress(src, Config{Spec: s, Thresholds: DefaultThresholds})
			if err != nil {
				t.Fatalf("%s: %v", base, err)
			}
			back, _, err := Decompress(res.Compressed, 0)
			if err != nil {
				t.Fatalf("%s: %v", base, err)
			}
			for k := range back.Tensors {
				if string(back.Tensors[k].Data) != string(res.Restored.Tensors[k].Data) {
					t.Errorf("%s: %s decompresses differently", base, back.Tensors[k].Name)
				}
			}
			_, hasZeros := res.Report.StoredBytes["zeros"]
			_, hasScales := res.Report.StoredBytes["scales"]
			if hasZeros != q.zeros || hasScales != q.packed() {
				t.Errorf("%s: stored parts %v", base, res.Report.StoredBytes)
			}
		}
	}
}

// The lists in error messages come from the table.
func TestMethodNames(t *testing.T) {
	if got, want := methodNames(), "sym, symf, asym, lm, q4_0, q4_1, q5_0, q5_1 or q8_0"; got != want {
		t.Errorf("methodNames() = %q, want %q", got, want)
	}
	if got, want := baseNames(), "sym<bits>, symf<bits>, asym<bits>, lm<bits>, q4_0 ..."; got != want {
		t.Errorf("baseNames() = %q, want %q", got, want)
	}
	for _, tc := range []struct {
		base, method, bits string
		ok                 bool
	}{
		{"sym4", "sym", "4", true}, {"symf3", "symf", "3", true}, {"asym12", "asym", "12", true}, {"lm2", "lm", "2", true},
		{"lm", "", "", false}, {"q4_0", "", "", false}, {"q4_04", "", "", false}, {"xsym4", "", "", false}, {"4", "", "", false}, {"", "", "", false},
	} {
		m, bits, ok := parseBase(tc.base)
		if string(m) != tc.method || bits != tc.bits || ok != tc.ok {
			t.Errorf("parseBase(%q) = %q, %q, %v", tc.base, m, bits, ok)
		}
	}
}

func TestPresetIndexPanicsOnDuplicate(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "preset int4 defined twice") {
			t.Errorf("recovered %v", r)
		}
	}()
	presetIndex([]preset{{"int4", DefaultSpec()}, {"int8", DefaultSpec()}, {"int4", DefaultSpec()}})
}

// The presets are valid, canonical, and listed once each in their order.
func TestPresetsTable(t *testing.T) {
	names := PresetNames()
	if len(names) != len(presets) || len(presetByName) != len(presets) || names[0] != DefaultPreset {
		t.Fatalf("names %v", names)
	}
	for i, p := range presets {
		s, ok := Preset(p.name)
		if names[i] != p.name || !ok || !s.Equal(p.spec) {
			t.Errorf("preset %d: %s", i, p.name)
		}
		if err := p.spec.Validate(); err != nil || !p.spec.Canonical().Equal(p.spec) {
			t.Errorf("%s: %v, or not canonical", p.name, err)
		}
		// A preset spelled like a scheme base means what the base does.
		if m, bits, ok := parseBase(p.name); ok {
			b, _ := strconv.Atoi(bits)
			if !p.spec.Equal(both(Scheme{Method: m, Bits: b, Group: 64, Axis: Token})) {
				t.Errorf("preset %s is not the scheme %s", p.name, p.name)
			}
		}
		if m := Method(p.name); m.IsGGML() && !p.spec.Equal(both(ggmlScheme(m))) {
			t.Errorf("preset %s is not the block type %s", p.name, p.name)
		}
	}
}

// QualityLevel grades by the table: each level's bounds are strict, and
// what meets none is the last.
func TestQualityLevelsTable(t *testing.T) {
	levels := QualityLevels()
	if len(levels) != 4 || levels[0].Name != Excellent || levels[3].Name != Poor {
		t.Fatalf("levels %+v", levels)
	}
	for i, l := range levels {
		rmse, snr := l.MaxRMSE, l.MinSNRDB
		if l.Name == Poor {
			rmse, snr = math.MaxFloat64/2, -math.MaxFloat64/2 // on Poor's bounds nothing is left to grade
		}
		inside, onRMSE, onSNR := QualityLevel(math.Nextafter(rmse, 0), math.Nextafter(snr, 100)), QualityLevel(rmse, snr+1), QualityLevel(rmse/2, snr)
		if inside != l.Name || l.Name != Poor && (onRMSE == l.Name || onSNR == l.Name) {
			t.Errorf("%s: inside %s, on the RMSE bound %s, on the SNR bound %s", l.Name, inside, onRMSE, onSNR)
		}
		if i > 0 && !(l.MaxRMSE > levels[i-1].MaxRMSE && l.MinSNRDB < levels[i-1].MinSNRDB) {
			t.Errorf("%s is not below %s", l.Name, levels[i-1].Name)
		}
	}
	for _, v := range [][2]float64{{math.NaN(), 50}, {0, math.NaN()}, {0, math.Inf(-1)}, {math.Inf(1), 50}, {1e300, -1e300}} {
		if got := QualityLevel(v[0], v[1]); got != Poor {
			t.Errorf("QualityLevel(%g, %g) = %s", v[0], v[1], got)
		}
	}
	levels[0].MaxRMSE = 1 // a copy: the table does not change
	if QualityLevel(0.5, 50) != Poor {
		t.Error("QualityLevels shares the table")
	}
}

// Errors name their tensor and group as values, not only in the text.
func TestTensorAndGroupErrors(t *testing.T) {
	nan, _ := safetensors.NewFloatTensor("layer_2_value", safetensors.F32, []int{4}, []float32{1, 2, float32(math.NaN()), 4})
	_, err := Compress(&safetensors.File{Tensors: []safetensors.Tensor{nan}}, symConfig(4, 2, 0))
	var te *TensorError
	if !errors.As(err, &te) || te.Tensor != "layer_2_value" || !errors.Is(err, ErrNotFinite) ||
		err.Error() != `tensor "layer_2_value": element 2 is NaN (NaN or Inf cannot be quantized)` {
		t.Errorf("NaN: %v", err)
	}

	res, err := Compress(randomCache(5, 1, 2, 8, 64), DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	f := res.Compressed
	sc := f.Tensor("layer_0_value" + ScalesSuffix)
	sc.Data[6], sc.Data[7] = 0x00, 0x7c // group 3's scale: +Inf
	_, _, err = Decompress(f, 1)
	var ge *GroupError
	if !errors.As(err, &te) || te.Tensor != "layer_0_value" || !errors.As(err, &ge) || ge.Group != 3 ||
		err.Error() != `tensor "layer_0_value": group 3: scale is not finite` {
		t.Errorf("Inf scale: %v", err)
	}
}
