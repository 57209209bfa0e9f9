package compression

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Axis says which elements share a group.
type Axis string

// Token groups are runs of consecutive elements of the row-major tensor
// (along head_dim); channel groups are runs of consecutive tokens of one
// channel of one head of a [batch, heads, tokens, head_dim] tensor.
const (
	Token   Axis = "token"
	Channel Axis = "channel"
)

// Bounds on a scheme's numbers. A group or residual beyond them cannot
// exist in any tensor this codec reads.
const (
	MinBits      = 2
	MaxBits      = 8
	MaxGroupSize = 1 << 30
	MaxResidual  = 1 << 30
	GGMLBlock    = 32
)

// Scheme is how one tensor is quantized. The zero values of the optional
// stages (Rotate, Outliers, Residual, Sparsity) switch them off.
type Scheme struct {
	Method   Method  `json:"method"`
	Bits     int     `json:"bits"`
	Group    int     `json:"group"`
	Axis     Axis    `json:"axis"`
	Rotate   bool    `json:"rotate"`   // Walsh-Hadamard along head_dim before quantizing
	Outliers float64 `json:"outliers"` // fraction of largest |x| kept apart as FP16
	Residual int     `json:"residual"` // last tokens kept exact in the source dtype
	Sparsity float64 `json:"sparsity"` // fraction of smallest |x| zeroed first
	// Scale is an engine format's static per-tensor scale (vllm:fp8_e4m3:
	// the checkpoint's k_scale or v_scale, 1 without one), a float32
	// value; 0 (left out) for every other scheme.
	Scale float64 `json:"scale,omitempty"`
}

// Validate checks every field; the error names the field.
func (s Scheme) Validate() error {
	switch q := quantizerOf(s.Method); {
	case q == nil:
		return fmt.Errorf("unknown method %q (want %s, none, or an engine's format such as llama.cpp:q4_0)", s.Method, methodNames())
	case q.identity:
		if s != noneScheme() {
			return fmt.Errorf("none stores the tensor unchanged: it takes no bits, group, axis or option, got %+v", s)
		}
		return nil
	case q.engine != nil:
		return s.validateEngine(q.engine)
	case q.packed():
		if s.Bits < q.minBits || s.Bits > q.maxBits {
			return fmt.Errorf("bits %d out of range [%d, %d] for %s", s.Bits, q.minBits, q.maxBits, s.Method)
		}
		if s.Group <= 0 || s.Group%2 != 0 || s.Group > MaxGroupSize {
			return fmt.Errorf("group size %d must be a positive even number at most %d", s.Group, MaxGroupSize)
		}
	case s.Bits != q.block.bits || s.Group != GGMLBlock || s.Axis != Token:
		return fmt.Errorf("%s is %d-bit blocks of %d along the token axis, got bits %d group %d axis %s",
			s.Method, q.block.bits, GGMLBlock, s.Bits, s.Group, s.Axis)
	}
	if s.Axis != Token && s.Axis != Channel {
		return fmt.Errorf("unknown axis %q (want token or channel)", s.Axis)
	}
	if s.Scale != 0 {
		return fmt.Errorf("/scale is an engine format's static scale (vllm:fp8_e4m3/scale0.02); %s computes its own", s.Method)
	}
	if s.Rotate && s.Axis != Token {
		return fmt.Errorf("rotation works along the token axis only")
	}
	if !(s.Outliers >= 0 && s.Outliers < 1) {
		return fmt.Errorf("outlier fraction %g out of range [0, 1)", s.Outliers)
	}
	if !(s.Sparsity >= 0 && s.Sparsity < 1) {
		return fmt.Errorf("sparsity %g out of range [0, 1)", s.Sparsity)
	}
	if s.Residual < 0 || s.Residual > MaxResidual {
		return fmt.Errorf("residual %d out of range [0, %d]", s.Residual, MaxResidual)
	}
	return nil
}

