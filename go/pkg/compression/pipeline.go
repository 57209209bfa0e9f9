package compression

import (
	"encoding/binary"
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
// Decompress(result.Compressed).
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
	hdr := &Header{Bits: opt.Bits, GroupSize: opt.GroupSize, Sparsity: opt.Sparsity, Source: src.Metadata}
	out := &safetensors.File{}
	var restored *safetensors.File
	if restore {
		restored = &safetensors.File{Metadata: src.Metadata}
	}
	rep := newReport(opt)
	var total Accumulator
	for i := range src.Tensors {
		t := &src.Tensors[i]
		if !t.DType.IsFloat() {
			return nil, fmt.Errorf("tensor %q: dtype %s is not F32, F16 or BF16", t.Name, t.DType)
		}
		enc, acc, heads, rest, err := compressTensor(t, opt, restore)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		hdr.Tensors = append(hdr.Tensors, TensorInfo{Name: t.Name, DType: t.DType, Shape: t.Shape})
		out.Tensors = append(out.Tensors, enc...)
		if restore {
			restored.Tensors = append(restored.Tensors, rest)
		}
		total.Merge(acc)
		rep.addTensor(t, acc, heads, opt.Thresholds)
		rep.SourceSizeBytes += int64(len(t.Data))
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
	groups := max(8, (1<<16)/groupSize/8*8)
	return groups * groupSize
}

// forChunks runs fn(worker, chunk) over n chunks on the given goroutines
// and returns the first error.
func forChunks(n, workers int, fn func(worker, chunk int) error) error {
	workers = max(1, min(workers, n))
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for {
				c := int(next.Add(1)) - 1
				if c >= n {
					return
				}
				if err := fn(w, c); err != nil {
					errs[w] = err
					next.Store(int64(n))
					return
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

func compressTensor(t *safetensors.Tensor, opt Options, restore bool) (enc []safetensors.Tensor, total *Accumulator, heads []Accumulator, rest safetensors.Tensor, err error) {
	n := t.NumElements()
	bits, g := opt.Bits, opt.GroupSize
	cl := chunkLen(g)
	nchunks := (n + cl - 1) / cl
	workers := opt.workers()

	x := make([]float32, n)
	err = forChunks(nchunks, workers, func(_, c int) error {
		lo, hi := c*cl, min(n, (c+1)*cl)
		esz := t.DType.Size()
		safetensors.DecodeFloat32s(x[lo:hi], t.Data[lo*esz:hi*esz], t.DType)
		for i := lo; i < hi; i++ {
			if v := x[i]; math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("element %d is %v (NaN and Inf cannot be quantized)", i, v)
			}
		}
		return nil
	})
	if err != nil {
		return
	}
	xq := x // what gets quantized
	if opt.Sparsity > 0 {
		xq = append([]float32(nil), x...)
		if err = Sparsify(xq, opt.Sparsity); err != nil {
			return
		}
	}

	codes := make([]byte, PackedLen(n, bits))
	groups := (n + g - 1) / g
	scales := make([]uint16, groups)
	if restore {
		rest = safetensors.Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Data: make([]byte, len(t.Data))}
	}
	nh, inner := geometry(t.Shape)
	perChunk := make([][]Accumulator, nchunks)
	qbuf := make([][]int8, workers)
	ybuf := make([][]float32, workers)
	err = forChunks(nchunks, workers, func(w, c int) error {
		if qbuf[w] == nil {
			qbuf[w], ybuf[w] = make([]int8, cl), make([]float32, cl)
		}
		lo, hi := c*cl, min(n, (c+1)*cl)
		q, y := qbuf[w][:hi-lo], ybuf[w][:hi-lo]
		for gs := lo; gs < hi; gs += g {
			ge := min(gs+g, hi)
			h, err := QuantizeGroup(xq[gs:ge], bits, q[gs-lo:ge-lo])
			if err != nil {
				return fmt.Errorf("group %d: %w", gs/g, err)
			}
			scales[gs/g] = h
			DequantizeGroup(y[gs-lo:ge-lo], q[gs-lo:ge-lo], h)
		}
		Pack(codes[lo*bits/8:PackedLen(hi, bits)], q, bits)
		roundToDType(y, t.DType)
		if restore {
			esz := t.DType.Size()
			safetensors.EncodeFloat32s(rest.Data[lo*esz:hi*esz], y, t.DType)
		}
		accs := make([]Accumulator, nh)
		for i := lo; i < hi; {
			seg := i / inner
			end := min(hi, (seg+1)*inner)
			accs[seg%nh].Add(x[i:end], y[i-lo:end-lo])
			i = end
		}
		perChunk[c] = accs
		return nil
	})
	if err != nil {
		return
	}
	heads = make([]Accumulator, nh)
	for _, accs := range perChunk { // in chunk order: sums are deterministic
		for h := range accs {
			heads[h].Merge(&accs[h])
		}
	}
	total = &Accumulator{}
	for h := range heads {
		total.Merge(&heads[h])
	}
	scaleBytes := make([]byte, 2*groups)
	for i, s := range scales {
		binary.LittleEndian.PutUint16(scaleBytes[2*i:], s)
	}
	enc = []safetensors.Tensor{
		{Name: t.Name + CodesSuffix, DType: safetensors.U8, Shape: []int{len(codes)}, Data: codes},
		{Name: t.Name + ScalesSuffix, DType: safetensors.F16, Shape: []int{groups}, Data: scaleBytes},
	}
	return
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
	for _, ti := range hdr.Tensors {
		codes, scales := src.Tensor(ti.Name+CodesSuffix), src.Tensor(ti.Name+ScalesSuffix)
		n := ti.NumElements()
		esz := ti.DType.Size()
		rest := safetensors.Tensor{Name: ti.Name, DType: ti.DType, Shape: ti.Shape, Data: make([]byte, n*esz)}
		nchunks := (n + cl - 1) / cl
		qbuf := make([][]int8, workers)
		ybuf := make([][]float32, workers)
		err := forChunks(nchunks, workers, func(w, c int) error {
			if qbuf[w] == nil {
				qbuf[w], ybuf[w] = make([]int8, cl), make([]float32, cl)
			}
			lo, hi := c*cl, min(n, (c+1)*cl)
			q, y := qbuf[w][:hi-lo], ybuf[w][:hi-lo]
			Unpack(q, codes.Data[lo*bits/8:PackedLen(hi, bits)], bits)
			for gs := lo; gs < hi; gs += g {
				ge := min(gs+g, hi)
				h := binary.LittleEndian.Uint16(scales.Data[2*(gs/g):])
				if h&0x7c00 == 0x7c00 {
					return fmt.Errorf("group %d: scale is not finite", gs/g)
				}
				DequantizeGroup(y[gs-lo:ge-lo], q[gs-lo:ge-lo], h)
			}
			safetensors.EncodeFloat32s(rest.Data[lo*esz:hi*esz], y, ti.DType)
			return nil
		})
		if err != nil {
			return nil, nil, fmt.Errorf("tensor %q: %w", ti.Name, err)
		}
		out.Tensors = append(out.Tensors, rest)
	}
	return out, hdr, nil
}
