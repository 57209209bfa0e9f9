package compression

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"kvlib/pkg/safetensors"
)

// Engine-qualified schemes: the KV-cache formats serving engines ship,
// named as the engine spells them and qualified by the engine,
// "engine:format[/option]" (llama.cpp:q4_0, llama.cpp:q8_0/norot). Each
// is bit-exact to the engine's own arithmetic at a pinned release, which
// the format's Go doc comment cites by file and line. They are methods of
// their own, looked up beside the methods table (quantizerOf), and take
// no option of kvlib's stages: only the engine's switches (for llama.cpp,
// its default Hadamard rotation, which /norot turns off).

// An engine is one serving engine whose cache formats kvlib reproduces.
type engine struct {
	name    string // as the spec names it: "llama.cpp"
	version string // the release the arithmetic follows
	flag    string // how a user picks a format, with %s for the format (and %s again)
	formats []*engineFormat
	// detail says what ran against what for a format's evidence level.
	detail func(f *engineFormat) string
	// combos are the engine's options that pair a K format with another
	// V format under a name of their own (ExLlamaV2's Q6: K q8, V q4).
	combos []engineCombo
	// blockRule says why a block format refuses a head_dim its blocks do
	// not divide, citing the source: a format for the format's name, the
	// head_dim and the block size (%[1]s, %[2]d, %[3]d).
	blockRule string
	// mode is how kvlib measures the engine's use of its formats:
	// "write" (a serving engine quantizes every token as it writes it;
	// the default when empty) or "prefix" (a KV-sharing system stores
	// and restores a finished prefix's cache).
	mode string
	// unregistered are names the engine's source ships but no
	// configuration can select, with the one-line refusal a spec naming
	// one gets (LMCache 0.5.6's asym_k16_v8).
	unregistered map[string]string
}

// An engineFormat is one of an engine's cache formats.
type engineFormat struct {
	engine  *engine
	name    string // as the engine's flag spells it
	bits    int    // code width (f16: 16)
	elems   int    // elements per block: 32, or 1 for an unblocked type
	bytes   int    // bytes per block
	rotates bool   // the engine rotates it by default (a quantized llama.cpp type)
	// perHead: one block per head vector of each token (elems and bytes
	// unset: head_dim codes of bits/8 bytes, then a float32 scale).
	perHead bool
	// scaled: a static per-tensor scale, the scheme's Scale (default 1),
	// divides the values before the conversion and multiplies them after;
	// scaleMax is the largest value the format holds, what a calibrated
	// scale maps a tensor's largest |x| to (amax / scaleMax).
	scaled   bool
	scaleMax float64
	// kvScale: the engine keeps one scale per layer for K and V together
	// (TensorRT-LLM's max(k_scale, v_scale)); a calibration gives both the
	// larger one.
	kvScale  bool
	evidence string // "executed" or "read" (see evidenceOf)
	flags    string // how a user picks it, when not the engine's flag with the name
	source   string // where its arithmetic is, for kv-compress schemes
	// quantize writes one block of x (elems values) into dst (bytes
	// bytes), and reports whether x held a NaN or an Inf; dequantize is
	// the engine's read of it. Both are total: a NaN, an Inf or an
	// overflowing scale gives what the engine computes.
	quantize   func(x []float32, dst []byte) (nonFinite bool)
	dequantize func(src []byte, dst []float32)
	// quantizeDT, when set instead of quantize, also takes the cache's
	// dtype: a format that rounds an intermediate to it.
	quantizeDT func(x []float32, dst []byte, dt safetensors.DType) (nonFinite bool)
	// quantizeScaled and dequantizeScaled, when set instead, also take the
	// scheme's static scale k (a scaled block format: NVFP4's global scale
	// is 1/k), and the write counts the values it clamped (saturated).
	quantizeScaled   func(x []float32, dst []byte, k float32) (nonFinite bool, saturated int)
	dequantizeScaled func(src []byte, dst []float32, k float32)
	// quantizeRun and dequantizeRun, when set beside them, do the same for
	// a run of whole consecutive blocks (x and dst of many blocks, converted
	// as r says): nonFinite if any block held a NaN or an Inf, saturated the
	// total. The chunks call them once where every group is a whole block
	// (Axis Token).
	quantizeRun   func(x []float32, dst []byte, r blockRun) (nonFinite bool, saturated int)
	dequantizeRun func(src []byte, dst []float32, r blockRun)
	// encodeAll and decodeAll, for an unblocked type, convert a whole
	// chunk at once (quantizer.encodeAll); nil for block types.
	encodeAll func(j *tensorJob, x []float32, qlo, qhi int)
	decodeAll func(j *tensorJob, y []float32, qlo, qhi int)
	// identity: the engine stores the cache's own bytes (LMCache's kivi
	// serde), as none does: bits is nominal, the source dtype's size is
	// what is stored.
	identity bool
	// whole: a format of variable size, coded a tensor at a time
	// (LMCache's CacheGen): encodeTensor writes the whole of .codes (in
	// prepare) and decodes it back, decodeTensor parses and checks a
	// stored .codes before the chunks dequantize it (decodeAll); bins is
	// the engine's per-tensor decision, recorded in the header (bins).
	// nominal, when set, is its nominal bits per element.
	whole        bool
	bins         func(name string, names []string) (int, error)
	encodeTensor func(j *tensorJob) error
	decodeTensor func(j *tensorJob) error
	nominal      float64
	// role, when set, is the one role the format is for: it is half of an
	// engine option that pairs a K format with a V format (vLLM's
	// TurboQuant presets), listed as that option (a combo), not alone;
	// pairs names those options for the refusal of the other role.
	role  Role
	pairs string
	// headSize, for a per-head format whose head vector is not its codes
	// and a float32 scale, is the bytes of one head vector of d elements;
	// headRule refuses a head_dim the engine does not take (nil: any).
	headSize func(d int) int
	headRule func(d int) error
	// boundary is how many layers at each end of the model the engine
	// keeps unquantized whenever the format is the cache's (vLLM keeps the
	// first and last two of a TurboQuant cache at the model's dtype):
	// kv-compress stores them with none (withEngineSkips).
	boundary int
}

