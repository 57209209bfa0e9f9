package compression

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"

	"kvlib/pkg/safetensors"
)

// Config is everything Compress needs: the scheme of each role, the
// goroutines to use and the quality gates. The CLI's flags fill it.
type Config struct {
	Spec       Spec
	Workers    int // goroutines; 0 means GOMAXPROCS
	Thresholds Thresholds
}

// DefaultConfig is the default preset with the default gates.
func DefaultConfig() Config {
	return Config{Spec: DefaultSpec(), Thresholds: DefaultThresholds}
}

// MaxWorkers bounds the goroutines a caller may ask for.
const MaxWorkers = 1024

func (c Config) workers() int {
	if c.Workers > 0 {
		return min(c.Workers, MaxWorkers)
	}
	return runtime.GOMAXPROCS(0)
}

// Result is what Compress produces.
type Result struct {
	Compressed *safetensors.File // the packed form
	Restored   *safetensors.File // the reconstruction in the source dtypes, if asked for
	Report     *Report
}

// Compress quantizes every tensor of src (F32, F16 or BF16, finite) with
// the scheme of its role, and measures the reconstruction against src.
// With restore it also returns the reconstruction, which is decoded from
// the stored form exactly as Decompress decodes it. Work is spread over
// goroutines in chunks taken from all tensors at once.
func Compress(src *safetensors.File, cfg Config) (*Result, error) {
	return compress(src, cfg, true)
}

// Measure is Compress without keeping the reconstruction.
func Measure(src *safetensors.File, cfg Config) (*Result, error) {
	return compress(src, cfg, false)
}

