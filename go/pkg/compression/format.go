package compression

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"kvlib/pkg/safetensors"
)

// The compressed layout is itself a safetensors file. For each source
// tensor NAME it holds NAME.codes (U8, the packed codes) and NAME.scales
// (F16, one per group); "__metadata__" keeps the source file's metadata and
// adds the kvq.* keys below, which is all Decompress needs.
const (
	FormatName    = "kvq"
	FormatVersion = 1

	CodesSuffix  = ".codes"
	ScalesSuffix = ".scales"

	metaPrefix    = "kvq."
	metaFormat    = "kvq.format"
	metaVersion   = "kvq.version"
	metaBits      = "kvq.bits"
	metaGroupSize = "kvq.group_size"
	metaSparsity  = "kvq.sparsity"
	metaTensors   = "kvq.tensors"
)

// TensorInfo records a source tensor's name, dtype and shape.
type TensorInfo struct {
	Name  string            `json:"name"`
	DType safetensors.DType `json:"dtype"`
	Shape []int             `json:"shape"`
}

// NumElements is the product of the shape.
func (t TensorInfo) NumElements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Header is what a compressed file's metadata says.
type Header struct {
	Bits      int
	GroupSize int
	Sparsity  float64
	Tensors   []TensorInfo
	Source    map[string]string // the source file's own metadata
}

// IsCompressed reports whether f carries the kvq format marker.
func IsCompressed(f *safetensors.File) bool {
	_, ok := f.Metadata[metaFormat]
	return ok
}

func (h *Header) metadata() map[string]string {
	m := make(map[string]string, len(h.Source)+6)
	for k, v := range h.Source {
		m[k] = v
	}
	infos, _ := json.Marshal(h.Tensors)
	m[metaFormat] = FormatName
	m[metaVersion] = strconv.Itoa(FormatVersion)
	m[metaBits] = strconv.Itoa(h.Bits)
	m[metaGroupSize] = strconv.Itoa(h.GroupSize)
	m[metaSparsity] = strconv.FormatFloat(h.Sparsity, 'g', -1, 64)
	m[metaTensors] = string(infos)
	return m
}

// ReadHeader parses and checks a compressed file's metadata and tensors.
func ReadHeader(f *safetensors.File) (*Header, error) {
	md := f.Metadata
	if md[metaFormat] != FormatName {
		return nil, fmt.Errorf("not a kvq-compressed file (metadata %q is %q, want %q)", metaFormat, md[metaFormat], FormatName)
	}
	if md[metaVersion] != strconv.Itoa(FormatVersion) {
		return nil, fmt.Errorf("unsupported kvq version %q (this build reads %d)", md[metaVersion], FormatVersion)
	}
	h := &Header{Source: map[string]string{}}
	var err error
	if h.Bits, err = strconv.Atoi(md[metaBits]); err != nil {
		return nil, fmt.Errorf("metadata %q: %v", metaBits, err)
	}
	if h.GroupSize, err = strconv.Atoi(md[metaGroupSize]); err != nil {
		return nil, fmt.Errorf("metadata %q: %v", metaGroupSize, err)
	}
	if err := CheckParams(h.Bits, h.GroupSize); err != nil {
		return nil, err
	}
	if h.Sparsity, err = strconv.ParseFloat(md[metaSparsity], 64); err != nil {
		return nil, fmt.Errorf("metadata %q: %v", metaSparsity, err)
	}
	if err := json.Unmarshal([]byte(md[metaTensors]), &h.Tensors); err != nil {
		return nil, fmt.Errorf("metadata %q: %v", metaTensors, err)
	}
	for k, v := range md {
		if !strings.HasPrefix(k, metaPrefix) {
			h.Source[k] = v
		}
	}
	for _, ti := range h.Tensors {
		if !ti.DType.IsFloat() {
			return nil, fmt.Errorf("tensor %q: source dtype %q is not F32, F16 or BF16", ti.Name, ti.DType)
		}
		n := 1
		for _, d := range ti.Shape {
			if d < 0 || (d > 0 && n > (1<<48)/d) {
				return nil, fmt.Errorf("tensor %q: bad shape %v", ti.Name, ti.Shape)
			}
			n *= d
		}
		codes, scales := f.Tensor(ti.Name+CodesSuffix), f.Tensor(ti.Name+ScalesSuffix)
		if codes == nil || scales == nil {
			return nil, fmt.Errorf("tensor %q: missing %s or %s", ti.Name, CodesSuffix, ScalesSuffix)
		}
		if codes.DType != safetensors.U8 || len(codes.Data) != PackedLen(n, h.Bits) {
			return nil, fmt.Errorf("tensor %q: codes are %d bytes of %s, want %d bytes of U8", ti.Name, len(codes.Data), codes.DType, PackedLen(n, h.Bits))
		}
		groups := (n + h.GroupSize - 1) / h.GroupSize
		if scales.DType != safetensors.F16 || scales.NumElements() != groups {
			return nil, fmt.Errorf("tensor %q: %d scales of %s, want %d of F16", ti.Name, scales.NumElements(), scales.DType, groups)
		}
	}
	return h, nil
}