// needs4D reports whether the scheme needs a [batch, heads, tokens, head_dim] tensor.
func (s Scheme) needs4D() bool { return s.Axis == Channel || s.Rotate || s.Residual > 0 }

// String is the scheme's canonical spelling in the spec grammar.
func (s Scheme) String() string {
	if q := quantizerOf(s.Method); q != nil && q.engine != nil {
		return s.engineString(q.engine)
	}
	if s.Method == None {
		return string(None)
	}
	var b strings.Builder
	if s.Method.IsGGML() {
		b.WriteString(string(s.Method))
	} else {
		fmt.Fprintf(&b, "%s%d/g%d", s.Method, s.Bits, s.Group)
		if s.Axis == Channel {
			b.WriteString("/channel")
		}
	}
	if s.Rotate {
		b.WriteString("/rot")
	}
	if s.Outliers > 0 {
		b.WriteString("/out" + strconv.FormatFloat(s.Outliers, 'g', -1, 64))
	}
	if s.Residual > 0 {
		b.WriteString("/res" + strconv.Itoa(s.Residual))
	}
	if s.Sparsity > 0 {
		b.WriteString("/sp" + strconv.FormatFloat(s.Sparsity, 'g', -1, 64))
	}
	return b.String()
}

// Spec is a scheme for each role: keys (tensors named layer_{i}_key) and
// values (every other tensor), and per-layer overrides of them (layers.go).
type Spec struct {
	Key    Scheme     `json:"key"`
	Value  Scheme     `json:"value"`
	Layers []Override `json:"layers,omitempty"` // canonical: keys then values, by layer, none equal to its default
	// Heads are head overrides (layers.go): canonical, keys then values, by
	// head then layer, none equal to its slot's scheme.
	Heads []HeadOverride `json:"heads,omitempty"`
	// Lossless adds the entropy stage after the quantizer (lossless.go):
	// smaller files, the same reconstruction.
	Lossless bool `json:"lossless,omitempty"`
	// Wire adds the wire stage instead (wire.go): context rANS on the
	// codes, the lossless stage's coder on the other parts.
	Wire bool `json:"wire,omitempty"`
}

// LosslessSuffix switches the lossless stage on in a spec string.
const LosslessSuffix = "+lossless"

// For returns the scheme of the tensor called name: its layer's override,
// else its role's default.
func (s Spec) For(name string) Scheme {
	layer, r, ok := slotOf(name)
	if !ok {
		return s.Value
	}
	if sc, ok := s.override(layer, r); ok {
		return sc
	}
	return s.defaultFor(r)
}

// Validate checks both roles and every override; the error names the role
// or the slot.
func (s Spec) Validate() error {
	if err := s.Key.Validate(); err != nil {
		return fmt.Errorf("key scheme: %w", err)
	}
	if err := s.Value.Validate(); err != nil {
		return fmt.Errorf("value scheme: %w", err)
	}
	if err := s.validateLayers(); err != nil {
		return err
	}
	if err := s.checkEngineRoles(); err != nil {
		return err
	}
	if s.Lossless && s.Wire {
		return fmt.Errorf("%s and %s are two entropy stages: take one", LosslessSuffix, WireSuffix)
	}
	if s.Lossless || s.Wire {
		suffix := LosslessSuffix
		if s.Wire {
			suffix = WireSuffix
		}
		for _, sc := range append([]Scheme{s.Key, s.Value}, layerSchemes(s.Layers)...) {
			if q := quantizerOf(sc.Method); q != nil && q.engine != nil && q.engine.whole {
				return fmt.Errorf("%s is entropy-coded by the engine's own coder: it takes no %s", sc.Method, suffix)
			}
		}
	}
	return nil
}

// layerSchemes are the schemes of the overrides.
func layerSchemes(os []Override) []Scheme {
	out := make([]Scheme, len(os))
	for i, o := range os {
		out[i] = o.Scheme
	}
	return out
}

