package compression

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"errors"
	"io"

	"kvlib/pkg/safetensors"
)

// The lossless stage (spec suffix "+lossless"): after quantizing, each
// stored part of a tensor (its codes, scales and zero points) is cut into
// chunks of LosslessChunk raw bytes, and each chunk is coded on its own as
// a Huffman-only deflate stream (compress/flate.HuffmanOnly: per-chunk
// Huffman tables over bytes, no LZ77). A part is kept only where that
// makes it smaller. The coded part NAME.codes holds the streams one after
// the other, and NAME.codes.chunks (U64) the end offset of each, so chunks
// code and decode in parallel. The reconstruction is bit for bit that of
// the same scheme without the stage.
//
// Huffman-only was chosen by measurement (BenchmarkLosslessCoder, printed by
// make bench): on a real SmolLM2 cache it codes int4 codes to 0.72 of their
// size, faster than flate.BestSpeed, which reaches 0.78: the codes have
// skewed byte statistics but few repeats for LZ77 to find. Every literal costs at least
// one bit, so a chunk can never inflate to more than 8 times its coded
// size; the decoder refuses one that claims more before allocating, and
// never writes past a chunk's declared size.

// LosslessChunk is the raw size of one independently coded chunk.
const LosslessChunk = 1 << 16

// ChunksSuffix names the end-offset table of a coded part.
const ChunksSuffix = ".chunks"

// maxInflation is how many raw bytes one coded byte can stand for in a
// Huffman-only stream (one bit per literal at best).
const maxInflation = 8

var losslessParts = []string{CodesSuffix, ScalesSuffix, ZerosSuffix}

// ErrLossless reports a coded payload that does not decode to its declared size.
var ErrLossless = errors.New("lossless payload")

type chunkJob struct {
	part  int // index into parts
	chunk int
}

type codedPart struct {
	tensor, suffix string
	raw            []byte
	coded          [][]byte
}

