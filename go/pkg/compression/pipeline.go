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

// Options configure Compress.
type Options struct {
	Bits       int
	GroupSize  int
	Sparsity   float64 // fraction of smallest-magnitude elements zeroed per tensor
	Workers    int     // goroutines; 0 means GOMAXPROCS
	Thresholds Thresholds
}

// DefaultOptions are 4-bit codes in groups of 64 with the default gates.
func DefaultOptions() Options {
	return Options{Bits: 4, GroupSize: 64, Thresholds: DefaultThresholds}
}

func (o Options) workers() int {
	if o.Workers > 0 {
		return o.Workers
	}
	return runtime.GOMAXPROCS(0)
}

// Result is what Compress produces.
type Result struct {
	Compressed *safetensors.File // the packed form
	Restored   *safetensors.File // the reconstruction in the source dtypes, if asked for
	Report     *Report
}

// Compress quantizes every tensor of src (all must be F32, F16 or BF16 and
// finite), packs the codes, and measures the reconstruction against src.
// With restore it also returns the reconstruction, bit-identical to
// Decompress(result.Compressed). Work is spread over goroutines in chunks
// of whole groups taken from all tensors at once.
func Compress(src *safetensors.File, opt Options, restore bool) (*Result, error) {
	if err := CheckParams(opt.Bits, opt.GroupSize); err != nil {
		return nil, err
	}
	if opt.Sparsity < 0 || opt.Sparsity >= 1 || math.IsNaN(opt.Sparsity) {
		return nil, fmt.Errorf("sparsity %g out of range [0, 1)", opt.Sparsity)
	}
	if IsCompressed(src) {
		return nil, fmt.Errorf("already kvq-compressed (metadata %q); use decompress", metaFormat)
	}
	jobs := make([]*tensorJob, len(src.Tensors))
	var tasks []task
	for i := range src.Tensors {
		t := &src.Tensors[i]
		if !t.DType.IsFloat() {
			return nil, fmt.Errorf("tensor %q: dtype %s is not F32, F16 or BF16", t.Name, t.DType)
		}
		jobs[i] = newTensorJob(t, opt, restore)
		for c := range jobs[i].accs {
			tasks = append(tasks, task{i, c})
		}
	}
	if opt.Sparsity > 0 {
		err := forEach(len(jobs), opt.workers(), func(_, i int) error { return jobs[i].sparsify(opt.Sparsity) })
		if err != nil {
			return nil, err
		}
	}
	cl := chunkLen(opt.GroupSize)
	workers := opt.workers()
	scratch := make([]chunkScratch, workers)
	err := forEach(len(tasks), workers, func(w, k int) error {
		if scratch[w].x == nil {
			scratch[w] = chunkScratch{x: make([]float32, cl), y: make([]float32, cl), q: make([]int8, cl)}
		}
		return jobs[tasks[k].tensor].compressChunk(tasks[k].chunk, &scratch[w])
	})
	if err != nil {
		return nil, err
	}

	hdr := &Header{Bits: opt.Bits, GroupSize: opt.GroupSize, Sparsity: opt.Sparsity, Source: src.Metadata}
	out := &safetensors.File{}
	var restored *safetensors.File
	if restore {
		restored = &safetensors.File{Metadata: src.Metadata}
	}
	rep := newReport(opt)
	var total Accumulator
	for _, j := range jobs {
		heads := j.heads()
		var acc Accumulator
		for h := range heads {
			acc.Merge(&heads[h])
		}
		total.Merge(&acc)
		hdr.Tensors = append(hdr.Tensors, TensorInfo{Name: j.t.Name, DType: j.t.DType, Shape: j.t.Shape})
		enc := j.encoded()
		out.Tensors = append(out.Tensors, enc...)
		if restore {
			restored.Tensors = append(restored.Tensors, j.restored)
		}
		rep.addTensor(j.t, &acc, heads, opt.Thresholds)
		rep.SourceSizeBytes += int64(len(j.t.Data))
		rep.CompressedSizeBytes += int64(len(enc[0].Data) + len(enc[1].Data))
	}
	out.Metadata = hdr.metadata()
	rep.finish(&total, opt.Thresholds)
	size, err := safetensors.EncodedSize(out)
	if err != nil {
		return nil, err
	}
	rep.CompressedFileBytes = size
	return &Result{Compressed: out, Restored: restored, Report: rep}, nil
}