// A blockRun is how a run of blocks is converted: k, the scheme's static
// scale (as quantizeScaled's; unused by the unscaled formats), elems, the
// values a block (a per-head format's head_dim), and the cache's dtype
// (as quantizeDT's).
type blockRun struct {
	k            float32
	elems, bytes int // a block's values and stored bytes
	dtype        safetensors.DType
}

// quantizeBlock writes one block by whichever write the format has (the
// chunks' per-group path and runQuantize's loop): nonFinite and the values
// it clamped.
func (f *engineFormat) quantizeBlock(x []float32, dst []byte, r blockRun) (nonFinite bool, saturated int) {
	switch {
	case f.quantizeScaled != nil:
		return f.quantizeScaled(x, dst, r.k)
	case f.quantizeDT != nil:
		return f.quantizeDT(x, dst, r.dtype), 0
	}
	return f.quantize(x, dst), 0
}

// dequantizeBlock reads one block back by whichever read the format has.
func (f *engineFormat) dequantizeBlock(src []byte, dst []float32, r blockRun) {
	if f.dequantizeScaled != nil {
		f.dequantizeScaled(src, dst, r.k)
		return
	}
	f.dequantize(src, dst)
}

// runQuantize is quantizeRun, or for a format without one its block write
// over the run's blocks in one loop (no per-group dispatch).
func (f *engineFormat) runQuantize(x []float32, dst []byte, r blockRun) (nonFinite bool, saturated int) {
	if f.quantizeRun != nil {
		return f.quantizeRun(x, dst, r)
	}
	for b := 0; b < len(x)/r.elems; b++ {
		nf, n := f.quantizeBlock(x[b*r.elems:(b+1)*r.elems], dst[b*r.bytes:(b+1)*r.bytes], r)
		nonFinite, saturated = nonFinite || nf, saturated+n
	}
	return nonFinite, saturated
}

// runDequantize is dequantizeRun, or the block read over the run's blocks.
func (f *engineFormat) runDequantize(src []byte, dst []float32, r blockRun) {
	if f.dequantizeRun != nil {
		f.dequantizeRun(src, dst, r)
		return
	}
	for b := 0; b < len(dst)/r.elems; b++ {
		f.dequantizeBlock(src[b*r.bytes:(b+1)*r.bytes], dst[b*r.elems:(b+1)*r.elems], r)
	}
}

// An engineCombo is an engine option made of one format for K and another
// for V, named "engine:name" like a format.
type engineCombo struct {
	name, flag, key, value string
	why                    string // the source that says so
}

