package compression

import (
	"encoding/json"
	"math"
	"strings"

	"kvlib/pkg/safetensors"
)

// Report is the JSON object kv-compress prints: the design documents'
// CompressionMetrics plus the settings, sizes and per-tensor metrics.
// Overall metrics pool every element of every tensor.
type Report struct {
	Command       string `json:"command"`
	Input         string `json:"input"`
	Output        string `json:"output,omitempty"`
	Format        string `json:"format"`
	FormatVersion int    `json:"format_version"`

	// Scheme is the canonical spec, SchemeName its preset name (or the
	// spec); KeyScheme and ValueScheme spell it out per role. Bits,
	// GroupSize and Sparsity repeat the value scheme's, as version 1 had them.
	Scheme      string  `json:"scheme"`
	SchemeName  string  `json:"scheme_name"`
	KeyScheme   *Scheme `json:"key_scheme,omitempty"`
	ValueScheme *Scheme `json:"value_scheme,omitempty"`
	Bits        int     `json:"bits"`
	GroupSize   int     `json:"group_size"`
	Sparsity    float64 `json:"sparsity"`

	NumTensors  int   `json:"num_tensors"`
	NumElements int64 `json:"num_elements"`
	// OriginalSizeBytes is the cache at FP16 (2 bytes an element), the
	// baseline of CompressionRatio; SourceSizeBytes is the uncompressed
	// cache in its own dtypes (F32 caches: twice OriginalSizeBytes).
	OriginalSizeBytes   int64 `json:"original_size_bytes"`
	SourceSizeBytes     int64 `json:"source_size_bytes"`
	CompressedSizeBytes int64 `json:"compressed_size_bytes"` // everything stored for the tensors
	// StoredBytes splits CompressedSizeBytes by part: codes, scales, zeros,
	// outliers (indices and values) and residual (exact tokens).
	StoredBytes map[string]int64 `json:"stored_bytes"`
	// Lossless compares the stored size with and without the lossless
	// stage (present when the spec has it).
	Lossless            *LosslessSizes `json:"lossless,omitempty"`
	sizeWithoutLossless int64
	CompressedFileBytes int64   `json:"compressed_file_bytes"` // the whole compressed safetensors file
	CompressionRatio    float64 `json:"compression_ratio"`
	BitsPerElement      float64 `json:"bits_per_element"`

	Quality
	Passed     bool        `json:"passed"`
	Violations []string    `json:"violations"`
	Thresholds *Thresholds `json:"thresholds,omitempty"`

	// Sums are the raw sums behind the metrics, so that results of several
	// runs (one per perplexity window) can be pooled exactly.
	Sums *Sums `json:"sums,omitempty"`

	ProcessingTimeMS float64 `json:"processing_time_ms"` // the whole command, I/O included
	CodecTimeMS      float64 `json:"codec_time_ms"`      // quantize, pack, measure (and restore)

	ErrorHistogramEdges []float64      `json:"error_histogram_edges"`
	Tensors             []TensorReport `json:"tensors"`
}

// TensorReport holds one tensor's metrics. The Head* slices split it along
// axis 1, the KV head of a [batch, heads, seq, head_dim] cache.
type TensorReport struct {
	Name                string            `json:"name"`
	DType               safetensors.DType `json:"dtype"`
	Shape               []int             `json:"shape"`
	Scheme              string            `json:"scheme"`
	NumElements         int64             `json:"num_elements"`
	CompressedSizeBytes int64             `json:"compressed_size_bytes"`
	BitsPerElement      float64           `json:"bits_per_element"`
	Outliers            int               `json:"outliers"`
	Quality
	Passed         bool    `json:"passed"`
	ErrorHistogram []int64 `json:"error_histogram"`
	HeadRMSE       []Float `json:"head_rmse"`
	HeadSNRDB      []Float `json:"head_snr_db"`
	Sums           Sums    `json:"sums"`
	HeadSums       []Sums  `json:"head_sums"`
	// An engine format's own facts about the tensor (absent for kvlib's
	// schemes): what the engine's rotation did ("on (Hadamard 64 along
	// head_dim 128)", "off (head_dim 96 is not a multiple of 64)"), its
	// Hadamard size (0: none), and how many reconstructed values are NaN
	// or Inf (the engine's result for a value or scale past the format).
	Rotation     string `json:"rotation,omitempty"`
	RotationSize int    `json:"rotation_size,omitempty"`
	NonFinite    int    `json:"non_finite,omitempty"`
	// Saturated: values a static per-tensor scale put beyond the format's
	// largest finite value, which the engine stores as that value
	// (vllm:fp8_e4m3 with scale 1: keys beyond ±448).
	Saturated int64 `json:"saturated,omitempty"`
	// Bins: LMCache CacheGen's bins for the tensor's layer and role (32
	// or 16), its decision for this cache.
	Bins int `json:"bins,omitempty"`
}

