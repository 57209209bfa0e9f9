package compression

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"unicode/utf8"
)

// The JSON form of a spec is what Spec marshals to:
//
//	{"key": SCHEME, "value": SCHEME, "layers": [{"layer": N, "role": "key", "scheme": SCHEME}], "lossless": false}
//
// with SCHEME an object of Scheme's fields. Any field may be left out (or
// be null) and takes the string grammar's default: a missing role is the
// default preset's scheme (sym4/g64); in a scheme, method sym, bits 4 and
// group 64 (a ggml block type's own width and its block of 32; an engine
// format's own width, block and rotation), axis token, no rotation,
// outliers, residual or sparsity. So {"key": {"method": "asym",
// "axis": "channel"}} is k=asym4/g64/channel,v=sym4/g64. An override needs
// its layer, role and scheme, a head override ("heads": [{"layer": N,
// "role": "key", "head": H, "scheme": SCHEME}]) its head too. Names match exactly; an unknown field, or a
// value of the wrong type, is an error naming the field by its path
// ("key.bits", "layers[0].scheme.axis").

// parseJSONSpec reads the JSON form of a spec; the caller validates it.
func parseJSONSpec(text string) (Spec, error) {
	var raw json.RawMessage
	if err := json.Unmarshal([]byte(text), &raw); err != nil {
		return Spec{}, fmt.Errorf("JSON: %v", err)
	}
	def := DefaultSpec()
	s := Spec{Key: def.Key, Value: def.Value}
	var key, value json.RawMessage
	var layers, heads []json.RawMessage
	given, err := decodeObject(raw, "", []jsonField{
		{"key", &key}, {"value", &value}, {"layers", &layers}, {"heads", &heads}, {"lossless", &s.Lossless}, {"wire", &s.Wire},
	})
	if err != nil {
		return Spec{}, err
	}
	if given["key"] {
		if s.Key, err = decodeScheme(key, "key"); err != nil {
			return Spec{}, err
		}
	}
	if given["value"] {
		if s.Value, err = decodeScheme(value, "value"); err != nil {
			return Spec{}, err
		}
	}
	for i, item := range layers {
		o, err := decodeOverride(item, fmt.Sprintf("layers[%d]", i))
		if err != nil {
			return Spec{}, err
		}
		s.Layers = append(s.Layers, o)
	}
	for i, item := range heads {
		o, err := decodeHeadOverride(item, fmt.Sprintf("heads[%d]", i))
		if err != nil {
			return Spec{}, err
		}
		s.Heads = append(s.Heads, o)
	}
	return s, nil
}

// defaultScheme is the scheme the string grammar gives method m before any
// option: bits 4 and groups of 64 along the token axis, or a ggml block
// type's own width and block.
func defaultScheme(m Method) Scheme {
	if q := quantizerOf(m); q != nil && q.engine != nil {
		return engineScheme(q.engine)
	}
	if m == None {
		return noneScheme()
	}
	if m.IsGGML() {
		return ggmlScheme(m)
	}
	return Scheme{Method: m, Bits: 4, Group: 64, Axis: Token}
}

// decodeScheme reads one scheme object; path names it in errors.
func decodeScheme(raw json.RawMessage, path string) (Scheme, error) {
	var s Scheme
	given, err := decodeObject(raw, path, []jsonField{
		{"method", &s.Method}, {"bits", &s.Bits}, {"group", &s.Group}, {"axis", &s.Axis},
		{"rotate", &s.Rotate}, {"outliers", &s.Outliers}, {"residual", &s.Residual}, {"sparsity", &s.Sparsity},
		{"scale", &s.Scale},
	})
	if err != nil {
		return Scheme{}, err
	}
	if !given["method"] {
		s.Method = Sym
	}
	def := defaultScheme(s.Method)
	if !given["bits"] {
		s.Bits = def.Bits
	}
	if !given["group"] {
		s.Group = def.Group
	}
	if !given["axis"] {
		s.Axis = def.Axis
	}
	if !given["rotate"] { // an engine's default (llama.cpp's quantized types rotate)
		s.Rotate = def.Rotate
	}
	if !given["scale"] { // an engine's static scale: 1 without one (vLLM's fp8)
		s.Scale = def.Scale
	}
	s.Scale = float64(float32(s.Scale)) // the float32 the engine holds, as /scaleS
	return s, nil
}

