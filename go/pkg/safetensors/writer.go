package safetensors

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Encode writes f in safetensors form to w: tensors in slice order, data
// contiguous, the header padded with spaces to a multiple of 8 bytes.
func Encode(w io.Writer, f *File) error {
	header, err := encodeHeader(f)
	if err != nil {
		return err
	}
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(header)))
	if _, err := w.Write(lenBuf[:]); err != nil {
		return err
	}
	if _, err := w.Write(header); err != nil {
		return err
	}
	for i := range f.Tensors {
		if _, err := w.Write(f.Tensors[i].Data); err != nil {
			return err
		}
	}
	return nil
}

func encodeHeader(f *File) ([]byte, error) {
	var b strings.Builder
	b.WriteByte('{')
	first := true
	comma := func() {
		if !first {
			b.WriteByte(',')
		}
		first = false
	}
	if len(f.Metadata) > 0 {
		m, err := json.Marshal(f.Metadata)
		if err != nil {
			return nil, err
		}
		comma()
		b.WriteString(`"` + MetadataKey + `":`)
		b.Write(m)
	}
	seen := make(map[string]bool, len(f.Tensors))
	var offset uint64
	for i := range f.Tensors {
		t := &f.Tensors[i]
		if t.Name == MetadataKey || seen[t.Name] {
			return nil, fmt.Errorf("tensor %q: duplicate or reserved name", t.Name)
		}
		seen[t.Name] = true
		if t.DType.Size() == 0 {
			return nil, fmt.Errorf("tensor %q: unknown dtype %q", t.Name, t.DType)
		}
		if want := t.NumElements() * t.DType.Size(); want != len(t.Data) {
			return nil, fmt.Errorf("tensor %q: shape %v of %s needs %d bytes, have %d", t.Name, t.Shape, t.DType, want, len(t.Data))
		}
		name, _ := json.Marshal(t.Name)
		shape, _ := json.Marshal(t.Shape)
		if t.Shape == nil {
			shape = []byte("[]")
		}
		end := offset + uint64(len(t.Data))
		comma()
		fmt.Fprintf(&b, `%s:{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}`, name, t.DType, shape, offset, end)
		offset = end
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	return []byte(b.String()), nil
}

// WriteFile writes f to path atomically: it writes a temporary file in the
// same directory, syncs it and renames it over path, so a failure never
// leaves a partial file at path. The file gets mode 0666 less the umask,
// as any file a command creates; an existing path that is not a regular
// file (a device, a directory, a pipe) is refused, never replaced.
func WriteFile(path string, f *File) (err error) {
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		return fileErrorf(path, "not a regular file (%s); refusing to replace it", st.Mode().Type())
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fileErrorf(path, "cannot write: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	bw := bufio.NewWriterSize(tmp, 1<<20)
	if err = Encode(bw, f); err != nil {
		return &FileError{Path: path, Err: err}
	}
	if err = bw.Flush(); err != nil {
		return &FileError{Path: path, Err: err}
	}
	if err = tmp.Sync(); err != nil {
		return &FileError{Path: path, Err: err}
	}
	if err = tmp.Close(); err != nil {
		return &FileError{Path: path, Err: err}
	}
	if err = os.Chmod(tmp.Name(), os.FileMode(0o666&^umask())); err != nil {
		return &FileError{Path: path, Err: err}
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return &FileError{Path: path, Err: err}
	}
	return nil
}

// EncodedSize is the number of bytes Encode would write for f.
func EncodedSize(f *File) (int64, error) {
	header, err := encodeHeader(f)
	if err != nil {
		return 0, err
	}
	n := int64(8 + len(header))
	for i := range f.Tensors {
		n += int64(len(f.Tensors[i].Data))
	}
	return n, nil
}
