package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"unicode/utf8"
)

// MaxHeaderSize bounds the JSON header: the reference implementation's
// limit (100,000,000 bytes), so both accept the same files.
const MaxHeaderSize = 100_000_000

// MetadataKey is the reserved header entry holding the string metadata.
const MetadataKey = "__metadata__"

type headerEntry struct {
	DType       DType    `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets []uint64 `json:"data_offsets"`
}

// ReadFile reads and validates a whole safetensors file. Only a regular
// file is read, and only as many bytes as its header declares, so a device
// or a file that grows cannot make it read without end. Errors start with
// the path and name the tensor at fault.
func ReadFile(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fileErrorf(path, "not a regular file (%s)", st.Mode().Type())
	}
	size := st.Size()
	var lenBuf [8]byte
	if _, err := io.ReadFull(fh, lenBuf[:]); err != nil {
		return nil, fileErrorf(path, "truncated: %d bytes, need at least 8 for the header length", size)
	}
	if n := binary.LittleEndian.Uint64(lenBuf[:]); n > MaxHeaderSize {
		return nil, fileErrorf(path, "header length %d exceeds the %d-byte limit", n, MaxHeaderSize)
	} else if n > uint64(size-8) {
		return nil, fileErrorf(path, "truncated: header length %d runs past the end of the %d-byte file", n, size)
	}
	data := make([]byte, size)
	copy(data, lenBuf[:])
	if _, err := io.ReadFull(fh, data[8:]); err != nil {
		return nil, fileErrorf(path, "reading: %v (the file changed while it was read?)", err)
	}
	f, err := Parse(data)
	if err != nil {
		return nil, &FileError{Path: path, Err: err}
	}
	return f, nil
}

// Parse decodes a safetensors file held in data. The tensors' Data slices
// alias data. It follows the reference implementation's rules: a UTF-8
// JSON object, no duplicate keys, metadata values that are strings, and
// tensors that tile the data section exactly (no gaps, nothing after);
// every length, offset, dtype and shape is checked.
func Parse(data []byte) (*File, error) {
	if len(data) < 8 {
		return nil, fmt.Errorf("truncated: %d bytes, need at least 8 for the header length", len(data))
	}
	n := binary.LittleEndian.Uint64(data)
	if n > MaxHeaderSize {
		return nil, fmt.Errorf("header length %d exceeds the %d-byte limit", n, MaxHeaderSize)
	}
	if n > uint64(len(data)-8) {
		return nil, fmt.Errorf("truncated: header length %d runs past the end of the %d-byte file", n, len(data))
	}
	header := data[8 : 8+n]
	body := data[8+n:]
	if !utf8.Valid(header) {
		return nil, errors.New("invalid header: not valid UTF-8")
	}
	if i := loneSurrogate(header); i >= 0 {
		return nil, fmt.Errorf("invalid header JSON: unpaired surrogate escape at byte %d", i)
	}
	entries, err := topLevel(header)
	if err != nil {
		return nil, err
	}
	f := &File{}
	type span struct {
		begin, end uint64
		tensor     Tensor
	}
	spans := make([]span, 0, len(entries))
	for _, kv := range entries {
		name, msg := kv.key, kv.value
		if name == MetadataKey {
			if f.Metadata, err = parseMetadata(msg); err != nil {
				return nil, err
			}
			continue
		}
		var e headerEntry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, fmt.Errorf("tensor %q: invalid header entry: %v", name, err)
		}
		size := e.DType.Size()
		if size == 0 {
			return nil, fmt.Errorf("tensor %q: unknown dtype %q", name, e.DType)
		}
		if len(e.DataOffsets) != 2 {
			return nil, fmt.Errorf("tensor %q: data_offsets must be [begin, end], got %d numbers", name, len(e.DataOffsets))
		}
		begin, end := e.DataOffsets[0], e.DataOffsets[1]
		if begin > end || end > uint64(len(body)) {
			return nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] out of range (data section is %d bytes)", name, begin, end, len(body))
		}
		shape := make([]int, len(e.Shape))
		count := uint64(1)
		for i, d := range e.Shape {
			if d < 0 {
				return nil, fmt.Errorf("tensor %q: negative dimension %d in shape %v", name, d, e.Shape)
			}
			if d > 0 && count > math.MaxInt64/uint64(d) {
				return nil, fmt.Errorf("tensor %q: shape %v overflows", name, e.Shape)
			}
			count *= uint64(d)
			shape[i] = int(d)
		}
		if count > math.MaxInt64/uint64(size) || count*uint64(size) != end-begin {
			return nil, fmt.Errorf("tensor %q: shape %v of %s needs %d bytes, data_offsets give %d", name, e.Shape, e.DType, count*uint64(size), end-begin)
		}
		spans = append(spans, span{begin, end, Tensor{Name: name, DType: e.DType, Shape: shape, Data: body[begin:end:end]}})
	}
	sort.SliceStable(spans, func(i, j int) bool {
		if spans[i].begin != spans[j].begin {
			return spans[i].begin < spans[j].begin
		}
		return spans[i].end < spans[j].end
	})
	var at uint64 // the tensors tile [0, len(body)): each starts where the last ended
	for _, s := range spans {
		if s.begin != at {
			if s.begin < at {
				return nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] overlap the previous tensor (ends at %d)", s.tensor.Name, s.begin, s.end, at)
			}
			return nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] leave a gap of %d bytes before it", s.tensor.Name, s.begin, s.end, s.begin-at)
		}
		at = s.end
	}
	if at != uint64(len(body)) {
		return nil, fmt.Errorf("%d bytes after the last tensor are not covered by any tensor", uint64(len(body))-at)
	}
	f.Tensors = make([]Tensor, len(spans))
	for i, s := range spans {
		f.Tensors[i] = s.tensor
	}
	return f, nil
}

type keyValue struct {
	key   string
	value json.RawMessage
}

// topLevel reads the header's object entry by entry, so that a duplicate
// key is an error rather than silently the last one.
func topLevel(header []byte) ([]keyValue, error) {
	dec := json.NewDecoder(bytes.NewReader(header))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("invalid header JSON: not an object")
	}
	var out []keyValue
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("invalid header JSON: %v", err)
		}
		key := tok.(string) // object keys are strings
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("invalid header JSON: %v", err)
		}
		if seen[key] {
			return nil, fmt.Errorf("invalid header JSON: duplicate key %q", key)
		}
		seen[key] = true
		out = append(out, keyValue{key, v})
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("invalid header JSON: %v", err)
	}
	if rest := bytes.TrimRight(header[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return nil, errors.New("invalid header JSON: trailing data after the object")
	}
	return out, nil
}

// parseMetadata reads "__metadata__": null, or an object of strings.
func parseMetadata(msg json.RawMessage) (map[string]string, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(msg, &raw); err != nil {
		return nil, fmt.Errorf("invalid %s: want an object of strings: %v", MetadataKey, err)
	}
	if raw == nil {
		return nil, nil
	}
	m := make(map[string]string, len(raw))
	for k, v := range raw {
		var s *string
		if err := json.Unmarshal(v, &s); err != nil || s == nil {
			return nil, fmt.Errorf("invalid %s: value of %q is not a string", MetadataKey, k)
		}
		m[k] = *s
	}
	return m, nil
}

// loneSurrogate returns the offset of a \uD800-\uDFFF escape that is not
// a high surrogate followed by a low one, or -1. (encoding/json would turn
// it into U+FFFD; the reference implementation rejects the header.)
func loneSurrogate(h []byte) int {
	hex4 := func(i int) (rune, bool) {
		if i+6 > len(h) || h[i] != '\\' || h[i+1] != 'u' {
			return 0, false
		}
		var r rune
		for _, c := range h[i+2 : i+6] {
			switch {
			case '0' <= c && c <= '9':
				r = r<<4 | rune(c-'0')
			case 'a' <= c && c <= 'f':
				r = r<<4 | rune(c-'a'+10)
			case 'A' <= c && c <= 'F':
				r = r<<4 | rune(c-'A'+10)
			default:
				return 0, false
			}
		}
		return r, true
	}
	for i := 0; i < len(h); i++ {
		if h[i] != '\\' {
			continue
		}
		r, ok := hex4(i)
		if !ok {
			i++ // skip the escaped character (e.g. \\ or \")
			continue
		}
		switch {
		case r >= 0xD800 && r < 0xDC00:
			if lo, ok := hex4(i + 6); ok && lo >= 0xDC00 && lo < 0xE000 {
				i += 11
				continue
			}
			return i
		case r >= 0xDC00 && r < 0xE000:
			return i
		}
		i += 5
	}
	return -1
}