// String is the canonical spec: one scheme when both roles share it,
// else "k=SCHEME,v=SCHEME", then the overrides. ParseSpec(s.String())
// equals s.
func (s Spec) String() string {
	out := "k=" + s.Key.String() + ",v=" + s.Value.String()
	if s.Key == s.Value {
		out = s.Key.String()
	}
	out += s.layersString()
	if s.Lossless {
		out += LosslessSuffix
	}
	if s.Wire {
		out += WireSuffix
	}
	return out
}

// Name is the preset name of s, or its canonical spec when no preset matches.
func (s Spec) Name() string {
	plain := s
	plain.Lossless, plain.Wire = false, false
	for _, p := range append(presets[:len(presets):len(presets)], engineCombos...) {
		if p.spec.Equal(plain) {
			if s.Lossless {
				return p.name + LosslessSuffix
			}
			if s.Wire {
				return p.name + WireSuffix
			}
			return p.name
		}
	}
	return s.String()
}

func symScheme(m Method, bits, group int, axis Axis) Scheme {
	return Scheme{Method: m, Bits: bits, Group: group, Axis: axis}
}

func both(s Scheme) Spec { return Spec{Key: s, Value: s} }

// rotated is s after the Walsh-Hadamard rotation, for both roles.
func rotated(s Scheme) Spec {
	s.Rotate = true
	return both(s)
}

func ggmlScheme(m Method) Scheme {
	t, _ := ggmlInfo(m)
	return Scheme{Method: m, Bits: t.bits, Group: GGMLBlock, Axis: Token}
}

// A preset is a named Spec that -scheme accepts.
type preset struct {
	name string
	spec Spec
}

// presets are the schemes engineers deploy, by the names the README gives
// and in its order: one list, so the order, the names and the usage text
// cannot disagree. presetIndex rejects a name given twice.
var presets = []preset{
	{"int4", both(symScheme(Sym, 4, 64, Token))},
	{"int8", both(symScheme(Sym, 8, 64, Token))},
	{"asym4", both(symScheme(Asym, 4, 64, Token))},
	{"kivi4", Spec{Key: symScheme(Asym, 4, 64, Channel), Value: symScheme(Asym, 4, 64, Token)}},
	{"kivi2", Spec{Key: symScheme(Asym, 2, 32, Channel), Value: symScheme(Asym, 2, 32, Token)}},
	{"rot4", rotated(symScheme(Sym, 4, 64, Token))},
	{"rot3", rotated(symScheme(SymF, 3, 64, Token))},
	{"lm2rot", rotated(symScheme(LM, 2, 64, Token))},
	{"lm3rot", rotated(symScheme(LM, 3, 64, Token))},
	{"lm4rot", rotated(symScheme(LM, 4, 64, Token))},
	{"q4_0", both(ggmlScheme(Q4_0))},
	{"q4_1", both(ggmlScheme(Q4_1))},
	{"q5_0", both(ggmlScheme(Q5_0))},
	{"q5_1", both(ggmlScheme(Q5_1))},
	{"q8_0", both(ggmlScheme(Q8_0))},
}

// presetByName indexes presets; it is built when the package loads, so a
// duplicate name stops every program that links it, as a second
// registration does in archive/zip.
var presetByName = presetIndex(presets)

// presetIndex maps each name of ps to its Spec, and panics on a name given
// twice.
func presetIndex(ps []preset) map[string]Spec {
	m := make(map[string]Spec, len(ps))
	for _, p := range ps {
		if _, dup := m[p.name]; dup {
			panic("compression: preset " + p.name + " defined twice")
		}
		m[p.name] = p.spec
	}
	return m
}

// namedSpec is the preset, or the engine's named pairing of a K and a V
// format (exllamav2:q6), called name.
func namedSpec(name string) (Spec, bool) {
	if p, ok := presetByName[name]; ok {
		return p, true
	}
	for _, c := range engineCombos {
		if c.name == name {
			return c.spec, true
		}
	}
	return Spec{}, false
}