func compress(src *safetensors.File, cfg Config, restore bool) (*Result, error) {
	if err := cfg.Spec.Validate(); err != nil {
		return nil, err
	}
	if IsCompressed(src) {
		return nil, fmt.Errorf("already kvq-compressed (metadata %q); use decompress", metaFormat)
	}
	names := make([]string, len(src.Tensors))
	for i := range src.Tensors {
		names[i] = src.Tensors[i].Name
	}
	if err := cfg.Spec.checkSlots(names); err != nil {
		return nil, err
	}
	spec := cfg.Spec.withEngineSkips(names) // the layers the engine keeps unquantized, as none
	workers := cfg.workers()
	units, err := splitUnits(src, spec) // a tensor with a head override: one unit per head (heads.go)
	if err != nil {
		return nil, err
	}
	jobs := make([]*tensorJob, len(units))
	var tasks []task
	shapes := make([][]int, len(src.Tensors))
	for i := range src.Tensors {
		shapes[i] = src.Tensors[i].Shape
	}
	hd := cacheHeadDims(names, shapes)
	for i := range units {
		t, sc := &units[i].t, units[i].scheme
		rot, err := engineRotation(sc, roleOf(units[i].name()), t.Shape, hd)
		if err != nil {
			return nil, &TensorError{Tensor: t.Name, Err: err}
		}
		j, err := newEncodeJob(t, sc, rot, restore)
		if err != nil {
			return nil, &TensorError{Tensor: t.Name, Err: err}
		}
		if f := j.l.q.engine; f != nil && f.bins != nil {
			if j.bins, err = f.bins(t.Name, names); err != nil {
				return nil, &TensorError{Tensor: t.Name, Err: err}
			}
		}
		jobs[i] = j
		for c := 0; c < j.l.numChunks(); c++ {
			tasks = append(tasks, task{i, c})
		}
	}
	err = forEach(len(jobs), workers, func(_, i int) error { return jobs[i].prepare() })
	if err != nil {
		return nil, err
	}
	scratch := make([]chunkScratch, workers)
	err = forEach(len(tasks), workers, func(w, k int) error {
		j := jobs[tasks[k].tensor]
		s := scratch[w].get(j.l)
		x, err := j.encodeChunk(tasks[k].chunk, s)
		if err != nil {
			return err
		}
		y, err := j.decodeChunk(tasks[k].chunk, s, true)
		if err != nil {
			return err
		}
		j.measureChunk(tasks[k].chunk, x, y)
		return nil
	})
	if err != nil {
		return nil, err
	}
	hdr := &Header{Spec: cfg.Spec.String(), Source: src.Metadata}
	out := &safetensors.File{}
	var restored *safetensors.File
	if restore {
		restored = &safetensors.File{Metadata: src.Metadata}
	}
	rep := newReport(cfg)
	stored := make([][]safetensors.Tensor, len(jobs))
	for i, j := range jobs {
		stored[i] = j.stored()
	}
	final, coded, wired := stored, make([][]string, len(jobs)), make([][]string, len(jobs))
	unitNames := make([]string, len(jobs))
	for i, j := range jobs {
		unitNames[i] = j.name
	}
	if cfg.Spec.Wire {
		layouts := make([]*layout, len(jobs))
		for i, j := range jobs {
			layouts[i] = j.l
		}
		if final, wired, coded, err = wireStored(unitNames, layouts, stored, workers); err != nil {
			return nil, err
		}
	}
	if cfg.Spec.Lossless {
		if final, coded, err = deflateStored(unitNames, stored, workers); err != nil {
			return nil, err
		}
	}
	var total Accumulator
	for _, g := range unitGroups(units) {
		var acc Accumulator
		var heads []Accumulator
		var enc []safetensors.Tensor
		parts := make([]*tensorJob, len(g))
		for k, i := range g {
			j := jobs[i]
			parts[k] = j
			a, hs := j.sums()
			acc.Merge(&a)
			heads = append(heads, hs...)
			hdr.Tensors = append(hdr.Tensors, TensorInfo{Name: j.name, DType: j.dtype, Shape: j.shape, Scheme: j.l.s,
				Outliers: len(j.out.index), Lossless: coded[i], Wire: wired[i], Rotation: j.l.rotSizeRecorded(), Bins: j.bins,
				Of: units[i].of, Head: units[i].head})
			enc = append(enc, final[i]...)
			out.Tensors = append(out.Tensors, final[i]...)
			rep.countStored(j.name, final[i])
			for _, t := range stored[i] {
				rep.sizeWithoutLossless += int64(len(t.Data))
			}
			rep.SourceSizeBytes += int64(len(j.src))
		}
		total.Merge(&acc)
		whole := joinedTensor(units[g[0]].name(), parts)
		if restore {
			restored.Tensors = append(restored.Tensors, whole)
		}
		facts := parts[0].facts()
		if len(parts) > 1 || units[g[0]].of != "" {
			facts = joinedFacts(whole, parts, joinedScheme(units, g))
		}
		rep.addTensor(facts, &acc, heads, enc, cfg.Thresholds)
	}
	out.Metadata = hdr.metadata()
	rep.finish(&total, cfg.Thresholds)
	size, err := safetensors.EncodedSize(out)
	if err != nil {
		return nil, err
	}
	rep.CompressedFileBytes = size
	return &Result{Compressed: out, Restored: restored, Report: rep}, nil
}

type task struct{ tensor, chunk int }

// chunkScratch is one goroutine's buffers, sized for the largest chunk it saw.
type chunkScratch struct {
	x, a, b, y []float32
	q          []int8
	h          []byte // a half-precision chunk, when the reconstruction is measured but not kept
}

func (s *chunkScratch) half(n int) []byte {
	if len(s.h) < n {
		s.h = make([]byte, n)
	}
	return s.h[:n]
}

func (s *chunkScratch) get(l *layout) *chunkScratch {
	nat, q := l.chunkUnits*l.unitNat, l.chunkUnits*l.unitQ
	if len(s.x) < nat {
		s.x, s.y = make([]float32, nat), make([]float32, nat)
	}
	if len(s.a) < q {
		s.a, s.b, s.q = make([]float32, q), make([]float32, q), make([]int8, q)
	}
	return s
}

// headAcc is the sums of one KV head's elements within a chunk.
type headAcc struct {
	head int
	acc  Accumulator
}

