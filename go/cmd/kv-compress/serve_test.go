package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvlib/pkg/safetensors"
)

// frames encodes requests as the client sends them.
func frames(t testing.TB, reqs ...any) []byte {
	var b bytes.Buffer
	for _, r := range reqs {
		if raw, ok := r.([]byte); ok {
			b.Write(raw)
			continue
		}
		if err := writeFrame(&b, r); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

func replies(t *testing.T, out []byte) []Response {
	t.Helper()
	var rs []Response
	r := bytes.NewReader(out)
	for {
		b, err := readFrame(r)
		if err != nil {
			return rs
		}
		var resp Response
		if err := json.Unmarshal(b, &resp); err != nil {
			t.Fatal(err)
		}
		rs = append(rs, resp)
	}
}

// segmentOf lays the tensors of a safetensors file out in a shared file as
// the client does (64-byte aligned) and returns the refs and the segment.
func segmentOf(t *testing.T, f *safetensors.File, path string) ([]TensorRef, Segment) {
	t.Helper()
	var refs []TensorRef
	var data []byte
	for _, tn := range f.Tensors {
		for len(data)%64 != 0 {
			data = append(data, 0)
		}
		refs = append(refs, TensorRef{tn.Name, string(tn.DType), tn.Shape, len(data)})
		data = append(data, tn.Data...)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return refs, Segment{Path: path, Size: len(data)}
}

func emptySegment(t testing.TB, path string, size int) Segment {
	if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	return Segment{Path: path, Size: size}
}

// The server's reconstructions and reports equal the file command's, for
// several schemes in one request, F32 and F16; a bad request in between is
// answered and the server goes on.
func TestServeMatchesRoundtripCommand(t *testing.T) {
	dir := t.TempDir()
	in := writeCache(t, dir)
	src, err := safetensors.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	f16 := &safetensors.File{}
	for _, tn := range src.Tensors {
		x, _ := tn.Float32s(nil)
		h, _ := safetensors.NewFloatTensor(tn.Name, safetensors.F16, tn.Shape, x)
		f16.Tensors = append(f16.Tensors, h)
	}
	in16 := filepath.Join(dir, "kv16.safetensors")
	if err := safetensors.WriteFile(in16, f16); err != nil {
		t.Fatal(err)
	}
	schemes := [][]string{{"-scheme", "int4"}, {"-scheme", "kivi2"}, {"-scheme", "q8_0", "-lossless"}}
	for _, file := range []string{in, in16} {
		f, _ := safetensors.ReadFile(file)
		refs, seg := segmentOf(t, f, filepath.Join(dir, "shm-in"))
		var jobs []SchemeJob
		for i, a := range schemes {
			jobs = append(jobs, SchemeJob{a, emptySegment(t, filepath.Join(dir, "shm-out"+string(rune('0'+i))), seg.Size)})
		}
		bad := Request{ID: 2, Op: "roundtrip", Input: seg, Tensors: refs, Schemes: []SchemeJob{{[]string{"-scheme", "int9"}, jobs[0].Output}}}
		good := Request{ID: 3, Op: "roundtrip", Input: seg, Metadata: f.Metadata, Tensors: refs, Schemes: jobs}
		var out, errb bytes.Buffer
		stdin = bytes.NewReader(frames(t, Request{ID: 1, Op: "ping"}, bad, good))
		if code := run([]string{"serve"}, &out, &errb); code != 0 {
			t.Fatalf("serve exit %d: %s", code, errb.String())
		}
		rs := replies(t, out.Bytes())
		if len(rs) != 3 || rs[0].ID != 1 || rs[0].Error != "" || rs[1].ID != 2 || !strings.Contains(rs[1].Error, "schemes[0].args") {
			t.Fatalf("replies %+v", rs)
		}
		if rs[2].Error != "" || len(rs[2].Results) != len(schemes) {
			t.Fatalf("roundtrip reply: %+v", rs[2])
		}
		for i, a := range schemes {
			rt := filepath.Join(dir, "rt.safetensors")
			code, js, stderr := runCLI(append([]string{"roundtrip", "-input", file, "-output", rt}, a...)...)
			if code > 1 {
				t.Fatal(stderr)
			}
			want, _ := safetensors.ReadFile(rt)
			got, _ := os.ReadFile(jobs[i].Output.Path)
			for k, tn := range want.Tensors {
				if !bytes.Equal(got[refs[k].Offset:refs[k].Offset+len(tn.Data)], tn.Data) {
					t.Errorf("%s %v: tensor %s differs from the file command's", file, a, tn.Name)
				}
			}
			var w map[string]any
			_ = json.Unmarshal([]byte(js), &w)
			gb, _ := json.Marshal(rs[2].Results[i])
			var g map[string]any
			_ = json.Unmarshal(gb, &g)
			for _, k := range []string{"input", "output", "codec_time_ms", "processing_time_ms"} {
				delete(w, k)
				delete(g, k)
			}
			wb, _ := json.Marshal(w)
			gb, _ = json.Marshal(g)
			if !bytes.Equal(wb, gb) {
				t.Errorf("%s %v: report differs from the file command's:\n serve %.300s\n  file %.300s", file, a, gb, wb)
			}
		}
	}
}

func TestServeBadRequests(t *testing.T) {
	dir := t.TempDir()
	seg := emptySegment(t, filepath.Join(dir, "in"), 4096)
	ref := TensorRef{"layer_0_key", "F32", []int{1, 1, 4, 64}, 0}
	job := SchemeJob{[]string{"-scheme", "int4"}, seg}
	cases := []struct {
		req  any
		want string
	}{
		{[]byte("\x05\x00\x00\x00hello"), "not a request"},
		{Request{ID: 5, Op: "fly"}, "unknown operation"},
		{Request{ID: 6, Op: "roundtrip", Input: seg, Schemes: []SchemeJob{job}}, "tensors: none given"},
		{Request{ID: 7, Op: "roundtrip", Input: seg, Tensors: []TensorRef{ref}}, "schemes: none given"},
		{Request{ID: 8, Op: "roundtrip", Input: seg, Tensors: []TensorRef{{"x", "I8", []int{4}, 0}}, Schemes: []SchemeJob{job}}, "not F32, F16 or BF16"},
		{Request{ID: 9, Op: "roundtrip", Input: seg, Tensors: []TensorRef{{"x", "F32", []int{1, 1, 8, 64}, 3072}}, Schemes: []SchemeJob{job}}, "do not fit"},
		{Request{ID: 10, Op: "roundtrip", Input: seg, Tensors: []TensorRef{{"x", "F32", []int{-1, 64}, 0}}, Schemes: []SchemeJob{job}}, "not a valid size"},
		{Request{ID: 11, Op: "roundtrip", Input: Segment{Path: filepath.Join(dir, "gone"), Size: 4096}, Tensors: []TensorRef{ref}, Schemes: []SchemeJob{job}}, "input.path"},
		{Request{ID: 12, Op: "roundtrip", Input: seg, Tensors: []TensorRef{ref}, Schemes: []SchemeJob{{job.Args, Segment{Path: seg.Path, Size: 64}}}}, "output.size"},
		{Request{ID: 13, Op: "roundtrip", Input: Segment{Path: seg.Path, Size: 1 << 20}, Tensors: []TensorRef{ref}, Schemes: []SchemeJob{{job.Args, Segment{Path: seg.Path, Size: 1 << 20}}}}, "holds 4096 bytes"},
	}
	var reqs []any
	for _, c := range cases {
		reqs = append(reqs, c.req)
	}
	var out, errb bytes.Buffer
	if code := serve(bytes.NewReader(frames(t, reqs...)), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	rs := replies(t, out.Bytes())
	if len(rs) != len(cases) {
		t.Fatalf("%d replies to %d requests", len(rs), len(cases))
	}
	for i, c := range cases {
		if !strings.Contains(rs[i].Error, c.want) || strings.Contains(rs[i].Error, "\n") {
			t.Errorf("case %d: error %q, want %q", i, rs[i].Error, c.want)
		}
	}
}

// A broken frame stops the server with one line; nothing after it is read.
func TestServeBrokenFrames(t *testing.T) {
	huge := make([]byte, 4)
	binary.LittleEndian.PutUint32(huge, MaxFrame+1)
	for _, tc := range []struct {
		in   []byte
		want string
	}{
		{[]byte{1, 0}, "truncated length prefix"},
		{[]byte{9, 0, 0, 0, '{', '}'}, "truncated: 9 bytes announced"},
		{huge, "exceeds"},
	} {
		var out, errb bytes.Buffer
		if code := serve(bytes.NewReader(tc.in), &out, &errb); code != exitError {
			t.Errorf("%q: exit %d", tc.in, code)
		}
		if msg := errb.String(); !strings.Contains(msg, tc.want) || strings.Count(msg, "\n") != 1 {
			t.Errorf("%q: stderr %q, want %q", tc.in, msg, tc.want)
		}
	}
}

// FuzzServeFrames feeds arbitrary bytes as the request stream: the server
// answers or stops, never panics, and writes only whole frames.
func FuzzServeFrames(f *testing.F) {
	dir := f.TempDir()
	seg := emptySegment(f, filepath.Join(dir, "in"), 4096)
	f.Add(frames(f, Request{ID: 1, Op: "ping"}))
	f.Add(frames(f, Request{ID: 2, Op: "roundtrip", Input: seg, Tensors: []TensorRef{{"layer_0_key", "F32", []int{1, 1, 4, 64}, 0}},
		Schemes: []SchemeJob{{[]string{"-scheme", "q4_0"}, seg}}}))
	f.Add([]byte{3, 0, 0, 0, '[', '1', ']'})
	f.Fuzz(func(t *testing.T, b []byte) {
		var out, errb bytes.Buffer
		serve(bytes.NewReader(b), &out, &errb)
		r := bytes.NewReader(out.Bytes())
		for r.Len() > 0 {
			fb, err := readFrame(r)
			if err != nil {
				t.Fatalf("a partial reply frame: %v", err)
			}
			var resp Response
			if err := json.Unmarshal(fb, &resp); err != nil {
				t.Fatalf("a reply that is not JSON: %v", err)
			}
		}
	})
}

// A new segment at a path and size an earlier one had (the client closed a
// descriptor and its number was reused) is mapped anew when its generation
// differs, not read through the stale mapping.
func TestServeRemapsANewGeneration(t *testing.T) {
	dir := t.TempDir()
	f, err := safetensors.ReadFile(writeCache(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "shm-in")
	refs, seg := segmentOf(t, f, path)
	out := emptySegment(t, filepath.Join(dir, "shm-out"), seg.Size)
	job := []SchemeJob{{[]string{"-scheme", "int4"}, out}}
	first := Request{ID: 1, Op: "roundtrip", Input: Segment{Path: path, Size: seg.Size, Gen: 1}, Tensors: refs, Schemes: job}
	// The same path and size, other bytes (a new file, as a new memfd would be).
	data, _ := os.ReadFile(path)
	for i := range data {
		data[i] = 0
	}
	second := first
	second.ID, second.Input.Gen = 2, 2
	var buf, errb bytes.Buffer
	stdin = &replaceAfter{r: bytes.NewReader(frames(t, first, second)), after: 4 + len(mustJSON(t, first)), do: func() {
		_ = os.Remove(path)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}}
	if code := run([]string{"serve"}, &buf, &errb); code != 0 {
		t.Fatalf("serve exit %d: %s", code, errb.String())
	}
	rs := replies(t, buf.Bytes())
	if len(rs) != 2 || rs[0].Error != "" || rs[1].Error != "" {
		t.Fatalf("replies %+v", rs)
	}
	got, _ := os.ReadFile(out.Path)
	for _, b := range got {
		if b != 0 {
			t.Fatal("the second request read the first generation's bytes through a stale mapping")
		}
	}
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// replaceAfter runs do when the server asks for more than the first `after`
// bytes (the first frame, answered by then): the second request finds the
// input file replaced.
type replaceAfter struct {
	r     io.Reader
	after int
	n     int
	do    func()
}

func (x *replaceAfter) Read(p []byte) (int, error) {
	if x.n == x.after && x.do != nil {
		x.do()
		x.do = nil
	}
	if x.n < x.after && len(p) > x.after-x.n {
		p = p[:x.after-x.n]
	}
	n, err := x.r.Read(p)
	x.n += n
	return n, err
}