// engineCombos are every engine's combos as named specs, in menu order.
var engineCombos = buildEngineCombos()

func buildEngineCombos() []preset {
	_ = engineMethods // built first: it ties each format to its engine
	var out []preset
	for _, e := range engines {
		for _, c := range e.combos {
			k, errK := parseEngineBase(e.name + ":" + c.key)
			v, errV := parseEngineBase(e.name + ":" + c.value)
			if errK != nil || errV != nil {
				panic("compression: engine combo " + e.name + ":" + c.name + " names an unknown format")
			}
			out = append(out, preset{name: e.name + ":" + c.name, spec: Spec{Key: k, Value: v}})
		}
	}
	return out
}

// method is the format's Method, the qualified name.
func (f *engineFormat) method() Method { return Method(f.engine.name + ":" + f.name) }

// Evidence levels of an engine format (kv-compress schemes -engine).
const (
	// EvidenceExecuted: the engine's own code ran on the same bytes in a
	// test of this repository and agreed bit for bit.
	EvidenceExecuted = "executed"
	// EvidenceRead: implemented from the engine's source, file and line
	// cited, with no run of the engine's code to compare with.
	EvidenceRead = "read"
)

// engines lists the engines, in the order kv-compress schemes shows them.
var engines = []*engine{llamaCpp, vllm, sglang, trtllm, exllamaV2, exllamaV3, ocpMX, lmcache}

// engineMethods are the quantizers of every engine format, and the
// identity scheme none, looked up by quantizerOf after methods.
var engineMethods = buildEngineMethods()

func buildEngineMethods() []quantizer {
	qs := []quantizer{noneQuantizer}
	for _, e := range engines {
		for _, f := range e.formats {
			f.engine = e
			q := quantizer{method: f.method(), minBits: f.bits, maxBits: f.bits,
				block: &ggmlType{bits: f.bits, blockSize: f.bytes, elems: f.elems}, engine: f,
				encode: (*tensorJob).encodeEngine, decode: (*tensorJob).decodeEngine}
			q.encodeAll, q.decodeAll = f.encodeAll, f.decodeAll
			qs = append(qs, q)
		}
	}
	return qs
}

// engineNames lists the engines for an error message.
func engineNames() string {
	names := make([]string, len(engines))
	for i, e := range engines {
		names[i] = e.name
	}
	return strings.Join(names, ", ")
}

// parseEngineBase reads "engine:format" into the format's scheme, with
// the engine's defaults (llama.cpp's quantized types: rotation on).
func parseEngineBase(base string) (Scheme, error) {
	name, format, _ := strings.Cut(base, ":")
	i := slices.IndexFunc(engines, func(e *engine) bool { return e.name == name })
	if i < 0 {
		return Scheme{}, fmt.Errorf("unknown engine %q in %q (engines: %s)", name, base, engineNames())
	}
	e := engines[i]
	for _, f := range e.formats {
		if f.name == format {
			return engineScheme(f), nil
		}
	}
	if why, ok := e.unregistered[format]; ok {
		return Scheme{}, errors.New(why)
	}
	var menu []string
	for _, f := range e.formats {
		if f.role == "" {
			menu = append(menu, f.name)
		}
	}
	for _, c := range e.combos {
		menu = append(menu, c.name)
	}
	return Scheme{}, fmt.Errorf("%s has no KV-cache format %q (its formats: %s)", e.name, format, strings.Join(menu, ", "))
}

// engineScheme is format f's scheme with the engine's defaults.
func engineScheme(f *engineFormat) Scheme {
	s := Scheme{Method: f.method(), Bits: f.bits, Group: f.elems, Axis: Token, Rotate: f.rotates}
	if f.scaled {
		s.Scale = 1
	}
	return s
}

// headBytes is the bytes of one head vector of d elements of a
// per-token-head format: its codes and a float32 scale.
func (f *engineFormat) headBytes(d int) int {
	if f.headSize != nil {
		return f.headSize(d)
	}
	return d*f.bits/8 + 4
}

