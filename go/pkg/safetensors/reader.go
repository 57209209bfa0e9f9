package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
)

// MaxHeaderSize bounds the JSON header, as the reference implementation does.
const MaxHeaderSize = 100 << 20

// MetadataKey is the reserved header entry holding the string metadata.
const MetadataKey = "__metadata__"

type headerEntry struct {
	DType       DType    `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets []uint64 `json:"data_offsets"`
}

// ReadFile reads and validates a whole safetensors file. Errors start with
// the path and name the tensor at fault.
func ReadFile(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Parse decodes a safetensors file held in data. The tensors' Data slices
// alias data. Every length, offset, dtype and shape is checked.
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

	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(header))
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("invalid header JSON: %v", err)
	}
	if raw == nil {
		return nil, errors.New("invalid header JSON: not an object")
	}
	if rest := bytes.TrimRight(header[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return nil, errors.New("invalid header JSON: trailing data after the object")
	}

	f := &File{}
	if m, ok := raw[MetadataKey]; ok {
		if err := json.Unmarshal(m, &f.Metadata); err != nil {
			return nil, fmt.Errorf("invalid %s: want an object of strings: %v", MetadataKey, err)
		}
		delete(raw, MetadataKey)
	}

	type span struct {
		begin, end uint64
		tensor     Tensor
	}
	spans := make([]span, 0, len(raw))
	for name, msg := range raw {
		var e headerEntry
		dec := json.NewDecoder(bytes.NewReader(msg))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil {
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
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].begin != spans[j].begin {
			return spans[i].begin < spans[j].begin
		}
		return spans[i].end < spans[j].end
	})
	for i := 1; i < len(spans); i++ {
		if spans[i].begin < spans[i-1].end {
			return nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] overlap tensor %q [%d, %d]",
				spans[i].tensor.Name, spans[i].begin, spans[i].end, spans[i-1].tensor.Name, spans[i-1].begin, spans[i-1].end)
		}
	}
	f.Tensors = make([]Tensor, len(spans))
	for i, s := range spans {
		f.Tensors[i] = s.tensor
	}
	return f, nil
}