// LosslessSizes is the stored size without the lossless stage, against
// CompressedSizeBytes, which has it.
type LosslessSizes struct {
	WithoutBytes          int64   `json:"compressed_size_bytes_without"`
	BitsPerElementWithout float64 `json:"bits_per_element_without"`
	RatioWithout          float64 `json:"compression_ratio_without"`
	Saved                 float64 `json:"saved"` // fraction of the stored bytes the stage saves
}

// Quality is the metrics of one set of elements; encoding/json flattens it
// into the Report and TensorReport objects.
type Quality struct {
	RMSE             Float  `json:"rmse"`
	SNRDB            Float  `json:"snr_db"`
	CosineSimilarity Float  `json:"cosine_similarity"`
	MaxError         Float  `json:"max_error"`
	QualityLevel     string `json:"quality_level"`
}

func qualityOf(a *Accumulator) Quality {
	return Quality{
		RMSE: Float(a.RMSE()), SNRDB: Float(a.SNRDB()), CosineSimilarity: Float(a.Cosine()),
		MaxError: Float(a.MaxError), QualityLevel: QualityLevel(a.RMSE(), a.SNRDB()),
	}
}

// Sums is an Accumulator's sums in JSON form.
type Sums struct {
	N        int64   `json:"n"`
	SumX2    float64 `json:"sum_x2"`
	SumY2    float64 `json:"sum_y2"`
	SumXY    float64 `json:"sum_xy"`
	SumE2    float64 `json:"sum_e2"`
	MaxError float64 `json:"max_error"`
}

// MarshalJSON writes the sums as encoding/json does, except that a
// non-finite sum (an engine format's Inf reconstruction) is null, which
// encoding/json cannot otherwise write.
func (s Sums) MarshalJSON() ([]byte, error) {
	type plain Sums
	for _, v := range []float64{s.SumX2, s.SumY2, s.SumXY, s.SumE2, s.MaxError} {
		if math.IsInf(v, 0) || math.IsNaN(v) {
			return json.Marshal(struct {
				N        int64 `json:"n"`
				SumX2    Float `json:"sum_x2"`
				SumY2    Float `json:"sum_y2"`
				SumXY    Float `json:"sum_xy"`
				SumE2    Float `json:"sum_e2"`
				MaxError Float `json:"max_error"`
			}{s.N, Float(s.SumX2), Float(s.SumY2), Float(s.SumXY), Float(s.SumE2), Float(s.MaxError)})
		}
	}
	return json.Marshal(plain(s))
}

func sumsOf(a *Accumulator) Sums {
	return Sums{N: a.N, SumX2: a.SumX2, SumY2: a.SumY2, SumXY: a.SumXY, SumE2: a.SumE2, MaxError: a.MaxError}
}

func newReport(cfg Config) *Report {
	r := &Report{
		Format: FormatName, FormatVersion: FormatVersion,
		Thresholds: &cfg.Thresholds, Violations: []string{}, StoredBytes: map[string]int64{},
		ErrorHistogramEdges: HistogramEdges(), Tensors: []TensorReport{},
	}
	r.setScheme(cfg.Spec)
	return r
}

func (r *Report) setScheme(s Spec) {
	k, v := s.Key, s.Value
	r.Scheme, r.SchemeName, r.KeyScheme, r.ValueScheme = s.String(), s.Name(), &k, &v
	r.Bits, r.GroupSize, r.Sparsity = v.Bits, v.Group, v.Sparsity
}

// partName is the StoredBytes key of a stored tensor, from its suffix.
func partName(tensor, name string) string {
	switch name[len(tensor):] {
	case CodesSuffix:
		return "codes"
	case ScalesSuffix:
		return "scales"
	case ZerosSuffix:
		return "zeros"
	case ResidualSuffix:
		return "residual"
	case CodesSuffix + ChunksSuffix, ScalesSuffix + ChunksSuffix, ZerosSuffix + ChunksSuffix:
		return "chunk_offsets"
	case CodesSuffix + WireModelSuffix:
		return "wire_model"
	}
	return "outliers"
}

// tensorFacts is what a tensor's report row says of it besides its sums:
// one job's, or a tensor stored a head at a time, its parts' together.
type tensorFacts struct {
	name      string
	dtype     safetensors.DType
	shape     []int
	scheme    string
	outliers  int
	rotation  *RotationInfo
	nonFinite int
	saturated int64
	bins      int
}

