package compression

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"kvlib/pkg/safetensors"
)

// The compressed layout is itself a safetensors file. For each source
// tensor NAME it holds NAME.codes (U8: packed codes, or ggml blocks) and,
// as its scheme needs them, NAME.scales and NAME.zeros (F16, one per
// group), NAME.outlier_index (U32) and NAME.outlier_value (F16), and
// NAME.residual (the last tokens, exact, in the source dtype).
// "__metadata__" keeps the source file's metadata and adds kvq.format,
// kvq.version, kvq.spec and kvq.tensors (each tensor's dtype, shape,
// scheme and outlier count): the file describes itself. Version 1 files
// (one sym scheme in kvq.bits and kvq.group_size) still decompress.
const (
	FormatName    = "kvq"
	FormatVersion = 2

	CodesSuffix        = ".codes"
	ScalesSuffix       = ".scales"
	ZerosSuffix        = ".zeros"
	OutlierIndexSuffix = ".outlier_index"
	OutlierValueSuffix = ".outlier_value"
	ResidualSuffix     = ".residual"

	metaPrefix    = "kvq."
	metaFormat    = "kvq.format"
	metaVersion   = "kvq.version"
	metaSpec      = "kvq.spec"
	metaTensors   = "kvq.tensors"
	metaBits      = "kvq.bits"       // v1
	metaGroupSize = "kvq.group_size" // v1
	metaSparsity  = "kvq.sparsity"   // v1
)

// TensorInfo records a source tensor and how it was stored.
type TensorInfo struct {
	Name     string            `json:"name"`
	DType    safetensors.DType `json:"dtype"`
	Shape    []int             `json:"shape"`
	Scheme   Scheme            `json:"scheme"`
	Outliers int               `json:"outliers"`           // how many elements are stored apart
	Lossless []string          `json:"lossless,omitempty"` // parts coded by the lossless stage (".codes", ...)
	Wire     []string          `json:"wire,omitempty"`     // parts coded by the wire stage (".codes")
	// Rotation is the Hadamard size an engine format rotated the tensor by
	// along head_dim (0: none), as the engine decided it for this cache.
	Rotation int `json:"rotation,omitempty"`
	// Bins is LMCache CacheGen's bins for the tensor's layer and role (32:
	// 31 levels, 16: 15), as the engine decided it for this cache; 0 for
	// every other scheme.
	Bins int `json:"bins,omitempty"`
	// Of names the source tensor this is one head of, Head which head
	// (heads.go; both absent for a whole tensor).
	Of   string `json:"of,omitempty"`
	Head int    `json:"head,omitempty"`
}

// NumElements is the product of the shape.
func (t TensorInfo) NumElements() int { return product(t.Shape) }

// Header is what a compressed file's metadata says.
type Header struct {
	Version int
	Spec    string // the spec the file was made with, canonical
	Tensors []TensorInfo
	Source  map[string]string // the source file's own metadata
	// joined lists the source tensors and what holds each (heads.go),
	// checked when the file is read.
	joined []joined
}

// IsCompressed reports whether f carries the kvq format marker.
func IsCompressed(f *safetensors.File) bool {
	_, ok := f.Metadata[metaFormat]
	return ok
}

func (h *Header) metadata() map[string]string {
	m := make(map[string]string, len(h.Source)+4)
	for k, v := range h.Source {
		m[k] = v
	}
	infos, _ := json.Marshal(h.Tensors)
	m[metaFormat] = FormatName
	m[metaVersion] = strconv.Itoa(h.writeVersion())
	m[metaSpec] = h.Spec
	m[metaTensors] = string(infos)
	return m
}

// writeVersion is the version a file with this header is written as: the
// current one, or HeadsFormatVersion when it holds head parts.
func (h *Header) writeVersion() int {
	for _, ti := range h.Tensors {
		if ti.Of != "" {
			return HeadsFormatVersion
		}
	}
	return FormatVersion
}

// ReadHeader parses the metadata of a compressed file and checks every
// tensor's record against the tensors the file holds: an impossible value
// or a wrong length is an error naming the tensor and field.
func ReadHeader(f *safetensors.File) (*Header, error) {
	h, _, err := readFile(f, 0)
	return h, err
}

