package compression

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Per-layer schemes. A Spec's Key and Value are the defaults of the two
// roles; Layers replace them for listed (layer, role) slots of the tensors
// named layer_{i}_key and layer_{i}_value. In a spec string they follow the
// defaults as "k<layers>=SCHEME", "v<layers>=SCHEME" or "kv<layers>=SCHEME"
// (both roles), with <layers> one layer or a range "3-5"; a later part
// replaces what an earlier one set:
//
//	lm3rot,k0-1=q8_0,v0=lm4rot
//
// The canonical form lists keys before values, by layer, consecutive layers
// with one scheme as a range, and drops overrides equal to the default.
//
// A head override ("k3h1=SCHEME", "kv0-5h2=SCHEME") sets the scheme of one
// KV head of a slot, over the slot's own (its override, else its role's
// default): a tensor [1, heads, tokens, head_dim] whose slot has one is
// stored a head at a time (heads.go). Head overrides follow the layer
// overrides in the canonical form, by role, head, then layer, and take
// kvlib's own schemes (an engine stores every head of a layer alike).

// Role is which tensors of a layer a scheme is for.
type Role string

// The two roles.
const (
	KeyRole   Role = "key"
	ValueRole Role = "value"
)

// MaxLayer bounds the layer numbers of overrides.
const MaxLayer = 1 << 20

// Override is one slot's scheme: a role in a layer.
type Override struct {
	Layer  int    `json:"layer"`
	Role   Role   `json:"role"`
	Scheme Scheme `json:"scheme"`
}

// HeadOverride is one KV head's scheme in a slot.
type HeadOverride struct {
	Layer  int    `json:"layer"`
	Role   Role   `json:"role"`
	Head   int    `json:"head"`
	Scheme Scheme `json:"scheme"`
}

// MaxHead bounds the head numbers of head overrides.
const MaxHead = MaxReportedHeads - 1

var slotName = regexp.MustCompile(`^layer_([0-9]+)_(key|value)$`)

// slotOf returns the layer and role of a tensor named layer_{i}_key or
// layer_{i}_value; ok is false for any other name.
func slotOf(name string) (layer int, r Role, ok bool) {
	m := slotName.FindStringSubmatch(name)
	if m == nil {
		return 0, "", false
	}
	layer, err := strconv.Atoi(m[1])
	if err != nil || layer > MaxLayer {
		return 0, "", false
	}
	return layer, Role(m[2]), true
}

// override returns the scheme set for (layer, r), if any: the last one
// set, as a later part replaces an earlier one (before normalize keeps one).
func (s Spec) override(layer int, r Role) (Scheme, bool) {
	var sc Scheme
	found := false
	for _, o := range s.Layers {
		if o.Layer == layer && o.Role == r {
			sc, found = o.Scheme, true
		}
	}
	return sc, found
}

// defaultFor is the role's default scheme.
func (s Spec) defaultFor(r Role) Scheme {
	if r == KeyRole {
		return s.Key
	}
	return s.Value
}

