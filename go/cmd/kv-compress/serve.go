package main

// kv-compress serve: the codec as a long-lived process, so a validation pays
// no process start, no file writes and no parsing per round trip.
//
// Frames on stdin and stdout: a 4-byte little-endian length, then that many
// bytes of JSON. The tensors do not cross the pipe: a request names a shared
// memory file (a memfd as /proc/PID/fd/N, or a file under /dev/shm) and where
// each tensor lies in it, and each scheme's reconstruction is written into
// the output file the client sized for it, at the same offsets. The reply is
// the JSON report the file command 'roundtrip' prints, one per scheme, from
// the same code. A bad request is answered with an error and the server
// waits for the next; a frame that cannot be read (truncated, oversized) or
// the end of stdin ends it.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"kvlib/pkg/compression"
	"kvlib/pkg/safetensors"
)

// MaxFrame bounds a frame's JSON (the tensors are not in it).
const MaxFrame = 16 << 20

// FrameError is a frame that cannot be read: the stream is out of step and
// the server stops.
type FrameError struct{ Msg string }

func (e *FrameError) Error() string { return "frame: " + e.Msg }

// RequestError is a request that cannot be served; the server answers it
// and goes on. Field names what is wrong (e.g. "tensors[3].offset").
type RequestError struct {
	Field, Msg string
}