type task struct{ tensor, chunk int }

type chunkScratch struct {
	x, y []float32
	q    []int8
}

// tensorJob holds one tensor's inputs, outputs and per-chunk sums.
type tensorJob struct {
	t           *safetensors.Tensor
	bits, group int
	n, cl       int
	nheads      int
	inner       int
	sparse      []float32 // the sparsified tensor, when sparsity > 0
	codes       []byte
	scales      []uint16
	restored    safetensors.Tensor
	restore     bool
	accs        [][]Accumulator // per chunk, per head
}

func newTensorJob(t *safetensors.Tensor, opt Options, restore bool) *tensorJob {
	n := t.NumElements()
	j := &tensorJob{t: t, bits: opt.Bits, group: opt.GroupSize, n: n, cl: chunkLen(opt.GroupSize), restore: restore}
	j.nheads, j.inner = geometry(t.Shape)
	j.codes = make([]byte, PackedLen(n, opt.Bits))
	j.scales = make([]uint16, (n+opt.GroupSize-1)/opt.GroupSize)
	j.accs = make([][]Accumulator, (n+j.cl-1)/j.cl)
	if restore {
		j.restored = safetensors.Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Data: make([]byte, len(t.Data))}
	}
	return j
}

func (j *tensorJob) sparsify(p float64) error {
	x, err := j.t.Float32s(nil)
	if err != nil {
		return err
	}
	if i := firstNonFinite(x); i >= 0 {
		return fmt.Errorf("tensor %q: element %d is %v (%w)", j.t.Name, i, x[i], ErrNotFinite)
	}
	if err := Sparsify(x, p); err != nil {
		return fmt.Errorf("tensor %q: %w", j.t.Name, err)
	}
	j.sparse = x
	return nil
}

// firstNonFinite returns the index of the first NaN or Inf in x, or -1.
func firstNonFinite(x []float32) int {
	for i, v := range x {
		if math.Float32bits(v)&0x7f800000 == 0x7f800000 {
			return i
		}
	}
	return -1
}

// compressChunk quantizes, packs, restores and measures chunk c.
func (j *tensorJob) compressChunk(c int, s *chunkScratch) error {
	lo, hi := c*j.cl, min(j.n, (c+1)*j.cl)
	esz := j.t.DType.Size()
	x, y, q := s.x[:hi-lo], s.y[:hi-lo], s.q[:hi-lo]
	safetensors.DecodeFloat32s(x, j.t.Data[lo*esz:hi*esz], j.t.DType)
	xq := x
	if j.sparse != nil {
		xq = j.sparse[lo:hi]
	}
	g := j.group
	for gs := 0; gs < len(x); gs += g {
		ge := min(gs+g, len(x))
		h, err := QuantizeGroup(xq[gs:ge], j.bits, q[gs:ge])
		if errors.Is(err, ErrNotFinite) {
			i := gs + firstNonFinite(x[gs:ge])
			return fmt.Errorf("tensor %q: element %d is %v (%w)", j.t.Name, lo+i, x[i], err)
		}
		if err != nil {
			return fmt.Errorf("tensor %q: group %d: %w", j.t.Name, (lo+gs)/g, err)
		}
		j.scales[(lo+gs)/g] = h
		DequantizeGroup(y[gs:ge], q[gs:ge], h)
	}
	Pack(j.codes[lo*j.bits/8:PackedLen(hi, j.bits)], q, j.bits)
	roundToDType(y, j.t.DType)
	if j.restore {
		safetensors.EncodeFloat32s(j.restored.Data[lo*esz:hi*esz], y, j.t.DType)
	}
	accs := make([]Accumulator, j.nheads)
	for i := lo; i < hi; {
		seg := i / j.inner
		end := min(hi, (seg+1)*j.inner)
		accs[seg%j.nheads].Add(x[i-lo:end-lo], y[i-lo:end-lo])
		i = end
	}
	j.accs[c] = accs
	return nil
}

// heads merges the chunks' sums per head, in chunk order, so the floating
// point sums do not depend on how goroutines were scheduled.
func (j *tensorJob) heads() []Accumulator {
	heads := make([]Accumulator, j.nheads)
	for _, accs := range j.accs {
		for h := range accs {
			heads[h].Merge(&accs[h])
		}
	}
	return heads
}