// validateEngine checks a scheme of an engine format: its width and
// block are the format's, and only the engine's own switch is set.
func (s Scheme) validateEngine(f *engineFormat) error {
	switch {
	case s.Bits != f.bits || s.Group != f.elems || s.Axis != Token:
		return fmt.Errorf("%s is the engine's %d-bit format in blocks of %d along head_dim, got bits %d group %d axis %s",
			s.Method, f.bits, f.elems, s.Bits, s.Group, s.Axis)
	case s.Outliers != 0 || s.Residual != 0 || s.Sparsity != 0:
		return fmt.Errorf("%s is the engine's format as it ships: it takes no outliers, residual or sparsity", s.Method)
	case s.Rotate && !f.rotates:
		return fmt.Errorf("%s is never rotated by the engine (its rotation is for quantized cache types)", s.Method)
	case f.scaled && !(float32(s.Scale) > 0 && s.Scale <= math.MaxFloat32):
		return fmt.Errorf("%s takes a positive finite float32 scale (/scaleS, default 1), got %g", s.Method, s.Scale)
	case f.quantizeScaled != nil && math.IsInf(float64(1/float32(s.Scale)), 0):
		return fmt.Errorf("%s takes a scale whose reciprocal, the engine's global scale 1/k_scale, is a finite float32, got %g",
			s.Method, s.Scale)
	case !f.scaled && s.Scale != 0:
		return fmt.Errorf("%s computes its own scales: it takes no /scale", s.Method)
	}
	return nil
}

// engineString is an engine scheme's canonical spelling: the name, and
// /norot where the engine would rotate and the scheme does not.
func (s Scheme) engineString(f *engineFormat) string {
	switch {
	case f.rotates && !s.Rotate:
		return string(s.Method) + "/norot"
	case f.scaled && s.Scale != 1:
		return string(s.Method) + "/scale" + strconv.FormatFloat(s.Scale, 'g', -1, 32)
	}
	return string(s.Method)
}

// RotationInfo says what the engine's rotation does to one tensor: the
// Hadamard size along head_dim (0: none) and, for the report, why.
type RotationInfo struct {
	Size int
	Why  string
}

// headDims is the head_dim of every 4-D tensor of a cache, by role: the
// engine rotates a role only when all its layers share one head size.
type headDims map[Role][]int

// cacheHeadDims gathers the head sizes of the tensors of a cache.
func cacheHeadDims(names []string, shapes [][]int) headDims {
	hd := headDims{}
	for i, name := range names {
		if len(shapes[i]) != 4 {
			continue
		}
		r := roleOf(name)
		if !slices.Contains(hd[r], shapes[i][3]) {
			hd[r] = append(hd[r], shapes[i][3])
		}
	}
	return hd
}

// roleOf is the role whose scheme a tensor takes: keys are the tensors
// named layer_{i}_key, values every other one.
func roleOf(name string) Role {
	if _, r, ok := slotOf(name); ok {
		return r
	}
	return ValueRole
}

// engineRotation decides the engine's rotation of a tensor of the given
// shape and role under scheme s (an engine format's): nil for a scheme of
// kvlib's own. For llama.cpp, src/llama-kv-cache.cpp:315-336: on for a
// quantized type unless LLAMA_ATTN_ROT_DISABLE (kvlib's /norot), when
// every layer has one head size (194-206) and head_dim % 64 == 0; of the
// largest power of two >= 64 dividing head_dim for K (1447-1466), of 64
// for V (1468-1487). A head_dim the engine refuses for the format at all
// is an error.
func engineRotation(s Scheme, r Role, shape []int, hd headDims) (*RotationInfo, error) {
	q := quantizerOf(s.Method)
	if q == nil || q.engine == nil {
		return nil, nil
	}
	f := q.engine
	if len(shape) == 4 && f.headRule != nil {
		if err := f.headRule(shape[3]); err != nil {
			return nil, err
		}
	} else if len(shape) == 4 && f.perHead && shape[3]*f.bits%8 != 0 {
		return nil, fmt.Errorf("%s refuses head_dim %d: its %d-bit codes fill whole bytes per head vector "+
			"(v1/attention/ops/int4_per_token_head.py:273 asserts head_size %% 2 == 0)", s.Method, shape[3], f.bits)
	}
	if len(shape) == 4 && f.elems > 1 && shape[3]%f.elems != 0 {
		return nil, fmt.Errorf(f.engine.blockRule, f.name, shape[3], f.elems)
	}
	if f.engine != llamaCpp {
		return nil, nil
	}
	switch {
	case !f.rotates:
		return &RotationInfo{Why: fmt.Sprintf("off (%s is not a quantized type; llama.cpp rotates only those)", f.name)}, nil
	case !s.Rotate:
		return &RotationInfo{Why: "off (/norot, as LLAMA_ATTN_ROT_DISABLE=1)"}, nil
	case len(shape) != 4:
		return nil, fmt.Errorf("%s rotates along head_dim as llama.cpp does and needs a 4-D [batch, heads, tokens, head_dim] tensor, shape is %v (%s/norot does not)",
			s.Method, shape, s.Method)
	}
	d := shape[3]
	if dims := hd[r]; len(dims) > 1 {
		return &RotationInfo{Why: fmt.Sprintf("off (the %s tensors have different head sizes %v; llama.cpp rotates only one head size per cache)", r, dims)}, nil
	}
	if d%64 != 0 {
		return &RotationInfo{Why: fmt.Sprintf("off (head_dim %d is not a multiple of 64)", d)}, nil
	}
	n := 64
	if r == KeyRole {
		n = d & -d // the largest power of two dividing d, at least 64
	}
	return &RotationInfo{Size: n, Why: fmt.Sprintf("on (Hadamard %d along head_dim %d)", n, d)}, nil
}