// tensorJob is one tensor's stored form and, when compressing, its source
// and per-chunk sums.
type tensorJob struct {
	name     string
	dtype    safetensors.DType
	shape    []int
	l        *layout
	src      []byte    // source bytes (compress)
	pre      []float32 // the source with sparsity and outliers zeroed, when those stages are on
	out      outlierSet
	codes    []byte
	scales   []uint16
	zeros    []uint16
	residual []byte // the kept tokens, source dtype
	restored []byte
	accs     [][]headAcc // per chunk
	// rotation is what an engine format's rotation did to the tensor
	// (nil for kvlib's own schemes); nonFinite counts, per chunk, the
	// reconstruction's NaNs and Infs, which only an engine format makes
	// (from a value or scale past its range, as the engine does).
	rotation  *RotationInfo
	nonFinite []int
	// saturated counts the values a static-scale format clamped to its
	// largest finite value (|x / scale| beyond it), as the engine does.
	saturated atomic.Int64
	// bins and cg, for a whole-tensor engine format (lmcache:cachegen):
	// the engine's bins for this tensor (recorded in the header), and the
	// stored form decoded, which the chunks dequantize.
	bins int
	cg   *cacheGenState
}

// MaxReportedHeads bounds the per-head statistics of one tensor.
const MaxReportedHeads = 4096

func newJob(name string, dt safetensors.DType, shape []int, s Scheme, rot int, restore bool) (*tensorJob, error) {
	l, err := newLayout(shape, s, dt, rot)
	if err != nil {
		return nil, err
	}
	j := &tensorJob{name: name, dtype: dt, shape: shape, l: l}
	if restore { // Measure needs the reconstruction's values, not its bytes
		j.restored = make([]byte, l.n*dt.Size())
	}
	return j, nil
}

func newEncodeJob(t *safetensors.Tensor, s Scheme, rot *RotationInfo, restore bool) (*tensorJob, error) {
	size := 0
	if rot != nil {
		size = rot.Size
	}
	j, err := newJob(t.Name, t.DType, t.Shape, s, size, restore)
	if err != nil {
		return nil, err
	}
	j.rotation = rot
	j.src = t.Data
	j.codes = make([]byte, j.l.codeBytes())
	if j.l.q.packed() {
		j.scales = make([]uint16, j.l.groups)
	}
	if j.l.q.zeros {
		j.zeros = make([]uint16, j.l.groups)
	}
	j.residual = make([]byte, j.l.residualElems()*t.DType.Size())
	j.accs = make([][]headAcc, j.l.numChunks())
	if j.l.q.engine != nil {
		j.nonFinite = make([]int, j.l.numChunks())
	}
	return j, nil
}

// eachQuantized calls yield for the natural index of every quantized element, ascending.
func (l *layout) eachQuantized(yield func(i int) bool) {
	for u := 0; u < l.units; u++ {
		for k := 0; k < l.unitQ; k++ {
			if !yield(u*l.unitNat + k) {
				return
			}
		}
	}
}

// prepare runs the stages that look at the whole tensor before it is
// quantized: sparsity, then outlier selection, each over the quantized
// elements only.
func (j *tensorJob) prepare() error {
	if f := j.l.q.engine; f != nil && f.encodeTensor != nil {
		return f.encodeTensor(j) // the engine codes the whole tensor (and refuses NaN and Inf)
	}
	s := j.l.s
	if s.Sparsity == 0 && s.Outliers == 0 {
		return nil
	}
	x := make([]float32, j.l.n)
	safetensors.DecodeFloat32s(x, j.src, j.dtype)
	if i := firstNonFinite(x); i >= 0 {
		return tensorErrorf(j.name, "element %d is %v (%w)", i, x[i], ErrNotFinite)
	}
	if s.Sparsity > 0 {
		q := make([]float32, 0, j.l.nq)
		j.l.eachQuantized(func(i int) bool { q = append(q, x[i]); return true })
		if err := Sparsify(q, s.Sparsity); err != nil {
			return &TensorError{Tensor: j.name, Err: err}
		}
		k := 0
		j.l.eachQuantized(func(i int) bool { x[i] = q[k]; k++; return true })
	}
	if s.Outliers > 0 {
		var err error
		j.out, err = selectOutliers(x, j.l.eachQuantized, int(s.Outliers*float64(j.l.nq)))
		if err != nil {
			return &TensorError{Tensor: j.name, Err: err}
		}
		for _, i := range j.out.index {
			x[i] = 0
		}
	}
	j.pre = x
	return nil
}