func (j *tensorJob) facts() tensorFacts {
	f := tensorFacts{name: j.name, dtype: j.dtype, shape: j.shape, scheme: j.l.s.String(), outliers: len(j.out.index),
		rotation: j.rotation, saturated: j.saturated.Load(), bins: j.bins}
	for _, n := range j.nonFinite {
		f.nonFinite += n
	}
	return f
}

// joinedFacts are the facts of a tensor stored as the head parts parts.
func joinedFacts(whole safetensors.Tensor, parts []*tensorJob, scheme string) tensorFacts {
	f := tensorFacts{name: whole.Name, dtype: whole.DType, shape: whole.Shape, scheme: scheme}
	for _, p := range parts {
		pf := p.facts()
		f.outliers += pf.outliers
		f.nonFinite += pf.nonFinite
		f.saturated += pf.saturated
	}
	return f
}

// countStored adds a stored unit's parts to StoredBytes by kind.
func (r *Report) countStored(unit string, stored []safetensors.Tensor) {
	for _, t := range stored {
		r.StoredBytes[partName(unit, t.Name)] += int64(len(t.Data))
	}
}

func (r *Report) addTensor(j tensorFacts, acc *Accumulator, heads []Accumulator, stored []safetensors.Tensor, th Thresholds) {
	var size int64
	for _, t := range stored {
		size += int64(len(t.Data))
	}
	r.CompressedSizeBytes += size
	tr := TensorReport{
		Name: j.name, DType: j.dtype, Shape: j.shape, Scheme: j.scheme, NumElements: acc.N,
		CompressedSizeBytes: size, Outliers: j.outliers,
		Quality:        qualityOf(acc),
		Passed:         len(th.Violations(acc)) == 0,
		ErrorHistogram: append([]int64(nil), acc.Hist[:]...),
		Sums:           sumsOf(acc),
		HeadRMSE:       []Float{}, HeadSNRDB: []Float{}, HeadSums: []Sums{},
	}
	if acc.N > 0 {
		tr.BitsPerElement = 8 * float64(size) / float64(acc.N)
	}
	if j.rotation != nil {
		tr.Rotation, tr.RotationSize = j.rotation.Why, j.rotation.Size
	}
	tr.NonFinite, tr.Saturated, tr.Bins = j.nonFinite, j.saturated, j.bins
	for h := range heads {
		tr.HeadSums = append(tr.HeadSums, sumsOf(&heads[h]))
		tr.HeadRMSE = append(tr.HeadRMSE, Float(heads[h].RMSE()))
		tr.HeadSNRDB = append(tr.HeadSNRDB, Float(heads[h].SNRDB()))
	}
	r.Tensors = append(r.Tensors, tr)
}

func (r *Report) finish(total *Accumulator, th Thresholds) {
	r.NumTensors = len(r.Tensors)
	r.NumElements = total.N
	r.OriginalSizeBytes = 2 * total.N
	if r.CompressedSizeBytes > 0 {
		r.CompressionRatio = float64(r.OriginalSizeBytes) / float64(r.CompressedSizeBytes)
	}
	if total.N > 0 {
		r.BitsPerElement = 8 * float64(r.CompressedSizeBytes) / float64(total.N)
	}
	if r.KeyScheme != nil && r.sizeWithoutLossless > 0 && r.Scheme != "" && (strings.HasSuffix(r.Scheme, LosslessSuffix) || strings.HasSuffix(r.Scheme, WireSuffix)) {
		w := r.sizeWithoutLossless
		r.Lossless = &LosslessSizes{WithoutBytes: w, RatioWithout: float64(r.OriginalSizeBytes) / float64(w),
			BitsPerElementWithout: 8 * float64(w) / float64(max(total.N, 1)),
			Saved:                 1 - float64(r.CompressedSizeBytes)/float64(w)}
	}
	sums := sumsOf(total)
	r.Sums = &sums
	r.Quality = qualityOf(total)
	r.Violations = th.Violations(total)
	r.Passed = len(r.Violations) == 0
}