// EngineFormatInfo is one row of kv-compress schemes -engine: a format's
// scheme (as check prints it) and where its arithmetic comes from.
type EngineFormatInfo struct {
	SchemeInfo
	Engine         string `json:"engine"`
	Format         string `json:"format"`         // as the engine's flag spells it
	EngineVersion  string `json:"engine_version"` // the release the arithmetic follows
	Flags          string `json:"flags"`          // what a user passes the engine for it
	Rotation       string `json:"rotation"`       // the engine's default, and the switch
	Evidence       string `json:"evidence"`       // executed or read
	EvidenceDetail string `json:"evidence_detail"`
	Source         string `json:"source"` // file:line of the arithmetic
	// Mode is the measurement mode of the engine's use: write (a serving
	// engine writes every token quantized) or prefix (a KV-sharing
	// system stores a finished prefix).
	Mode string `json:"mode"`
	// ScaleMax, for a format with a static scale, is the largest value
	// it holds: a calibrated scale is amax / ScaleMax.
	ScaleMax float64 `json:"scale_max,omitempty"`
	// SharedScale: one static scale per layer serves K and V alike.
	SharedScale bool `json:"shared_scale,omitempty"`
	// BoundaryLayers is how many layers at each end of a model the engine
	// keeps unquantized with this option (vLLM's TurboQuant: 2); kv-compress
	// stores them with none when it compresses a whole cache.
	BoundaryLayers int `json:"boundary_layers,omitempty"`
}

// measuredIn is the engine's measurement mode (write unless it says).
func (e *engine) measuredIn() string {
	if e.mode == "" {
		return "write"
	}
	return e.mode
}

// EngineNames lists the engines kv-compress knows.
func EngineNames() []string {
	names := make([]string, len(engines))
	for i, e := range engines {
		names[i] = e.name
	}
	return names
}

// EngineReport lists every format of the named engine ("all": of every
// engine), in the engine's menu order.
func EngineReport(name string) ([]EngineFormatInfo, error) {
	var out []EngineFormatInfo
	for _, e := range engines {
		if name != "all" && name != e.name {
			continue
		}
		for _, f := range e.formats {
			if f.role != "" { // half of a combo: listed as the combo
				continue
			}
			s := both(engineScheme(f))
			flags := f.flags
			if flags == "" {
				flags = strings.ReplaceAll(e.flag, "%s", f.name)
			}
			info := EngineFormatInfo{SchemeInfo: SchemeReport("", s), Engine: e.name, Format: f.name, EngineVersion: e.version,
				Flags: flags, Evidence: f.evidence, EvidenceDetail: e.detail(f), Source: f.source, ScaleMax: f.scaleMax,
				SharedScale: f.kvScale, Mode: e.measuredIn()}
			info.Rotation = "none: the engine never rotates this type"
			switch {
			case f.scaled:
				info.Rotation = "none; a static per-tensor scale: /scaleS (default 1, the flag alone with no scales in the checkpoint)"
			case f.rotates:
				info.Rotation = "on by default (K: Hadamard of the largest power of two >= 64 dividing head_dim; V: 64; " +
					"only when head_dim % 64 == 0); /norot is LLAMA_ATTN_ROT_DISABLE=1"
			}
			out = append(out, info)
		}
		for _, c := range e.combos {
			spec, _ := namedSpec(e.name + ":" + c.name)
			k := quantizerOf(spec.Key.Method).engine
			v := quantizerOf(spec.Value.Method).engine
			source := c.why
			if k.role != "" { // halves listed only as this option: their source is its own
				source += "; " + k.source
			}
			info := EngineFormatInfo{SchemeInfo: SchemeReport("", spec), Engine: e.name, Format: c.name, EngineVersion: e.version,
				Flags: c.flag, Rotation: "as its K and V formats", Evidence: k.evidence,
				EvidenceDetail: c.why + "; " + e.detail(k), Source: source, Mode: e.measuredIn(),
				BoundaryLayers: max(k.boundary, v.boundary)}
			out = append(out, info)
		}
	}
	if out == nil {
		return nil, fmt.Errorf("unknown engine %q (engines: %s, or all)", name, engineNames())
	}
	return out, nil
}