// normalize puts Layers in canonical order, keeping the last setting of
// each slot and dropping those equal to their role's default.
func (s *Spec) normalize() {
	last := map[[2]any]Scheme{}
	for _, o := range s.Layers {
		last[[2]any{o.Layer, o.Role}] = o.Scheme
	}
	var out []Override
	for k, sc := range last {
		o := Override{Layer: k[0].(int), Role: k[1].(Role), Scheme: sc}
		if sc != s.defaultFor(o.Role) {
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(a, b Override) int {
		if a.Role != b.Role {
			if a.Role == KeyRole {
				return -1
			}
			return 1
		}
		return a.Layer - b.Layer
	})
	s.Layers = out
	s.normalizeHeads()
}

// normalizeHeads keeps the last setting of each (layer, role, head), drops
// those equal to their slot's scheme, and sorts them: keys first, then by
// head and layer (so a head's consecutive layers print as a range).
func (s *Spec) normalizeHeads() {
	type slot struct {
		layer, head int
		role        Role
	}
	last := map[slot]Scheme{}
	for _, o := range s.Heads {
		last[slot{o.Layer, o.Head, o.Role}] = o.Scheme
	}
	var out []HeadOverride
	for k, sc := range last {
		if sc != s.slotScheme(k.layer, k.role) {
			out = append(out, HeadOverride{Layer: k.layer, Role: k.role, Head: k.head, Scheme: sc})
		}
	}
	slices.SortFunc(out, func(a, b HeadOverride) int {
		if a.Role != b.Role {
			if a.Role == KeyRole {
				return -1
			}
			return 1
		}
		if a.Head != b.Head {
			return a.Head - b.Head
		}
		return a.Layer - b.Layer
	})
	s.Heads = out
}

// slotScheme is the scheme of (layer, r) before any head override.
func (s Spec) slotScheme(layer int, r Role) Scheme {
	if sc, ok := s.override(layer, r); ok {
		return sc
	}
	return s.defaultFor(r)
}

// headSchemes returns each of the heads' schemes of the tensor called name,
// or nil when no head override names its slot (one scheme for the tensor).
func (s Spec) headSchemes(name string, heads int) []Scheme {
	layer, r, ok := slotOf(name)
	if !ok {
		return nil
	}
	var out []Scheme
	for _, o := range s.Heads {
		if o.Layer != layer || o.Role != r {
			continue
		}
		if out == nil {
			out = make([]Scheme, heads)
			for h := range out {
				out[h] = s.slotScheme(layer, r)
			}
		}
		if o.Head < heads {
			out[o.Head] = o.Scheme
		}
	}
	return out
}

// Canonical is s with its overrides in canonical form (after its schemes
// were changed, as the CLI's -bits flag does).
func (s Spec) Canonical() Spec {
	s.Layers = slices.Clone(s.Layers)
	s.normalize()
	return s
}

// validateLayers checks every override; the error names the slot.
func (s Spec) validateLayers() error {
	for _, o := range s.Layers {
		if o.Role != KeyRole && o.Role != ValueRole {
			return fmt.Errorf("layer %d: unknown role %q (want key or value)", o.Layer, o.Role)
		}
		if o.Layer < 0 || o.Layer > MaxLayer {
			return fmt.Errorf("layer %d out of range [0, %d]", o.Layer, MaxLayer)
		}
		if err := o.Scheme.Validate(); err != nil {
			return fmt.Errorf("layer %d %s scheme: %w", o.Layer, o.Role, err)
		}
	}
	for _, o := range s.Heads {
		if o.Role != KeyRole && o.Role != ValueRole {
			return fmt.Errorf("layer %d head %d: unknown role %q (want key or value)", o.Layer, o.Head, o.Role)
		}
		if o.Layer < 0 || o.Layer > MaxLayer || o.Head < 0 || o.Head > MaxHead {
			return fmt.Errorf("layer %d head %d: out of range (layers [0, %d], heads [0, %d])", o.Layer, o.Head, MaxLayer, MaxHead)
		}
		if err := o.Scheme.Validate(); err != nil {
			return fmt.Errorf("layer %d %s head %d scheme: %w", o.Layer, o.Role, o.Head, err)
		}
		for _, sc := range []Scheme{o.Scheme, s.slotScheme(o.Layer, o.Role)} {
			if q := quantizerOf(sc.Method); q != nil && q.engine != nil {
				return fmt.Errorf("layer %d %s head %d: %s is an engine's format, which stores every head of a layer alike: "+
					"a head override takes kvlib's own schemes, in a slot of kvlib's own", o.Layer, o.Role, o.Head, sc.Method)
			}
		}
	}
	return nil
}

// layersString is the overrides' part of the canonical spec ("" if none).
func (s Spec) layersString() string {
	var b strings.Builder
	for i := 0; i < len(s.Layers); {
		o := s.Layers[i]
		j := i + 1
		for j < len(s.Layers) && s.Layers[j].Role == o.Role && s.Layers[j].Layer == s.Layers[j-1].Layer+1 &&
			s.Layers[j].Scheme == o.Scheme {
			j++
		}
		fmt.Fprintf(&b, ",%c%d", o.Role[0], o.Layer)
		if j-i > 1 {
			fmt.Fprintf(&b, "-%d", s.Layers[j-1].Layer)
		}
		b.WriteString("=" + o.Scheme.String())
		i = j
	}
	for i := 0; i < len(s.Heads); {
		o := s.Heads[i]
		j := i + 1
		for j < len(s.Heads) && s.Heads[j].Role == o.Role && s.Heads[j].Head == o.Head &&
			s.Heads[j].Layer == s.Heads[j-1].Layer+1 && s.Heads[j].Scheme == o.Scheme {
			j++
		}
		fmt.Fprintf(&b, ",%c%d", o.Role[0], o.Layer)
		if j-i > 1 {
			fmt.Fprintf(&b, "-%d", s.Heads[j-1].Layer)
		}
		fmt.Fprintf(&b, "h%d=%s", o.Head, o.Scheme.String())
		i = j
	}
	return b.String()
}

const partsWanted = "want k=SCHEME and v=SCHEME, once each, then k<layers>=, v<layers>= or kv<layers>= (layers N or N-M), " +
	"each optionally for one head (k3h1=)"

var overrideRE = regexp.MustCompile(`^(k|v|kv)([0-9]+)(?:-([0-9]+))?(?:h([0-9]+))?$`)

// parseOverride reads "k3-5" or "k3-5h1" (the part before "=") and its
// scheme into layer or head overrides.
func parseOverride(slots, scheme string) ([]Override, []HeadOverride, error) {
	m := overrideRE.FindStringSubmatch(slots)
	if m == nil {
		return nil, nil, fmt.Errorf("part %q: %s", slots+"="+scheme, partsWanted)
	}
	os, err := parseLayers(m, slots, scheme)
	if err != nil || m[4] == "" {
		return os, nil, err
	}
	head, err := strconv.Atoi(m[4])
	if err != nil || head > MaxHead {
		return nil, nil, fmt.Errorf("part %q: head %s beyond %d", slots+"="+scheme, m[4], MaxHead)
	}
	hs := make([]HeadOverride, len(os))
	for i, o := range os {
		hs[i] = HeadOverride{Layer: o.Layer, Role: o.Role, Head: head, Scheme: o.Scheme}
	}
	return nil, hs, nil
}

// parseLayers reads the layers and roles of an override part matched by
// overrideRE (m), each with the scheme.
func parseLayers(m []string, slots, scheme string) ([]Override, error) {
	lo, err1 := strconv.Atoi(m[2])
	hi, err2 := lo, error(nil)
	if m[3] != "" {
		hi, err2 = strconv.Atoi(m[3])
	}
	if err1 != nil || err2 != nil || lo > hi || hi > MaxLayer {
		return nil, fmt.Errorf("part %q: layers %s out of order or beyond %d", slots+"="+scheme, strings.TrimLeft(slots, "kv"), MaxLayer)
	}
	var out []Override
	for _, r := range []Role{KeyRole, ValueRole} {
		if !strings.ContainsRune(m[1], rune(r[0])) {
			continue
		}
		rr := roleKey
		if r == ValueRole {
			rr = roleValue
		}
		sc, err := parseScheme(scheme, rr)
		if err != nil {
			return nil, fmt.Errorf("layers %s %s: %w", strings.TrimLeft(slots, "kv"), r, err)
		}
		for l := lo; l <= hi; l++ {
			out = append(out, Override{Layer: l, Role: r, Scheme: sc})
		}
	}
	return out, nil
}

// checkSlots reports an override whose tensor is not among names: a layer
// the cache does not have is a mistake, not a no-op.
func (s Spec) checkSlots(names []string) error {
	have := map[[2]any]bool{}
	for _, n := range names {
		if l, r, ok := slotOf(n); ok {
			have[[2]any{l, r}] = true
		}
	}
	for _, o := range s.Layers {
		if !have[[2]any{o.Layer, o.Role}] {
			return fmt.Errorf("the scheme names layer %d %s, but there is no tensor layer_%d_%s", o.Layer, o.Role, o.Layer, o.Role)
		}
	}
	for _, o := range s.Heads {
		if !have[[2]any{o.Layer, o.Role}] {
			return fmt.Errorf("the scheme names layer %d %s head %d, but there is no tensor layer_%d_%s", o.Layer, o.Role, o.Head, o.Layer, o.Role)
		}
	}
	return nil
}

// Equal reports whether two specs are the same (Spec holds a slice, so
// == does not compile).
func (s Spec) Equal(t Spec) bool {
	return s.Key == t.Key && s.Value == t.Value && s.Lossless == t.Lossless && s.Wire == t.Wire && slices.Equal(s.Layers, t.Layers) &&
		slices.Equal(s.Heads, t.Heads)
}

// Schemes calls fn on every scheme of s: the defaults and each override.
func (s *Spec) Schemes(fn func(*Scheme)) {
	fn(&s.Key)
	fn(&s.Value)
	for i := range s.Layers {
		fn(&s.Layers[i].Scheme)
	}
	for i := range s.Heads {
		fn(&s.Heads[i].Scheme)
	}
}