// blockRun is how the job's engine format converts a run of blocks.
func (j *tensorJob) blockRun() blockRun {
	return blockRun{k: float32(j.l.s.Scale), elems: j.l.group, bytes: j.l.blockBytes, dtype: j.dtype}
}

// firstNonFinite returns the index of the first NaN or Inf in x, or -1.
func firstNonFinite(x []float32) int {
	if absMaxBits(x) < 0x7f800000 { // none (the AVX2 kernel's pass where there is one)
		return -1
	}
	for i, v := range x {
		if math.Float32bits(v)&0x7f800000 == 0x7f800000 {
			return i
		}
	}
	return -1
}

// encodeChunk quantizes chunk c into the stored codes, scales and zero
// points, and copies its residual tokens. It returns the chunk's source
// values: a view of the source bytes where they are native float32s, else
// decoded into s.x.
func (j *tensorJob) encodeChunk(c int, s *chunkScratch) ([]float32, error) {
	l := j.l
	u0, u1, nlo, nhi, qlo, qhi := l.chunk(c)
	esz := j.dtype.Size()
	x, ok := j.view(j.src, nlo, nhi)
	if !ok {
		x = s.x[:nhi-nlo]
		safetensors.DecodeFloat32s(x, j.src[nlo*esz:nhi*esz], j.dtype)
	}
	notFinite := func() error { // the first NaN or Inf of the chunk, by its natural index
		i := firstNonFinite(x)
		if i < 0 { // a stage made it (sparsity and outliers keep finite values finite): a bug
			return tensorErrorf(j.name, "a stage made a NaN or Inf of finite input (%w)", ErrNotFinite)
		}
		return tensorErrorf(j.name, "element %d is %v (%w)", nlo+i, x[i], ErrNotFinite)
	}
	src := x
	if j.pre != nil {
		src = j.pre[nlo:nhi]
	}
	// A NaN or Inf in the cache is refused. f16 and none check here; the
	// engines' block types report it per block, unless the engine's
	// rotation runs first, whose sums may overflow to Inf from finite
	// values: the engine stores what its quantizer makes of them, and so
	// does kv-compress (the report counts the reconstruction's NaN and Inf).
	if (l.q.encodeAll != nil || l.q.engine != nil && l.rot > 0) && firstNonFinite(x) >= 0 {
		return nil, notFinite()
	}
	xq := src
	if l.slab || l.rot > 0 {
		xq = s.a[:qhi-qlo]
		l.gather(xq, src, u0, u1)
	}
	if l.rot > 0 {
		l.rotate(xq)
	}
	xp := l.toQOrder(s.b, xq)
	q := s.q[:qhi-qlo]
	if l.q.encodeAll != nil {
		l.q.encodeAll(j, xp, qlo, qhi)
		return x, nil
	}
	if f := l.q.engine; f != nil && l.runs() {
		bb := l.blockBytes
		// (the whole run is converted and its clamped values counted before
		// a non-finite value is refused; the refusal is the same)
		nonFinite, n := f.runQuantize(xp[:qhi-qlo], j.codes[qlo/l.group*bb:qhi/l.group*bb], j.blockRun())
		if n > 0 {
			j.saturated.Add(int64(n))
		}
		if nonFinite && l.rot == 0 {
			return nil, notFinite() // as encodeEngine refuses it
		}
		return x, nil
	}
	encode := l.q.encode
	err := l.eachGroup(qlo, qhi, func(gs, ge, gi int) error {
		err := encode(j, xp[gs:ge], q[gs:ge], gi)
		if errors.Is(err, ErrNotFinite) {
			return notFinite()
		}
		if err != nil {
			return &TensorError{Tensor: j.name, Err: &GroupError{Group: gi, Err: err}}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if l.residualElems() > 0 && firstNonFinite(x) >= 0 { // the kept tokens are not quantized
		return nil, notFinite()
	}
	if l.q.packed() {
		Pack(j.codes[qlo*l.s.Bits/8:PackedLen(qhi, l.s.Bits)], q, l.s.Bits)
	}
	if l.residualElems() > 0 {
		rt := (l.t - l.tq) * l.d // residual elements per slab
		for u := u0; u < u1; u++ {
			copy(j.residual[u*rt*esz:(u+1)*rt*esz], j.src[(u*l.unitNat+l.unitQ)*esz:(u+1)*l.unitNat*esz])
		}
	}
	return x, nil
}

// view returns elements [lo, hi) of b (tensor data in j's dtype) as
// float32s without copying, when the dtype is F32 and the host reads it
// natively.
func (j *tensorJob) view(b []byte, lo, hi int) ([]float32, bool) {
	if j.dtype != safetensors.F32 || b == nil {
		return nil, false
	}
	return safetensors.Float32View(b[4*lo : 4*hi])
}

// decodeChunk restores chunk c from the stored form into j.restored and
// returns it in natural order, rounded to the source dtype. Where
// j.restored holds native float32s the values are decoded into it in
// place, else into scratch and then encoded. With inScratch the chunk's
// codes are still in s.q, as encodeChunk packed them.
func (j *tensorJob) decodeChunk(c int, s *chunkScratch, inScratch bool) ([]float32, error) {
	l := j.l
	u0, u1, nlo, nhi, qlo, qhi := l.chunk(c)
	esz := j.dtype.Size()
	out, direct := j.view(j.restored, nlo, nhi)
	yp, yqBuf, yBuf := s.a[:qhi-qlo], s.b, s.y
	if direct { // without a slab the quantized elements are the whole chunk
		if !l.slab && l.s.Axis != Channel {
			yp = out // quantization order is natural order
		}
		yqBuf, yBuf = out, out
	}
	q := s.q[:qhi-qlo]
	if l.q.packed() && !inScratch {
		Unpack(q, j.codes[qlo*l.s.Bits/8:PackedLen(qhi, l.s.Bits)], l.s.Bits)
	}
	if l.q.decodeAll != nil {
		l.q.decodeAll(j, yp, qlo, qhi)
	} else if f := l.q.engine; f != nil && l.runs() {
		bb := l.blockBytes
		f.runDequantize(j.codes[qlo/l.group*bb:qhi/l.group*bb], yp[:qhi-qlo], j.blockRun())
	} else {
		decode := l.q.decode
		err := l.eachGroup(qlo, qhi, func(gs, ge, gi int) error {
			if err := decode(j, yp[gs:ge], q[gs:ge], gi); err != nil {
				return &TensorError{Tensor: j.name, Err: &GroupError{Group: gi, Err: err}}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	yq := l.fromQOrder(yqBuf, yp)
	if l.rot > 0 {
		l.rotate(yq)
	}
	y := yq
	if l.slab {
		y = yBuf[:nhi-nlo]
		l.scatter(y, yq, u0, u1)
		rt := (l.t - l.tq) * l.d
		for u := u0; u < u1; u++ {
			off := (u-u0)*l.unitNat + l.unitQ
			safetensors.DecodeFloat32s(y[off:off+rt], j.residual[u*rt*esz:(u+1)*rt*esz], j.dtype)
		}
	}
	j.out.restore(y, nlo, nhi)
	keepInf := l.q.engine != nil // an engine's own Inf (an f16 overflow, an Inf scale) stays
	switch {
	case j.dtype != safetensors.F32 && j.restored != nil:
		roundToDTypeInf(y, j.dtype, j.restored[nlo*esz:nhi*esz], keepInf) // written once, in place
	case j.dtype != safetensors.F32:
		roundToDTypeInf(y, j.dtype, s.half(len(y)*esz), keepInf)
	case j.restored != nil && !direct:
		safetensors.EncodeFloat32s(j.restored[nlo*esz:nhi*esz], y, j.dtype)
	}
	return y, nil
}

// measureChunk accumulates the error of chunk c, per KV head where the
// tensor has a head axis (4-D, at most MaxReportedHeads heads).
func (j *tensorJob) measureChunk(c int, x, y []float32) {
	l := j.l
	_, _, nlo, nhi, _, _ := l.chunk(c)
	x = x[:nhi-nlo]
	defer func() { // only a chunk whose error sums are not finite has an Inf or NaN to count
		if j.nonFinite == nil {
			return
		}
		for _, ha := range j.accs[c] {
			if e := ha.acc.SumE2 + ha.acc.MaxError; math.IsNaN(e) || math.IsInf(e, 0) {
				for _, v := range y[:nhi-nlo] {
					if math.Float32bits(v)&0x7f800000 == 0x7f800000 {
						j.nonFinite[c]++
					}
				}
				return
			}
		}
	}()
	if !l.fourD || l.h > MaxReportedHeads {
		var a Accumulator
		a.Add(x, y)
		j.accs[c] = []headAcc{{0, a}}
		return
	}
	var accs []headAcc
	slab := l.t * l.d
	for i := nlo; i < nhi; {
		end := min(nhi, (i/slab+1)*slab)
		h := l.head(i)
		if len(accs) == 0 || accs[len(accs)-1].head != h {
			accs = append(accs, headAcc{head: h})
		}
		accs[len(accs)-1].acc.Add(x[i-nlo:end-nlo], y[i-nlo:end-nlo])
		i = end
	}
	j.accs[c] = accs
}

// sums is the tensor's sums and its per-head ones (nil without a head axis).
func (j *tensorJob) sums() (Accumulator, []Accumulator) {
	heads := j.heads()
	var acc Accumulator
	if heads != nil {
		for h := range heads {
			acc.Merge(&heads[h])
		}
		return acc, heads
	}
	for _, a := range j.accs {
		for _, ha := range a {
			acc.Merge(&ha.acc)
		}
	}
	return acc, nil
}

// heads merges the chunks' sums per head, in chunk order, so the floating
// point sums do not depend on how goroutines were scheduled. Nil when the
// tensor has no head axis.
func (j *tensorJob) heads() []Accumulator {
	if !j.l.fourD || j.l.h > MaxReportedHeads {
		return nil
	}
	heads := make([]Accumulator, j.l.h)
	for _, accs := range j.accs {
		for _, ha := range accs {
			heads[ha.head].Merge(&ha.acc)
		}
	}
	return heads
}

// stored returns the tensors that hold j in a compressed file.
func (j *tensorJob) stored() []safetensors.Tensor {
	f16 := func(v []uint16) []byte {
		b := make([]byte, 2*len(v))
		for i, s := range v {
			binary.LittleEndian.PutUint16(b[2*i:], s)
		}
		return b
	}
	ts := []safetensors.Tensor{{Name: j.name + CodesSuffix, DType: safetensors.U8, Shape: []int{len(j.codes)}, Data: j.codes}}
	if j.scales != nil {
		ts = append(ts, safetensors.Tensor{Name: j.name + ScalesSuffix, DType: safetensors.F16, Shape: []int{len(j.scales)}, Data: f16(j.scales)})
	}
	if j.zeros != nil {
		ts = append(ts, safetensors.Tensor{Name: j.name + ZerosSuffix, DType: safetensors.F16, Shape: []int{len(j.zeros)}, Data: f16(j.zeros)})
	}
	ts = append(ts, j.out.tensors(j.name)...)
	if len(j.residual) > 0 {
		l := j.l
		ts = append(ts, safetensors.Tensor{Name: j.name + ResidualSuffix, DType: j.dtype, Shape: []int{l.b, l.h, l.t - l.tq, l.d}, Data: j.residual})
	}
	return ts
}

// forEach runs fn(worker, i) for i in [0, n) on the given goroutines and
// returns the error of the lowest i that failed, so errors are deterministic.
func forEach(n, workers int, fn func(worker, i int) error) error {
	workers = max(1, min(workers, n))
	var next atomic.Int64
	var failed atomic.Bool
	var wg sync.WaitGroup
	errs := make([]error, n)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for !failed.Load() {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if errs[i] = call(fn, w, i); errs[i] != nil {
					failed.Store(true)
				}
			}
		}(w)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// call runs fn, turning a panic into an error: a worker goroutine's panic
// cannot be recovered anywhere else, and must not end the process.
func call(fn func(worker, i int) error, w, i int) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("internal error: %v", r)
		}
	}()
	return fn(w, i)
}

// roundToDType writes y to buf in dtype dt (F16 or BF16; F32 is left as it
// is), saturating at dt's largest finite value (a reconstruction never
// becomes Inf), and reads it back into y, so metrics measure the
// reconstruction exactly as it is written. buf holds 2*len(y) bytes: the
// restored tensor's own bytes, or scratch when nothing is restored.
func roundToDType(y []float32, dt safetensors.DType, buf []byte) { roundToDTypeInf(y, dt, buf, false) }

// roundToDTypeInf is roundToDType where, with keepInf, an infinite value
// stays infinite (an engine format's own Inf, which the engine's attention
// would see); finite values still saturate.
func roundToDTypeInf(y []float32, dt safetensors.DType, buf []byte, keepInf bool) {
	lim := float32(65504)
	switch dt {
	case safetensors.F16:
	case safetensors.BF16:
		lim = 0x1.fep127 // BF16's largest finite value
	default:
		return
	}
	if keepInf {
		clampFinite(y, lim)
	} else {
		clampAbs(y, lim)
	}
	safetensors.EncodeFloat32s(buf, y, dt)
	safetensors.DecodeFloat32s(y, buf, dt)
}

// Decompress restores every tensor of a compressed file in its source
// dtype and shape, with the source file's metadata.
func Decompress(src *safetensors.File, workers int) (*safetensors.File, *Header, error) {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	workers = min(workers, MaxWorkers)
	hdr, parts, err := readFile(src, workers)
	if err != nil {
		return nil, nil, err
	}
	out := &safetensors.File{Metadata: hdr.Source}
	jobs := make([]*tensorJob, len(hdr.Tensors))
	var tasks []task
	for i, ti := range hdr.Tensors {
		st := parts[i]
		j, err := newJob(ti.Name, ti.DType, ti.Shape, ti.Scheme, ti.Rotation, true)
		if err != nil {
			return nil, nil, &TensorError{Tensor: ti.Name, Err: err}
		}
		j.codes, j.out, j.bins = st.codes.Data, st.outliers, ti.Bins
		if st.scales != nil {
			j.scales = u16s(st.scales.Data)
		}
		if st.zeros != nil {
			j.zeros = u16s(st.zeros.Data)
		}
		if st.residual != nil {
			j.residual = st.residual.Data
		}
		jobs[i] = j
		for c := 0; c < j.l.numChunks(); c++ {
			tasks = append(tasks, task{i, c})
		}
	}
	err = forEach(len(jobs), workers, func(_, i int) error { // a whole-tensor format's stored form, parsed and checked
		if f := jobs[i].l.q.engine; f != nil && f.decodeTensor != nil {
			return f.decodeTensor(jobs[i])
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	scratch := make([]chunkScratch, workers)
	err = forEach(len(tasks), workers, func(w, k int) error {
		j := jobs[tasks[k].tensor]
		_, err := j.decodeChunk(tasks[k].chunk, scratch[w].get(j.l), false)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	for _, p := range hdr.joined {
		parts := make([]*tensorJob, len(p.infos))
		for k, i := range p.infos {
			parts[k] = jobs[i]
		}
		out.Tensors = append(out.Tensors, joinedTensor(p.name, parts))
	}
	return out, hdr, nil
}

func u16s(b []byte) []uint16 {
	v := make([]uint16, len(b)/2)
	for i := range v {
		v[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return v
}

// clampFinite limits the finite values of x to [-lim, lim] in place,
// leaving Inf and NaN as they are.
func clampFinite(x []float32, lim float32) {
	for i, v := range x {
		switch {
		case v > lim && v <= math.MaxFloat32:
			x[i] = lim
		case v < -lim && v >= -math.MaxFloat32:
			x[i] = -lim
		}
	}
}

// rotSizeRecorded is the rotation a file records for the tensor: an
// engine format's Hadamard size (0 for none, and for kvlib's /rot, which
// the scheme alone determines).
func (l *layout) rotSizeRecorded() int {
	if l.llamaRot {
		return l.rot
	}
	return 0
}