// DefaultPreset is the scheme used when none is given.
const DefaultPreset = "int4"

// PresetNames lists the presets in the README's order.
func PresetNames() []string {
	names := make([]string, len(presets))
	for i, p := range presets {
		names[i] = p.name
	}
	return names
}

// Preset returns the named preset.
func Preset(name string) (Spec, bool) {
	s, ok := presetByName[name]
	return s, ok
}

// DefaultSpec is the default preset (sym 4-bit groups of 64).
func DefaultSpec() Spec { return presetByName[DefaultPreset] }

// ParseSpec reads a preset name, a spec in the grammar
//
//	spec   = ( scheme | "k=" scheme "," "v=" scheme ) { "," layers "=" scheme } [ "+lossless" | "+wire" ]
//	layers = ( "k" | "v" | "kv" ) N [ "-" M ]
//	scheme = preset | base { "/" option }
//	base   = ("sym" | "symf" | "asym" | "lm") bits | "q4_0" | "q4_1" | "q5_0" | "q5_1" | "q8_0"
//	       | "none" | engine ":" format
//	option = "g" N | "token" | "channel" | "rot" | "norot" | "out" P | "res" N | "sp" P | "scale" S
//
// (a preset inside k= or v= gives that role's scheme, and may take options;
// engine ":" format is an engine's cache format as the engine names it,
// llama.cpp:q4_0, with the engine's defaults: engine.go; none stores a
// tensor unchanged: identity.go),
// or the JSON form {"key": {...}, "value": {...}, "layers": [...]} that
// Spec marshals to, where a field left out takes the grammar's default
// (specjson.go). The overrides (layers.go) replace a role's scheme in
// layers N to M; a later one wins. The result is validated and canonical.
func ParseSpec(text string) (Spec, error) {
	text = strings.TrimSpace(text)
	orig := text
	lossless := strings.HasSuffix(text, LosslessSuffix)
	text = strings.TrimSuffix(text, LosslessSuffix)
	wire := strings.HasSuffix(text, WireSuffix)
	text = strings.TrimSuffix(text, WireSuffix)
	var s Spec
	var err error
	switch {
	case strings.HasPrefix(text, "{"):
		s, err = parseJSONSpec(text)
	case strings.Contains(text, "="):
		s, err = parseRoles(text)
	default:
		var sc Scheme
		if p, ok := namedSpec(text); ok {
			s = p
		} else if sc, err = parseScheme(text, roleBoth); err == nil {
			s = both(sc)
		}
	}
	if err != nil {
		return Spec{}, fmt.Errorf("scheme %q: %w", orig, err)
	}
	s.Lossless = s.Lossless || lossless
	s.Wire = s.Wire || wire
	if err := s.Validate(); err != nil {
		return Spec{}, fmt.Errorf("scheme %q: %w", orig, err)
	}
	s.normalize()
	return s, nil
}

type role int

const (
	roleBoth role = iota
	roleKey
	roleValue
)

// parseRoles reads the defaults, as one scheme (a preset may differ by
// role) or k= and v=, then any overrides.
func parseRoles(text string) (Spec, error) {
	var s Spec
	seen := map[string]bool{}
	for i, part := range strings.Split(text, ",") {
		part = strings.TrimSpace(part)
		k, v, ok := strings.Cut(part, "=")
		switch {
		case !ok && i == 0:
			if p, isPreset := namedSpec(part); isPreset {
				s.Key, s.Value = p.Key, p.Value
			} else {
				sc, err := parseScheme(part, roleBoth)
				if err != nil {
					return Spec{}, err
				}
				s.Key, s.Value = sc, sc
			}
			seen["k"], seen["v"] = true, true
		case ok && (k == "k" || k == "v") && !seen[k] && !seen["layers"]:
			seen[k] = true
			r := roleKey
			if k == "v" {
				r = roleValue
			}
			sc, err := parseScheme(strings.TrimSpace(v), r)
			if err != nil {
				return Spec{}, err
			}
			if r == roleKey {
				s.Key = sc
			} else {
				s.Value = sc
			}
		case ok && k != "k" && k != "v" && seen["k"] && seen["v"]:
			seen["layers"] = true
			o, h, err := parseOverride(strings.TrimSpace(k), strings.TrimSpace(v))
			if err != nil {
				return Spec{}, err
			}
			s.Layers = append(s.Layers, o...)
			s.Heads = append(s.Heads, h...)
		case ok && (k == "k" || k == "v" || overrideRE.MatchString(k)):
			return Spec{}, fmt.Errorf("part %q: the defaults (k= and v=, once each, or one scheme) come before the layers", part)
		default:
			return Spec{}, fmt.Errorf("part %q: %s", part, partsWanted)
		}
	}
	if !seen["k"] || !seen["v"] {
		return Spec{}, fmt.Errorf("both k= and v= are needed")
	}
	return s, nil
}