// deflateStored codes the parts of every tensor's stored form in parallel
// and returns the stored tensors with each part replaced by its coded form
// and offsets wherever that is smaller; coded[i] lists the suffixes of
// tensor i that were coded.
func deflateStored(names []string, stored [][]safetensors.Tensor, workers int) ([][]safetensors.Tensor, [][]string, error) {
	var parts []*codedPart
	var jobs []chunkJob
	for i, ts := range stored {
		for _, t := range ts {
			for _, suffix := range losslessParts {
				if t.Name == names[i]+suffix && len(t.Data) > 0 {
					p := &codedPart{tensor: names[i], suffix: suffix, raw: t.Data}
					p.coded = make([][]byte, (len(t.Data)-1)/LosslessChunk+1)
					for c := range p.coded {
						jobs = append(jobs, chunkJob{len(parts), c})
					}
					parts = append(parts, p)
				}
			}
		}
	}
	writers := make([]*flate.Writer, max(workers, 1)) // one per goroutine, reset for each chunk
	err := forEach(len(jobs), workers, func(wk, k int) error {
		p, c := parts[jobs[k].part], jobs[k].chunk
		raw := p.raw[c*LosslessChunk : min(len(p.raw), (c+1)*LosslessChunk)]
		var buf bytes.Buffer
		buf.Grow(len(raw)*3/4 + 64)
		w := writers[wk]
		if w == nil {
			var err error
			if w, err = flate.NewWriter(&buf, flate.HuffmanOnly); err != nil {
				return err
			}
			writers[wk] = w
		} else {
			w.Reset(&buf)
		}
		if _, err := w.Write(raw); err != nil {
			return err
		}
		if err := w.Close(); err != nil {
			return err
		}
		p.coded[c] = buf.Bytes()
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	byName := map[string]*codedPart{}
	for _, p := range parts {
		byName[p.tensor+p.suffix] = p
	}
	out := make([][]safetensors.Tensor, len(stored))
	coded := make([][]string, len(stored))
	for i, ts := range stored {
		for _, t := range ts {
			p := byName[t.Name]
			if p == nil {
				out[i] = append(out[i], t)
				continue
			}
			size := 8 * len(p.coded)
			for _, b := range p.coded {
				size += len(b)
			}
			if size >= len(p.raw) { // coding does not pay: keep the part as it is
				out[i] = append(out[i], t)
				continue
			}
			data := make([]byte, 0, size-8*len(p.coded))
			offsets := make([]byte, 8*len(p.coded))
			for c, b := range p.coded {
				data = append(data, b...)
				binary.LittleEndian.PutUint64(offsets[8*c:], uint64(len(data)))
			}
			out[i] = append(out[i],
				safetensors.Tensor{Name: t.Name, DType: safetensors.U8, Shape: []int{len(data)}, Data: data},
				safetensors.Tensor{Name: t.Name + ChunksSuffix, DType: safetensors.U64, Shape: []int{len(p.coded)}, Data: offsets})
			coded[i] = append(coded[i], p.suffix)
		}
	}
	return out, coded, nil
}

// inflateStored returns a view of f in which every coded part of the
// tensors in infos is decoded to its raw bytes (rawSize gives each part's
// declared size), checking offsets, sizes and streams first.
func inflateStored(f *safetensors.File, infos []TensorInfo, rawSize func(ti TensorInfo, suffix string) (int, error), workers int) (*safetensors.File, error) {
	type part struct {
		name    string
		suffix  string
		coded   []byte
		offsets []uint64
		raw     []byte
	}
	var parts []*part
	var jobs []chunkJob
	replaced := map[string]*part{}
	drop := map[string]bool{}
	for _, ti := range infos {
		for _, suffix := range ti.Lossless {
			name := ti.Name + suffix
			ct, ot := f.Tensor(name), f.Tensor(name+ChunksSuffix)
			if ct == nil || ot == nil || ct.DType != safetensors.U8 || ot.DType != safetensors.U64 {
				return nil, tensorErrorf(ti.Name, "%w: want %s (U8) and %s%s (U64)", ErrLossless, suffix, suffix, ChunksSuffix)
			}
			size, err := rawSize(ti, suffix)
			if err != nil {
				return nil, &TensorError{Tensor: ti.Name, Err: err}
			}
			n := 0
			if size > 0 {
				n = (size-1)/LosslessChunk + 1
			}
			if len(ot.Data) != 8*n {
				return nil, tensorErrorf(ti.Name, "%w: %s%s holds %d offsets, want %d for %d bytes", ErrLossless, suffix, ChunksSuffix, len(ot.Data)/8, n, size)
			}
			offsets, err := chunkOffsets(ti.Name, suffix, ot.Data, len(ct.Data), n,
				func(c int) int { return min(LosslessChunk, size-c*LosslessChunk) }, maxInflation, ErrLossless, "bytes")
			if err != nil {
				return nil, err
			}
			p := &part{name: name, suffix: suffix, coded: ct.Data, offsets: offsets}
			for c := 0; c < n; c++ {
				jobs = append(jobs, chunkJob{len(parts), c})
			}
			p.raw = make([]byte, size) // at most maxInflation times the coded bytes, checked above
			parts = append(parts, p)
			replaced[name] = p
			drop[name+ChunksSuffix] = true
		}
	}
	readers := make([]io.ReadCloser, max(workers, 1)) // one per goroutine, reset for each chunk
	err := forEach(len(jobs), workers, func(wk, k int) error {
		p, c := parts[jobs[k].part], jobs[k].chunk
		var begin uint64
		if c > 0 {
			begin = p.offsets[c-1]
		}
		dst := p.raw[c*LosslessChunk : min(len(p.raw), (c+1)*LosslessChunk)]
		in := bytes.NewReader(p.coded[begin:p.offsets[c]])
		r := readers[wk]
		if r == nil {
			r = flate.NewReader(in)
			readers[wk] = r
		} else if err := r.(flate.Resetter).Reset(in, nil); err != nil {
			return tensorErrorf(p.name, "%w: chunk %d: %v", ErrLossless, c, err)
		}
		if _, err := io.ReadFull(r, dst); err != nil {
			return tensorErrorf(p.name, "%w: chunk %d: %v", ErrLossless, c, err)
		}
		var one [1]byte
		if n, err := r.Read(one[:]); n != 0 || err != io.EOF {
			return tensorErrorf(p.name, "%w: chunk %d inflates beyond its declared %d bytes", ErrLossless, c, len(dst))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := &safetensors.File{Metadata: f.Metadata}
	for _, t := range f.Tensors {
		switch p := replaced[t.Name]; {
		case p != nil && p.suffix == CodesSuffix:
			out.Tensors = append(out.Tensors, safetensors.Tensor{Name: t.Name, DType: safetensors.U8, Shape: []int{len(p.raw)}, Data: p.raw})
		case p != nil: // scales, zero points
			out.Tensors = append(out.Tensors, safetensors.Tensor{Name: t.Name, DType: safetensors.F16, Shape: []int{len(p.raw) / 2}, Data: p.raw})
		case !drop[t.Name]:
			out.Tensors = append(out.Tensors, t)
		}
	}
	return out, nil
}

// chunkOffsets reads a coded part's table of chunk end offsets (n of
// them, little-endian U64) and checks them before anything is allocated:
// ascending, within the coded bytes, ending exactly at its end, and each
// chunk able to hold what it claims (rawOf(c) units of "what", at most
// inflation per coded byte). Shared by the lossless and the wire stage.
func chunkOffsets(tensor, suffix string, table []byte, coded int, n int, rawOf func(c int) int, inflation uint64,
	kind error, what string) ([]uint64, error) {
	offsets := make([]uint64, n)
	var prev uint64
	for c := 0; c < n; c++ {
		end := binary.LittleEndian.Uint64(table[8*c:])
		if end <= prev || end > uint64(coded) {
			return nil, tensorErrorf(tensor, "%w: %s chunk %d: offset %d not ascending or past the %d coded bytes", kind, suffix, c, end, coded)
		}
		if raw := rawOf(c); uint64(raw) > inflation*(end-prev) {
			return nil, tensorErrorf(tensor, "%w: %s chunk %d: %d coded bytes cannot hold %d %s", kind, suffix, c, end-prev, raw, what)
		}
		offsets[c], prev = end, end
	}
	if prev != uint64(coded) {
		return nil, tensorErrorf(tensor, "%w: %s has %d bytes after its last chunk", kind, suffix, uint64(coded)-prev)
	}
	return offsets, nil
}
