package compression

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// Float is a float64 that encodes a non-finite value (an SNR with no
// error) as JSON null, which encoding/json cannot otherwise write.
type Float float64

// MarshalJSON implements json.Marshaler.
func (f Float) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, v, 'g', -1, 64), nil
}

// UnmarshalJSON implements json.Unmarshaler (null reads as +Inf).
func (f *Float) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*f = Float(math.Inf(1))
		return nil
	}
	var v float64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*f = Float(v)
	return nil
}

// Histogram bins of the absolute error |x' - x|: bin 0 is [0, 2^HistMinExp),
// bin i >= 1 is [2^(HistMinExp+i-1), 2^(HistMinExp+i)); the last bin also
// holds everything at or above its lower edge.
const (
	HistMinExp = -20
	HistMaxExp = 8
	HistBins   = HistMaxExp - HistMinExp + 1
)

// HistogramEdges returns the HistBins+1 bin edges, the same for every tensor.
func HistogramEdges() []float64 {
	edges := make([]float64, HistBins+1)
	for i := 1; i <= HistBins; i++ {
		edges[i] = math.Ldexp(1, HistMinExp+i-1)
	}
	return edges
}

// histBin finds the bin of |e| from the exponent of its float32 bits
// (sign bit clear); rounding e to float32 only moves an error that lies
// within half an ulp of a bin edge.
func histBin(absBits uint32) int {
	exp := int(absBits>>23) - 127
	return min(max(exp-HistMinExp+1, 0), HistBins-1)
}

// Accumulator gathers the sums that the metrics are made of. Pooling two
// accumulators (Merge) gives the metrics of all their elements together.
type Accumulator struct {
	N        int64
	SumX2    float64 // Σ x²  (signal)
	SumY2    float64 // Σ x'²
	SumXY    float64 // Σ x·x'
	SumE2    float64 // Σ (x' - x)²
	MaxError float64
	Hist     [HistBins]int64
}

// Add accumulates the pairs (x[i], y[i]). Whole blocks of 8 pairs are
// summed in 8 lanes (see laneSums), the rest in element order after them;
// every sum is of float64 products of float32 values, so the order only
// moves the last bits. The error's bin and maximum are those of the float32
// difference y - x.
func (a *Accumulator) Add(x, y []float32) {
	y = y[:len(x)]
	n := len(x) &^ (simdBlock - 1)
	var ls laneSums
	var ht histTables
	maxe := addBlocks(&ls, &ht, x[:n], y[:n])
	sx2, sy2, sxy, se2 := fold(&ls.x2), fold(&ls.y2), fold(&ls.xy), fold(&ls.e2)
	for i := n; i < len(x); i++ {
		xf, yf := float64(x[i]), float64(y[i])
		e := yf - xf
		sx2 += float64(xf * xf)
		sy2 += float64(yf * yf)
		sxy += float64(xf * yf)
		se2 += float64(e * e)
		ae := math.Float32bits(y[i]-x[i]) & 0x7fffffff
		maxe = max(maxe, ae)
		ht[0][histBin(ae)]++
	}
	for _, t := range &ht {
		for i, c := range t {
			a.Hist[i] += c
		}
	}
	a.N += int64(len(x))
	a.SumX2 += sx2
	a.SumY2 += sy2
	a.SumXY += sxy
	a.SumE2 += se2
	a.MaxError = max(a.MaxError, float64(math.Float32frombits(maxe)))
}

// Merge adds b's sums to a.
func (a *Accumulator) Merge(b *Accumulator) {
	a.N += b.N
	a.SumX2 += b.SumX2
	a.SumY2 += b.SumY2
	a.SumXY += b.SumXY
	a.SumE2 += b.SumE2
	a.MaxError = math.Max(a.MaxError, b.MaxError)
	for i := range a.Hist {
		a.Hist[i] += b.Hist[i]
	}
}

// RMSE is sqrt(mean((x' - x)²)).
func (a *Accumulator) RMSE() float64 {
	if a.N == 0 {
		return 0
	}
	return math.Sqrt(a.SumE2 / float64(a.N))
}

// SNRDB is 10·log10(Σx² / Σe²): +Inf when there is no error.
func (a *Accumulator) SNRDB() float64 {
	if a.SumE2 == 0 {
		return math.Inf(1)
	}
	return 10 * math.Log10(a.SumX2/a.SumE2)
}

// Cosine is the cosine similarity of x and x' flattened: 1 when both are
// zero, 0 when just one is.
func (a *Accumulator) Cosine() float64 {
	if a.SumX2 == 0 && a.SumY2 == 0 {
		return 1
	}
	if a.SumX2 == 0 || a.SumY2 == 0 {
		return 0
	}
	return a.SumXY / math.Sqrt(a.SumX2*a.SumY2)
}

// Quality levels, best first.
const (
	Excellent  = "EXCELLENT"
	Good       = "GOOD"
	Acceptable = "ACCEPTABLE"
	Poor       = "POOR"
)

// A QualityBound is one quality level and what earns it: RMSE below
// MaxRMSE and SNR above MinSNRDB.
type QualityBound struct {
	Name     string  `json:"name"`
	MaxRMSE  float64 `json:"max_rmse"`
	MinSNRDB float64 `json:"min_snr_db"`
}

// qualityLevels are the levels, best first: the one copy of the bounds,
// which QualityLevel grades by and kv-compress gates prints. The last,
// Poor, has the widest finite bounds, so JSON can carry them and every
// finite result meets them.
var qualityLevels = []QualityBound{
	{Excellent, 0.01, 40},
	{Good, 0.05, 30},
	{Acceptable, 0.10, 18},
	{Poor, math.MaxFloat64, -math.MaxFloat64},
}

// QualityLevels returns a copy of the quality levels, best first.
func QualityLevels() []QualityBound { return slices.Clone(qualityLevels) }

// QualityLevel grades an RMSE and SNR: the first level whose bounds they
// meet, else (a NaN, an SNR of -Inf) the last.
func QualityLevel(rmse, snrDB float64) string {
	for _, l := range qualityLevels {
		if rmse < l.MaxRMSE && snrDB > l.MinSNRDB {
			return l.Name
		}
	}
	return qualityLevels[len(qualityLevels)-1].Name
}

// Thresholds are the quality gates: a result passes when RMSE < MaxRMSE,
// SNR > MinSNRDB and cosine > MinCosine.
type Thresholds struct {
	MaxRMSE   float64 `json:"max_rmse"`
	MinSNRDB  float64 `json:"min_snr_db"`
	MinCosine float64 `json:"min_cosine_similarity"`
}

// DefaultThresholds are the KVQuant-style gates of the design documents.
var DefaultThresholds = Thresholds{MaxRMSE: 0.10, MinSNRDB: 18, MinCosine: 0.99}

// Violations lists the gates that a's metrics fail, one sentence each.
func (t Thresholds) Violations(a *Accumulator) []string {
	v := []string{}
	if r := a.RMSE(); !(r < t.MaxRMSE) {
		v = append(v, fmt.Sprintf("rmse %.6g >= %g", r, t.MaxRMSE))
	}
	if s := a.SNRDB(); !(s > t.MinSNRDB) {
		v = append(v, fmt.Sprintf("snr_db %.4g <= %g", s, t.MinSNRDB))
	}
	if c := a.Cosine(); !(c > t.MinCosine) {
		v = append(v, fmt.Sprintf("cosine_similarity %.6g <= %g", c, t.MinCosine))
	}
	return v
}