// readFile parses the header, decodes the lossless stage, and checks every
// tensor's stored parts, returned in header order.
func readFile(f *safetensors.File, workers int) (*Header, []*stored, error) {
	h, err := parseHeader(f)
	if err != nil {
		return nil, nil, err
	}
	if h.joined, err = joinPlan(h); err != nil { // head parts, before their bytes are read
		return nil, nil, err
	}
	view := f
	if h.hasWire() {
		if view, err = wireInflate(view, h.Tensors, max(workers, 1)); err != nil {
			return nil, nil, err
		}
	}
	if h.hasLossless() {
		if view, err = inflateStored(view, h.Tensors, rawPartSize, max(workers, 1)); err != nil {
			return nil, nil, err
		}
	}
	parts := make([]*stored, len(h.Tensors))
	for i, ti := range h.Tensors {
		if parts[i], err = checkStored(view, ti); err != nil {
			return nil, nil, &TensorError{Tensor: ti.Name, Err: err}
		}
	}
	return h, parts, nil
}

func (h *Header) hasWire() bool {
	for _, ti := range h.Tensors {
		if len(ti.Wire) > 0 {
			return true
		}
	}
	return false
}

func (h *Header) hasLossless() bool {
	for _, ti := range h.Tensors {
		if len(ti.Lossless) > 0 {
			return true
		}
	}
	return false
}

// rawPartSize is the declared size of a stored part before the lossless stage.
func rawPartSize(ti TensorInfo, suffix string) (int, error) {
	if err := ti.Scheme.Validate(); err != nil {
		return 0, fmt.Errorf("scheme: %w", err)
	}
	l, err := newLayout(ti.Shape, ti.Scheme, ti.DType, ti.Rotation)
	if err != nil {
		return 0, err
	}
	switch {
	case l.q.engine != nil && l.q.engine.whole:
		return 0, fmt.Errorf("%s is entropy-coded by the engine: no lossless stage", ti.Scheme.Method)
	case suffix == CodesSuffix:
		return l.codeBytes(), nil
	case suffix == ScalesSuffix && l.q.packed(), suffix == ZerosSuffix && l.q.zeros:
		return 2 * l.groups, nil
	}
	return 0, fmt.Errorf("lossless part %q does not exist for scheme %s", suffix, ti.Scheme)
}

// parseHeader reads a compressed file's metadata.
func parseHeader(f *safetensors.File) (*Header, error) {
	md := f.Metadata
	if md[metaFormat] != FormatName {
		return nil, fmt.Errorf("not a kvq-compressed file (metadata %q is %q, want %q)", metaFormat, md[metaFormat], FormatName)
	}
	h := &Header{Source: map[string]string{}}
	switch md[metaVersion] {
	case "1":
		if err := h.readV1(md); err != nil {
			return nil, err
		}
	case strconv.Itoa(FormatVersion), strconv.Itoa(HeadsFormatVersion):
		h.Version, _ = strconv.Atoi(md[metaVersion])
		h.Spec = md[metaSpec]
		if err := json.Unmarshal([]byte(md[metaTensors]), &h.Tensors); err != nil {
			return nil, fmt.Errorf("metadata %q: %v", metaTensors, err)
		}
	default:
		return nil, fmt.Errorf("unsupported kvq version %q (this build reads 1, %d and %d)", md[metaVersion], FormatVersion, HeadsFormatVersion)
	}
	for k, v := range md {
		if !strings.HasPrefix(k, metaPrefix) {
			h.Source[k] = v
		}
	}
	seen := map[string]bool{}
	for _, ti := range h.Tensors {
		if seen[ti.Name] {
			return nil, tensorErrorf(ti.Name, "recorded twice in %s", metaTensors)
		}
		seen[ti.Name] = true
		if !ti.DType.IsFloat() { // shapes and schemes are checked with the stored parts
			return nil, tensorErrorf(ti.Name, "source dtype %q is not F32, F16 or BF16", ti.DType)
		}
	}
	return h, nil
}