// decodeOverride reads one element of "layers": layer, role and scheme,
// all three required.
func decodeOverride(raw json.RawMessage, path string) (Override, error) {
	var o Override
	var scheme json.RawMessage
	given, err := decodeObject(raw, path, []jsonField{{"layer", &o.Layer}, {"role", &o.Role}, {"scheme", &scheme}})
	if err != nil {
		return Override{}, err
	}
	for _, name := range []string{"layer", "role", "scheme"} {
		if !given[name] {
			return Override{}, fmt.Errorf("field %q is required", path+"."+name)
		}
	}
	o.Scheme, err = decodeScheme(scheme, path+".scheme")
	return o, err
}

// decodeHeadOverride reads one element of "heads": layer, role, head and
// scheme, all four required.
func decodeHeadOverride(raw json.RawMessage, path string) (HeadOverride, error) {
	var o HeadOverride
	var scheme json.RawMessage
	given, err := decodeObject(raw, path, []jsonField{{"layer", &o.Layer}, {"role", &o.Role}, {"head", &o.Head}, {"scheme", &scheme}})
	if err != nil {
		return HeadOverride{}, err
	}
	for _, name := range []string{"layer", "role", "head", "scheme"} {
		if !given[name] {
			return HeadOverride{}, fmt.Errorf("field %q is required", path+"."+name)
		}
	}
	o.Scheme, err = decodeScheme(scheme, path+".scheme")
	return o, err
}

// A jsonField is one field an object may hold and where its value goes.
type jsonField struct {
	name string
	dst  any // a pointer
}

// decodeObject decodes the object raw into the fields' destinations and
// reports which fields it held (not null). path names the object in errors
// ("" for the top level).
func decodeObject(raw json.RawMessage, path string, fields []jsonField) (map[string]bool, error) {
	given := map[string]bool{}
	if isNull(raw) {
		return given, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		what := "the spec"
		if path != "" {
			what = fmt.Sprintf("field %q", path)
		}
		return nil, fmt.Errorf("%s: want an object, got %s", what, describeJSON(raw))
	}
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.name
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys) // the first error is the same on every run
	for _, k := range keys {
		i := slices.Index(names, k)
		if i < 0 {
			return nil, fmt.Errorf("unknown field %q (want %s)", join(path, k), strings.Join(names, ", "))
		}
		v := m[k]
		if isNull(v) {
			continue
		}
		if err := json.Unmarshal(v, fields[i].dst); err != nil {
			return nil, fmt.Errorf("field %q: want %s, got %s", join(path, k), jsonKind(fields[i].dst), describeJSON(v))
		}
		given[k] = true
	}
	return given, nil
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// jsonKind says what a destination takes, for an error message.
func jsonKind(dst any) string {
	t := reflect.TypeOf(dst).Elem()
	switch {
	case t == reflect.TypeOf(json.RawMessage(nil)):
		return "an object"
	case t.Kind() == reflect.Slice:
		return "an array"
	case t.Kind() == reflect.String:
		return "a string"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() == reflect.Int:
		return "an integer"
	default:
		return "a number"
	}
}

// describeJSON names a JSON value for an error message: a short one as
// written, an object or array by its kind.
func describeJSON(raw json.RawMessage) string {
	v := bytes.TrimSpace(raw)
	switch {
	case len(v) > 0 && v[0] == '{':
		return "an object"
	case len(v) > 0 && v[0] == '[':
		return "an array"
	case utf8.RuneCount(v) > 40:
		return string([]rune(string(v))[:37]) + "..."
	}
	return string(v)
}