// DecompressReport describes a restore: sizes and settings; there is no
// original to measure against, so the quality fields are null.
func DecompressReport(src, restored *safetensors.File, hdr *Header) *Report {
	rep := &Report{
		Format: FormatName, FormatVersion: hdr.Version,
		NumTensors: len(restored.Tensors), Passed: true, Violations: []string{},
		StoredBytes: map[string]int64{}, Tensors: []TensorReport{},
	}
	if s, err := ParseSpec(hdr.Spec); err == nil {
		rep.setScheme(s)
	} else {
		rep.Scheme, rep.SchemeName = hdr.Spec, hdr.Spec
	}
	nan := Float(math.NaN()) // nothing to measure against: null in JSON
	rep.Quality = Quality{RMSE: nan, SNRDB: nan, CosineSimilarity: nan, MaxError: nan}
	for i := range restored.Tensors {
		rep.NumElements += int64(restored.Tensors[i].NumElements())
		rep.SourceSizeBytes += int64(len(restored.Tensors[i].Data))
	}
	for _, ti := range hdr.Tensors {
		for _, t := range src.Tensors {
			if strings.HasPrefix(t.Name, ti.Name+".") {
				rep.StoredBytes[partName(ti.Name, t.Name)] += int64(len(t.Data))
				rep.CompressedSizeBytes += int64(len(t.Data))
			}
		}
	}
	rep.OriginalSizeBytes = 2 * rep.NumElements
	if rep.CompressedSizeBytes > 0 {
		rep.CompressionRatio = float64(rep.OriginalSizeBytes) / float64(rep.CompressedSizeBytes)
		rep.BitsPerElement = 8 * float64(rep.CompressedSizeBytes) / float64(max(rep.NumElements, 1))
	}
	rep.CompressedFileBytes, _ = safetensors.EncodedSize(src)
	return rep
}

// SchemeInfo describes a spec: what check prints, and each entry of schemes.
type SchemeInfo struct {
	Command     string     `json:"command,omitempty"`
	Name        string     `json:"name"`
	Scheme      string     `json:"scheme"`
	KeyScheme   Scheme     `json:"key_scheme"`
	ValueScheme Scheme     `json:"value_scheme"`
	Layers      []Override `json:"layers"` // the per-layer overrides, canonical
	// Heads are the head overrides, canonical (absent when none).
	Heads     []HeadOverride `json:"heads,omitempty"`
	Lossless  bool           `json:"lossless"`
	Wire      bool           `json:"wire"`
	KeyBits   float64        `json:"key_bits_per_element"`   // nominal, for a long 4-D cache
	ValueBits float64        `json:"value_bits_per_element"` // (measured sizes come from compress)
}

// NominalHeadDim is the head_dim nominal sizes assume where a format's
// cost depends on it (a per-token-head scale: 8 + 32/128 bits).
const NominalHeadDim = 128

// NominalBits is the storage cost per element of a scheme's codes and
// per-group parameters, before outliers and residual tokens.
func (s Scheme) NominalBits() float64 {
	q := quantizerOf(s.Method)
	if q != nil && q.identity {
		return 16 // nominal: a 16-bit cache (F32 sources store 32)
	}
	if q != nil && q.engine != nil && q.engine.nominal > 0 {
		return q.engine.nominal
	}
	if q != nil && q.engine != nil && q.engine.perHead {
		return float64(q.engine.headBytes(NominalHeadDim)*8) / NominalHeadDim
	}
	if q != nil && !q.packed() {
		return float64(8*q.block.blockSize) / float64(q.block.blockElems())
	}
	params := 16.0 // the FP16 scale
	if q != nil && q.zeros {
		params += 16
	}
	return float64(s.Bits) + params/float64(s.Group) + 48*s.Outliers
}

// SchemeReport is what check prints for a spec.
func SchemeReport(cmd string, s Spec) SchemeInfo {
	layers := s.Layers
	if layers == nil {
		layers = []Override{}
	}
	return SchemeInfo{Command: cmd, Name: s.Name(), Scheme: s.String(), KeyScheme: s.Key, ValueScheme: s.Value, Layers: layers, Heads: s.Heads, Lossless: s.Lossless, Wire: s.Wire,
		KeyBits: s.Key.NominalBits(), ValueBits: s.Value.NominalBits()}
}

// PresetsReport is what schemes prints: every preset, in order.
func PresetsReport() []SchemeInfo {
	var out []SchemeInfo
	for _, p := range presets {
		out = append(out, SchemeReport("", p.spec))
	}
	return out
}

// GatesInfo is what gates prints: the quality levels, best first, and the
// default quality gates (the thresholds a compress report repeats).
type GatesInfo struct {
	Command    string         `json:"command"`
	Levels     []QualityBound `json:"levels"`
	Thresholds Thresholds     `json:"thresholds"`
}

// GatesReport is what gates prints.
func GatesReport(cmd string) GatesInfo {
	return GatesInfo{Command: cmd, Levels: QualityLevels(), Thresholds: DefaultThresholds}
}