func (h *Header) readV1(md map[string]string) error {
	h.Version = 1
	var sc Scheme
	var err error
	sc.Method, sc.Axis = Sym, Token
	if sc.Bits, err = strconv.Atoi(md[metaBits]); err != nil {
		return fmt.Errorf("metadata %q: %v", metaBits, err)
	}
	if sc.Group, err = strconv.Atoi(md[metaGroupSize]); err != nil {
		return fmt.Errorf("metadata %q: %v", metaGroupSize, err)
	}
	if sc.Sparsity, err = strconv.ParseFloat(md[metaSparsity], 64); err != nil {
		return fmt.Errorf("metadata %q: %v", metaSparsity, err)
	}
	if err := sc.Validate(); err != nil {
		return err
	}
	h.Spec = sc.String()
	if err := json.Unmarshal([]byte(md[metaTensors]), &h.Tensors); err != nil {
		return fmt.Errorf("metadata %q: %v", metaTensors, err)
	}
	for i := range h.Tensors {
		h.Tensors[i].Scheme = sc
	}
	return nil
}

// stored is one tensor's parts in a compressed file, checked.
type stored struct {
	codes, scales, zeros, residual *safetensors.Tensor
	outliers                       outlierSet
}

// checkStored finds and checks the stored parts of ti in f.
func checkStored(f *safetensors.File, ti TensorInfo) (*stored, error) {
	if !ti.DType.IsFloat() {
		return nil, fmt.Errorf("source dtype %q is not F32, F16 or BF16", ti.DType)
	}
	if err := ti.Scheme.Validate(); err != nil {
		return nil, fmt.Errorf("scheme: %w", err)
	}
	n := 1
	for _, d := range ti.Shape {
		if d < 0 || (d > 0 && n > (1<<48)/d) {
			return nil, fmt.Errorf("bad shape %v", ti.Shape)
		}
		n *= d
	}
	l, err := newLayout(ti.Shape, ti.Scheme, ti.DType, ti.Rotation)
	if err != nil {
		return nil, err
	}
	if ti.Outliers < 0 || ti.Outliers > l.nq {
		return nil, fmt.Errorf("outliers %d out of range [0, %d]", ti.Outliers, l.nq)
	}
	s := &stored{codes: f.Tensor(ti.Name + CodesSuffix)}
	want := func(t *safetensors.Tensor, suffix string, dt safetensors.DType, bytes int) error {
		if t == nil || t.DType != dt || len(t.Data) != bytes {
			got := "missing"
			if t != nil {
				got = fmt.Sprintf("%d bytes of %s", len(t.Data), t.DType)
			}
			return fmt.Errorf("%s is %s, want %d bytes of %s", suffix, got, bytes, dt)
		}
		return nil
	}
	whole := l.q.engine != nil && l.q.engine.whole
	switch {
	case whole && (ti.Bins != 16 && ti.Bins != 32):
		return nil, fmt.Errorf("bins %d, want 16 or 32 for %s", ti.Bins, ti.Scheme.Method)
	case !whole && ti.Bins != 0:
		return nil, fmt.Errorf("bins %d recorded for scheme %s, which has none", ti.Bins, ti.Scheme)
	case whole:
		lo, hi := l.cacheGenSizeRange()
		if s.codes == nil || s.codes.DType != safetensors.U8 || len(s.codes.Data) < lo || len(s.codes.Data) > hi {
			got := "missing"
			if s.codes != nil {
				got = fmt.Sprintf("%d bytes of %s", len(s.codes.Data), s.codes.DType)
			}
			return nil, fmt.Errorf("%s is %s, want %d to %d bytes of U8", CodesSuffix, got, lo, hi)
		}
	default:
		if err := want(s.codes, CodesSuffix, safetensors.U8, l.codeBytes()); err != nil {
			return nil, err
		}
	}
	if l.q.packed() {
		s.scales = f.Tensor(ti.Name + ScalesSuffix)
		if err := want(s.scales, ScalesSuffix, safetensors.F16, 2*l.groups); err != nil {
			return nil, err
		}
	}
	if l.q.zeros {
		s.zeros = f.Tensor(ti.Name + ZerosSuffix)
		if err := want(s.zeros, ZerosSuffix, safetensors.F16, 2*l.groups); err != nil {
			return nil, err
		}
	}
	if l.residualElems() > 0 {
		s.residual = f.Tensor(ti.Name + ResidualSuffix)
		if err := want(s.residual, ResidualSuffix, ti.DType, l.residualElems()*ti.DType.Size()); err != nil {
			return nil, err
		}
	}
	s.outliers, err = readOutliers(f.Tensor(ti.Name+OutlierIndexSuffix), f.Tensor(ti.Name+OutlierValueSuffix), ti.Outliers, n)
	if err != nil {
		return nil, err
	}
	return s, nil
}
