package compression

import "kvlib/pkg/safetensors"

// The identity scheme none stores its tensor unchanged: the source
// dtype's bits, as .codes (U8, the tensor's little-endian bytes), and
// restores them exactly. It is for the layers an engine leaves
// unquantized (vLLM's --kv-cache-dtype-skip-layers), as a per-layer
// override: "llama.cpp:q4_0,kv0-1=none". Its bits per element are the
// source dtype's (16 for F16 and BF16, 32 for F32); a NaN or Inf in the
// tensor is refused as by every scheme.

// None is the identity scheme.
const None Method = "none"

var noneQuantizer = quantizer{
	method:    None,
	block:     &ggmlType{blockSize: 0, elems: 1}, // bytes per element: the source dtype's (layout.esz)
	identity:  true,
	encode:    func(*tensorJob, []float32, []int8, int) error { return nil },
	decode:    func(*tensorJob, []float32, []int8, int) error { return nil },
	encodeAll: (*tensorJob).encodeNone,
	decodeAll: (*tensorJob).decodeNone,
}

// noneScheme is none's one scheme: no width, no group, no option.
func noneScheme() Scheme { return Scheme{Method: None, Axis: Token} }

// encodeNone copies the chunk's source bytes: none's quantized elements
// are the tensor's own, in natural order.
func (j *tensorJob) encodeNone(_ []float32, qlo, qhi int) {
	esz := j.dtype.Size()
	copy(j.codes[qlo*esz:qhi*esz], j.src[qlo*esz:qhi*esz])
}

// decodeNone reads the stored bytes back as float32s (exactly: every
// F16 and BF16 value is a float32), which the pipeline writes back in the
// source dtype unchanged.
func (j *tensorJob) decodeNone(y []float32, qlo, qhi int) {
	esz := j.dtype.Size()
	safetensors.DecodeFloat32s(y, j.codes[qlo*esz:qhi*esz], j.dtype)
}