func parseScheme(text string, r role) (Scheme, error) {
	parts := strings.Split(text, "/")
	var s Scheme
	base := parts[0]
	if p, ok := namedSpec(base); ok {
		s = p.Value
		if r == roleKey {
			s = p.Key
		} else if r == roleBoth && p.Key != p.Value {
			return Scheme{}, fmt.Errorf("preset %s differs by role; options cannot follow it", base)
		}
	} else if m, digits, ok := parseBase(base); ok {
		bits, err := strconv.Atoi(digits)
		if err != nil {
			return Scheme{}, fmt.Errorf("bits %q: %v", digits, err)
		}
		s = Scheme{Method: m, Bits: bits, Group: 64, Axis: Token}
	} else if strings.Contains(base, ":") {
		var err error
		if s, err = parseEngineBase(base); err != nil {
			return Scheme{}, err
		}
	} else if base == string(None) {
		s = noneScheme()
	} else if Method(base).IsGGML() {
		s = ggmlScheme(Method(base))
	} else {
		return Scheme{}, fmt.Errorf("unknown scheme %q (presets: %s; or %s; none; or ENGINE:FORMAT such as llama.cpp:q4_0)",
			base, strings.Join(PresetNames(), ", "), baseNames())
	}
	for _, opt := range parts[1:] {
		if err := s.setOption(opt); err != nil {
			return Scheme{}, err
		}
	}
	return s, nil
}

func (s *Scheme) setOption(opt string) error {
	num := func(prefix string) (float64, error) {
		v, err := strconv.ParseFloat(strings.TrimPrefix(opt, prefix), 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			return 0, fmt.Errorf("option %q: not a finite number", opt)
		}
		return v, nil
	}
	integer := func(prefix string) (int, error) {
		v, err := strconv.ParseInt(strings.TrimPrefix(opt, prefix), 10, 64)
		if err != nil || v < 0 || v > math.MaxInt32 {
			return 0, fmt.Errorf("option %q: not an integer in [0, %d]", opt, math.MaxInt32)
		}
		return int(v), nil
	}
	var err error
	switch {
	case opt == "token", opt == "channel":
		s.Axis = Axis(opt)
	case opt == "rot":
		s.Rotate = true
	case opt == "norot": // the negation, for the engine formats that rotate by default
		s.Rotate = false
	case strings.HasPrefix(opt, "g"):
		s.Group, err = integer("g")
	case strings.HasPrefix(opt, "out"):
		s.Outliers, err = num("out")
	case strings.HasPrefix(opt, "res"):
		s.Residual, err = integer("res")
	case strings.HasPrefix(opt, "sp"):
		s.Sparsity, err = num("sp")
	case strings.HasPrefix(opt, "scale"): // held as the float32 the engine loads
		var v float64
		v, err = num("scale")
		s.Scale = float64(float32(v))
	default:
		return fmt.Errorf("unknown option %q (want gN, token, channel, rot, norot, outP, resN, spP, scaleS)", opt)
	}
	return err
}
