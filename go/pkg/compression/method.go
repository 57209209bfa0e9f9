package compression

import "strings"

// Method is a scheme's group quantizer.
type Method string

// The quantizers: symmetric and asymmetric integer groups, and llama.cpp's
// ggml block types (blocks of 32 along the row-major tensor).
const (
	Sym  Method = "sym"
	SymF Method = "symf" // full-range symmetric (symfull.go)
	Asym Method = "asym"
	LM   Method = "lm" // Lloyd–Max levels of a unit Gaussian (lloydmax.go)
	Q4_0 Method = "q4_0"
	Q4_1 Method = "q4_1"
	Q5_0 Method = "q5_0"
	Q5_1 Method = "q5_1"
	Q8_0 Method = "q8_0"
)

// A quantizer is everything that differs by Method: how a scheme using it
// is parsed, spelled, validated and sized, and how one group is encoded and
// decoded. A tensor's layout looks its entry up once (newLayout), as
// compress/flate's compressor.init picks its step from the levels table,
// so nothing switches on the method per group. A new method is one entry
// in methods and a file with its functions.
type quantizer struct {
	method Method
	// minBits and maxBits bound a scheme's code width. A block type has
	// one width, and its blocks fix the group and axis.
	minBits, maxBits int
	block            *ggmlType // a ggml block type (ggml.go); nil for packed codes and per-group parameters
	zeros            bool      // a zero point per group is stored beside the scale (.zeros)

	// encode quantizes the group x, index gi, into the job's stored form:
	// codes into q (to be packed) and its scale (and zero point), or a
	// whole block into the job's codes. decode is the inverse, into y.
	encode func(j *tensorJob, x []float32, q []int8, gi int) error
	decode func(j *tensorJob, y []float32, q []int8, gi int) error

	// engine is set for an engine's cache format (engine.go): a method
	// looked up beside this table, whose stored form is the engine's own
	// bytes and which the engine's switches (rotation) alone configure.
	engine *engineFormat
	// identity is set for none, which stores its tensor unchanged.
	identity bool
	// encodeAll and decodeAll, when set, replace encode and decode with
	// one call on a whole chunk, quantized elements [qlo, qhi) (x and y
	// hold those), for methods without groups (f16, none).
	encodeAll func(j *tensorJob, x []float32, qlo, qhi int)
	decodeAll func(j *tensorJob, y []float32, qlo, qhi int)
}

// methods is the table of quantizers, in the order error messages list them.
var methods = []quantizer{
	{method: Sym, minBits: MinBits, maxBits: MaxBits, encode: (*tensorJob).encodeSym, decode: (*tensorJob).decodeSym},
	{method: SymF, minBits: MinBits, maxBits: MaxBits, encode: (*tensorJob).encodeSymF, decode: (*tensorJob).decodeSym},
	{method: Asym, minBits: MinBits, maxBits: MaxBits, zeros: true, encode: (*tensorJob).encodeAsym, decode: (*tensorJob).decodeAsym},
	{method: LM, minBits: MinLMBits, maxBits: MaxLMBits, encode: (*tensorJob).encodeLM, decode: (*tensorJob).decodeLM},
	{method: Q4_0, minBits: 4, maxBits: 4, block: &ggmlType{bits: 4, blockSize: 18}, encode: (*tensorJob).encodeBlock, decode: (*tensorJob).decodeBlock},
	{method: Q4_1, minBits: 4, maxBits: 4, block: &ggmlType{bits: 4, blockSize: 20, hasMin: true}, encode: (*tensorJob).encodeBlock, decode: (*tensorJob).decodeBlock},
	{method: Q5_0, minBits: 5, maxBits: 5, block: &ggmlType{bits: 5, blockSize: 22}, encode: (*tensorJob).encodeBlock, decode: (*tensorJob).decodeBlock},
	{method: Q5_1, minBits: 5, maxBits: 5, block: &ggmlType{bits: 5, blockSize: 24, hasMin: true}, encode: (*tensorJob).encodeBlock, decode: (*tensorJob).decodeBlock},
	{method: Q8_0, minBits: 8, maxBits: 8, block: &ggmlType{bits: 8, blockSize: 34}, encode: (*tensorJob).encodeBlock, decode: (*tensorJob).decodeBlock},
}

// quantizerOf returns m's entry in methods, or in engineMethods (the
// engines' formats and none), or nil for an unknown method.
func quantizerOf(m Method) *quantizer {
	for i := range methods {
		if methods[i].method == m {
			return &methods[i]
		}
	}
	for i := range engineMethods {
		if engineMethods[i].method == m {
			return &engineMethods[i]
		}
	}
	return nil
}

// packed reports whether codes are bit-packed beside per-group FP16
// parameters (.scales, and .zeros for some), rather than ggml blocks.
func (q *quantizer) packed() bool { return q.block == nil }

// IsGGML reports whether m is a ggml block type.
func (m Method) IsGGML() bool { q := quantizerOf(m); return q != nil && !q.packed() }

// methodNames lists the methods for an error message: "a, b or c".
func methodNames() string {
	names := make([]string, len(methods))
	for i, q := range methods {
		names[i] = string(q.method)
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// baseNames lists the scheme bases for an error message: each packed
// method with its width ("sym<bits>"), then the first block type and "...".
func baseNames() string {
	var names []string
	for _, q := range methods {
		if !q.packed() {
			names = append(names, string(q.method)+" ...")
			break
		}
		names = append(names, string(q.method)+"<bits>")
	}
	return strings.Join(names, ", ")
}

// parseBase reads a packed method and its width ("asym4"); ok is false
// for any other text.
func parseBase(base string) (m Method, bits string, ok bool) {
	name := strings.TrimRight(base, "0123456789")
	if q := quantizerOf(Method(name)); q != nil && q.packed() && name != base {
		return q.method, base[len(name):], true
	}
	return "", "", false
}