func (e *RequestError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

// Segment is a shared memory file and its size in bytes.
type Segment struct {
	Path string `json:"path"`
	Size int    `json:"size"`
	// Gen tells apart segments that come to have the same path and size (a
	// closed descriptor's number reused): a mapping is reused only for the
	// same generation.
	Gen uint64 `json:"gen,omitempty"`
}

// TensorRef places one tensor in the input segment (and each output).
type TensorRef struct {
	Name   string `json:"name"`
	DType  string `json:"dtype"`
	Shape  []int  `json:"shape"`
	Offset int    `json:"offset"`
}

// SchemeJob is one scheme to run: the CLI's flags and where its
// reconstruction goes.
type SchemeJob struct {
	Args   []string `json:"args"`
	Output Segment  `json:"output"`
}

// Request asks for the round trip of one cache through several schemes.
type Request struct {
	ID       int64             `json:"id"`
	Op       string            `json:"op"` // "roundtrip" or "ping"
	Input    Segment           `json:"input"`
	Metadata map[string]string `json:"metadata,omitempty"` // the source's, as a saved file's header holds it
	Tensors  []TensorRef       `json:"tensors"`
	Schemes  []SchemeJob       `json:"schemes"`
}

// Response answers a request: a report per scheme, or one error.
type Response struct {
	ID      int64                 `json:"id"`
	Results []*compression.Report `json:"results,omitempty"`
	Error   string                `json:"error,omitempty"`
}

// readFrame reads one frame; io.EOF at a frame boundary is a clean end.
func readFrame(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if err == io.EOF {
			return nil, io.EOF
		}
		return nil, &FrameError{"truncated length prefix"}
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n > MaxFrame {
		return nil, &FrameError{fmt.Sprintf("length %d exceeds %d", n, MaxFrame)}
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, &FrameError{fmt.Sprintf("truncated: %d bytes announced", n)}
	}
	return b, nil
}

func writeFrame(w io.Writer, v any) error {
	js, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var hdr [4]byte
	binary.LittleEndian.PutUint32(hdr[:], uint32(len(js)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err = w.Write(js)
	return err
}

// decodeRequest parses and checks a request against itself (not yet the files).
func decodeRequest(b []byte) (*Request, error) {
	var q Request
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&q); err != nil {
		return nil, &RequestError{"", fmt.Sprintf("not a request: %v", err)}
	}
	switch q.Op {
	case "ping":
		return &q, nil
	case "roundtrip":
	default:
		return &q, &RequestError{"op", fmt.Sprintf("unknown operation %q", q.Op)}
	}
	if len(q.Tensors) == 0 {
		return &q, &RequestError{"tensors", "none given"}
	}
	if len(q.Schemes) == 0 {
		return &q, &RequestError{"schemes", "none given"}
	}
	for i, t := range q.Tensors {
		if err := checkRef(t, q.Input.Size); err != nil {
			return &q, &RequestError{fmt.Sprintf("tensors[%d] (%s)", i, t.Name), err.Error()}
		}
	}
	for i, s := range q.Schemes {
		if s.Output.Size != q.Input.Size {
			return &q, &RequestError{fmt.Sprintf("schemes[%d].output.size", i),
				fmt.Sprintf("%d bytes, the input segment has %d", s.Output.Size, q.Input.Size)}
		}
	}
	return &q, nil
}

// checkRef checks that a tensor's bytes lie inside a segment of size bytes.
func checkRef(t TensorRef, size int) error {
	dt := safetensors.DType(t.DType)
	if !dt.IsFloat() {
		return fmt.Errorf("dtype %q is not F32, F16 or BF16", t.DType)
	}
	n := 1
	for _, d := range t.Shape {
		if d < 0 || (d > 0 && n > (1<<40)/d) {
			return fmt.Errorf("shape %v is not a valid size", t.Shape)
		}
		n *= d
	}
	nb := n * dt.Size()
	if t.Offset < 0 || t.Offset%dt.Size() != 0 || t.Offset > size || nb > size-t.Offset {
		return fmt.Errorf("%d bytes at offset %d do not fit the %d-byte segment", nb, t.Offset, size)
	}
	return nil
}

// mapping is a shared file mapped into this process, kept between requests.
type mapping struct {
	seg  Segment
	data []byte
}

type server struct {
	maps map[string]*mapping // by path
}

// mapSegment maps seg (read-only, or writable), reusing the mapping of an
// earlier request when the file and size are the same.
func (s *server) mapSegment(seg Segment, writable bool, field string) ([]byte, error) {
	key := fmt.Sprintf("%s:%v", seg.Path, writable)
	if m, ok := s.maps[key]; ok && m.seg == seg {
		return m.data, nil
	}
	if m, ok := s.maps[key]; ok {
		_ = syscall.Munmap(m.data)
		delete(s.maps, key)
	}
	if seg.Size <= 0 {
		return nil, &RequestError{field + ".size", fmt.Sprintf("%d is not a size", seg.Size)}
	}
	flag, prot := os.O_RDONLY, syscall.PROT_READ
	if writable {
		flag, prot = os.O_RDWR, syscall.PROT_READ|syscall.PROT_WRITE
	}
	f, err := os.OpenFile(seg.Path, flag, 0)
	if err != nil {
		return nil, &RequestError{field + ".path", err.Error()}
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, &RequestError{field + ".path", err.Error()}
	}
	if !st.Mode().IsRegular() || st.Size() < int64(seg.Size) {
		return nil, &RequestError{field, fmt.Sprintf("%s holds %d bytes, the request says %d", seg.Path, st.Size(), seg.Size)}
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, seg.Size, prot, syscall.MAP_SHARED)
	if err != nil {
		return nil, &RequestError{field, fmt.Sprintf("mmap %s: %v", seg.Path, err)}
	}
	s.maps[key] = &mapping{seg, data}
	return data, nil
}

func (s *server) close() {
	for _, m := range s.maps {
		_ = syscall.Munmap(m.data)
	}
	s.maps = nil
}

// roundtrip runs every scheme of q over the input segment's tensors.
func (s *server) roundtrip(q *Request, stderr io.Writer) ([]*compression.Report, error) {
	in, err := s.mapSegment(q.Input, false, "input")
	if err != nil {
		return nil, err
	}
	src := &safetensors.File{Metadata: q.Metadata}
	for _, t := range q.Tensors {
		dt := safetensors.DType(t.DType)
		n := 1
		for _, d := range t.Shape {
			n *= d
		}
		src.Tensors = append(src.Tensors, safetensors.Tensor{Name: t.Name, DType: dt, Shape: t.Shape,
			Data: in[t.Offset : t.Offset+n*dt.Size() : t.Offset+n*dt.Size()]})
	}
	reps := make([]*compression.Report, len(q.Schemes))
	for i, job := range q.Schemes {
		field := fmt.Sprintf("schemes[%d]", i)
		c, err := parseFlags("roundtrip", job.Args, stderr, quantizeFlags|runFlags)
		if err != nil {
			return nil, &RequestError{field + ".args", err.Error()}
		}
		out, err := s.mapSegment(job.Output, true, field+".output")
		if err != nil {
			return nil, err
		}
		start := time.Now()
		res, err := compression.Compress(src, c.cfg)
		if err != nil {
			return nil, &RequestError{field, err.Error()}
		}
		codec := time.Since(start) // as the file command times it: the codec alone
		for k, t := range res.Restored.Tensors {
			copy(out[q.Tensors[k].Offset:], t.Data)
		}
		rep := res.Report
		rep.CodecTimeMS = ms(codec)
		rep.Command, rep.Input, rep.Output = "roundtrip", q.Input.Path, job.Output.Path
		rep.ProcessingTimeMS = ms(time.Since(start))
		reps[i] = rep
	}
	return reps, nil
}

// handle serves one request; a panic becomes its error, not the server's end.
func (s *server) handle(b []byte, stderr io.Writer) (resp Response) {
	defer func() {
		if r := recover(); r != nil {
			resp.Results, resp.Error = nil, fmt.Sprintf("internal error: %v", r)
		}
	}()
	q, err := decodeRequest(b)
	if q != nil {
		resp.ID = q.ID
	}
	if err == nil && q.Op == "roundtrip" {
		resp.Results, err = s.roundtrip(q, stderr)
	}
	if err != nil {
		resp.Error = oneLine(err.Error())
	}
	return resp
}

func oneLine(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '\n' || c == '\r' {
			b[i] = ' '
		}
	}
	return string(b)
}

// serve answers frames from r on w until r ends (0) or a frame is broken (2).
func serve(r io.Reader, w io.Writer, stderr io.Writer) int {
	s := &server{maps: map[string]*mapping{}}
	defer s.close()
	in := bufio.NewReader(r)
	out := bufio.NewWriter(w)
	for {
		b, err := readFrame(in)
		if errors.Is(err, io.EOF) {
			return exitOK
		}
		if err != nil {
			fmt.Fprintf(stderr, "kv-compress serve: %v: stopping\n", err)
			return exitError
		}
		if err := writeFrame(out, s.handle(b, stderr)); err == nil {
			err = out.Flush()
		}
		if err != nil {
			fmt.Fprintf(stderr, "kv-compress serve: writing a reply: %v: stopping\n", err)
			return exitError
		}
	}
}