func (j *tensorJob) encoded() []safetensors.Tensor {
	scaleBytes := make([]byte, 2*len(j.scales))
	for i, s := range j.scales {
		binary.LittleEndian.PutUint16(scaleBytes[2*i:], s)
	}
	return []safetensors.Tensor{
		{Name: j.t.Name + CodesSuffix, DType: safetensors.U8, Shape: []int{len(j.codes)}, Data: j.codes},
		{Name: j.t.Name + ScalesSuffix, DType: safetensors.F16, Shape: []int{len(j.scales)}, Data: scaleBytes},
	}
}

// geometry splits a tensor along axis 1 (the KV head of a [batch, heads,
// seq, head_dim] cache): element i belongs to slice (i / inner) % heads.
func geometry(shape []int) (heads, inner int) {
	if len(shape) < 2 || shape[1] == 0 {
		return 1, max(1, product(shape))
	}
	inner = 1
	for _, d := range shape[2:] {
		inner *= d
	}
	return shape[1], max(inner, 1)
}

func product(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// chunkLen is the elements one goroutine takes at a time: whole groups, and
// a multiple of 8 groups so that every chunk's codes start on a byte.
func chunkLen(groupSize int) int {
	groups := max(8, (1<<14)/groupSize/8*8)
	return groups * groupSize
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
				if errs[i] = fn(w, i); errs[i] != nil {
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

// roundToDType rounds float32 values to what dtype dt can hold, so metrics
// measure the reconstruction exactly as it is written.
func roundToDType(y []float32, dt safetensors.DType) {
	switch dt {
	case safetensors.F16:
		for i, v := range y {
			y[i] = safetensors.FP16ToFloat32(safetensors.Float32ToFP16(v))
		}
	case safetensors.BF16:
		for i, v := range y {
			y[i] = safetensors.BF16ToFloat32(safetensors.Float32ToBF16(v))
		}
	}
}

// Decompress restores every tensor of a compressed file in its source
// dtype and shape, with the source file's metadata.
func Decompress(src *safetensors.File, workers int) (*safetensors.File, *Header, error) {
	hdr, err := ReadHeader(src)
	if err != nil {
		return nil, nil, err
	}
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	out := &safetensors.File{Metadata: hdr.Source}
	bits, g := hdr.Bits, hdr.GroupSize
	cl := chunkLen(g)
	var tasks []task
	for i, ti := range hdr.Tensors {
		n := ti.NumElements()
		out.Tensors = append(out.Tensors, safetensors.Tensor{Name: ti.Name, DType: ti.DType, Shape: ti.Shape, Data: make([]byte, n*ti.DType.Size())})
		for c := 0; c*cl < n; c++ {
			tasks = append(tasks, task{i, c})
		}
	}
	scratch := make([]chunkScratch, workers)
	err = forEach(len(tasks), workers, func(w, k int) error {
		if scratch[w].y == nil {
			scratch[w] = chunkScratch{y: make([]float32, cl), q: make([]int8, cl)}
		}
		ti, rest := hdr.Tensors[tasks[k].tensor], &out.Tensors[tasks[k].tensor]
		codes, scales := src.Tensor(ti.Name+CodesSuffix), src.Tensor(ti.Name+ScalesSuffix)
		n, esz := ti.NumElements(), ti.DType.Size()
		lo, hi := tasks[k].chunk*cl, min(n, (tasks[k].chunk+1)*cl)
		q, y := scratch[w].q[:hi-lo], scratch[w].y[:hi-lo]
		Unpack(q, codes.Data[lo*bits/8:PackedLen(hi, bits)], bits)
		for gs := lo; gs < hi; gs += g {
			ge := min(gs+g, hi)
			h := binary.LittleEndian.Uint16(scales.Data[2*(gs/g):])
			if h&0x7c00 == 0x7c00 {
				return fmt.Errorf("tensor %q: group %d: scale is not finite", ti.Name, gs/g)
			}
			DequantizeGroup(y[gs-lo:ge-lo], q[gs-lo:ge-lo], h)
		}
		safetensors.EncodeFloat32s(rest.Data[lo*esz:hi*esz], y, ti.DType)
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return out, hdr, nil
}
