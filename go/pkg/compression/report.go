package compression

import "kvlib/pkg/safetensors"

// Report is the JSON object kv-compress prints: the design documents'
// CompressionMetrics plus the settings, sizes and per-tensor metrics.
// Overall metrics pool every element of every tensor.
type Report struct {
	Command       string `json:"command"`
	Input         string `json:"input"`
	Output        string `json:"output,omitempty"`
	Format        string `json:"format"`
	FormatVersion int    `json:"format_version"`

	Bits      int     `json:"bits"`
	GroupSize int     `json:"group_size"`
	Sparsity  float64 `json:"sparsity"`

	NumTensors  int   `json:"num_tensors"`
	NumElements int64 `json:"num_elements"`
	// OriginalSizeBytes is the cache at FP16 (2 bytes an element), the
	// baseline of CompressionRatio; SourceSizeBytes is the uncompressed
	// cache in its own dtypes (F32 caches: twice OriginalSizeBytes).
	OriginalSizeBytes   int64   `json:"original_size_bytes"`
	SourceSizeBytes     int64   `json:"source_size_bytes"`
	CompressedSizeBytes int64   `json:"compressed_size_bytes"` // packed codes + FP16 scales
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
	Name        string            `json:"name"`
	DType       safetensors.DType `json:"dtype"`
	Shape       []int             `json:"shape"`
	NumElements int64             `json:"num_elements"`
	Quality
	Passed         bool    `json:"passed"`
	ErrorHistogram []int64 `json:"error_histogram"`
	HeadRMSE       []Float `json:"head_rmse"`
	HeadSNRDB      []Float `json:"head_snr_db"`
	Sums           Sums    `json:"sums"`
	HeadSums       []Sums  `json:"head_sums"`
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

func sumsOf(a *Accumulator) Sums {
	return Sums{N: a.N, SumX2: a.SumX2, SumY2: a.SumY2, SumXY: a.SumXY, SumE2: a.SumE2, MaxError: a.MaxError}
}

func newReport(opt Options) *Report {
	return &Report{
		Format: FormatName, FormatVersion: FormatVersion,
		Bits: opt.Bits, GroupSize: opt.GroupSize, Sparsity: opt.Sparsity,
		Thresholds: &opt.Thresholds, Violations: []string{},
		ErrorHistogramEdges: HistogramEdges(), Tensors: []TensorReport{},
	}
}

func (r *Report) addTensor(t *safetensors.Tensor, acc *Accumulator, heads []Accumulator, th Thresholds) {
	tr := TensorReport{
		Name: t.Name, DType: t.DType, Shape: t.Shape, NumElements: acc.N,
		Quality:        qualityOf(acc),
		Passed:         len(th.Violations(acc)) == 0,
		ErrorHistogram: append([]int64(nil), acc.Hist[:]...),
		Sums:           sumsOf(acc),
	}
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
	sums := sumsOf(total)
	r.Sums = &sums
	r.Quality = qualityOf(total)
	r.Violations = th.Violations(total)
	r.Passed = len(r.Violations) == 0
}