// checkEngineRoles refuses a format that is one role's half of an engine
// option (vllm:turboquant_v4) in a slot of the other role: the engine
// writes that role with it and never the other.
func (s Spec) checkEngineRoles() error {
	check := func(sc Scheme, r Role, where string) error {
		q := quantizerOf(sc.Method)
		if q == nil || q.engine == nil || q.engine.role == "" || q.engine.role == r {
			return nil
		}
		f := q.engine
		return fmt.Errorf("%s: %s is the %s half of %s's %s: it takes %s tensors only, not %ss",
			where, sc.Method, f.role, f.engine.name, f.pairs, f.role, r)
	}
	if err := check(s.Key, KeyRole, "key scheme"); err != nil {
		return err
	}
	if err := check(s.Value, ValueRole, "value scheme"); err != nil {
		return err
	}
	for _, o := range s.Layers {
		if err := check(o.Scheme, o.Role, fmt.Sprintf("layer %d %s scheme", o.Layer, o.Role)); err != nil {
			return err
		}
	}
	return nil
}

// withEngineSkips is s with the layers its engine keeps unquantized
// stored by none: when a role's default is a format with a boundary rule
// (vLLM's TurboQuant, TurboQuantConfig.get_boundary_skip_layers,
// model_executor/layers/quantization/turboquant/config.py:177-213, merged
// into --kv-cache-dtype-skip-layers by engine/arg_utils.py:2334-2351), the
// first n and the last n of the cache's layers, n = min(boundary, L/2) for
// the L layers the cache holds (layer_{i}_key and layer_{i}_value, in
// order of i), both roles, as vLLM gives a skipped layer the model's dtype
// for K and V (attention/attention.py:299-321). A cache holding every layer
// of a dense model gets vLLM's layers 0..n-1 and L-n..L-1; a file holding
// part of a model's layers has no way to say where the model begins and
// ends, and the rule applies to the layers it holds (one layer: n = 0). An
// override the spec sets for such a slot is the user's and stays.
func (s Spec) withEngineSkips(names []string) Spec {
	n := 0
	for _, sc := range []Scheme{s.Key, s.Value} {
		if q := quantizerOf(sc.Method); q != nil && q.engine != nil {
			n = max(n, q.engine.boundary)
		}
	}
	if n == 0 {
		return s
	}
	roles := map[int][]Role{}
	var layers []int
	for _, name := range names {
		l, r, ok := slotOf(name)
		if !ok {
			continue
		}
		if _, seen := roles[l]; !seen {
			layers = append(layers, l)
		}
		if !slices.Contains(roles[l], r) {
			roles[l] = append(roles[l], r)
		}
	}
	slices.Sort(layers)
	n = min(n, len(layers)/2)
	out := s
	out.Layers = slices.Clone(s.Layers)
	skipped := map[[2]any]bool{}
	for i, l := range layers {
		if i >= n && i < len(layers)-n {
			continue
		}
		for _, r := range roles[l] {
			if _, set := s.override(l, r); !set {
				out.Layers = append(out.Layers, Override{Layer: l, Role: r, Scheme: noneScheme()})
				skipped[[2]any{l, r}] = true
			}
		}
	}
	// a slot the engine keeps exact is exact whole: its head overrides go with the rest of it
	out.Heads = slices.DeleteFunc(slices.Clone(s.Heads), func(o HeadOverride) bool { return skipped[[2]any{o.Layer, o.Role}] })
	return out
}
