package safetensors

import "fmt"

// DType is a safetensors element type, spelled as in the header ("F32", ...).
type DType string

// The dtypes this package knows. Only F32, F16 and BF16 convert to float32.
const (
	F64  DType = "F64"
	F32  DType = "F32"
	F16  DType = "F16"
	BF16 DType = "BF16"
	I64  DType = "I64"
	I32  DType = "I32"
	I16  DType = "I16"
	I8   DType = "I8"
	U64  DType = "U64"
	U32  DType = "U32"
	U16  DType = "U16"
	U8   DType = "U8"
	Bool DType = "BOOL"
)

var dtypeSizes = map[DType]int{
	F64: 8, F32: 4, F16: 2, BF16: 2,
	I64: 8, I32: 4, I16: 2, I8: 1,
	U64: 8, U32: 4, U16: 2, U8: 1, Bool: 1,
}

// Size returns the size in bytes of one element, or 0 for an unknown dtype.
func (d DType) Size() int { return dtypeSizes[d] }

// IsFloat reports whether tensors of this dtype convert to float32.
func (d DType) IsFloat() bool { return d == F32 || d == F16 || d == BF16 }

// Tensor is one named tensor: its dtype, its shape and its raw bytes.
type Tensor struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte
}

// NumElements is the product of the shape (1 for a scalar).
func (t *Tensor) NumElements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// File is a whole safetensors file held in memory. Tensors keep the order
// of their data in the file; Metadata is the header's "__metadata__".
type File struct {
	Metadata map[string]string
	Tensors  []Tensor
}

// Tensor returns the tensor called name, or nil.
func (f *File) Tensor(name string) *Tensor {
	for i := range f.Tensors {
		if f.Tensors[i].Name == name {
			return &f.Tensors[i]
		}
	}
	return nil
}

// Float32s decodes a float tensor (F32, F16 or BF16) into dst, which must
// hold NumElements values, or into a new slice when dst is nil.
func (t *Tensor) Float32s(dst []float32) ([]float32, error) {
	n := t.NumElements()
	if dst == nil {
		dst = make([]float32, n)
	}
	if len(dst) != n {
		return nil, fmt.Errorf("tensor %q: destination holds %d values, tensor has %d", t.Name, len(dst), n)
	}
	if !t.DType.IsFloat() {
		return nil, fmt.Errorf("tensor %q: dtype %s is not a float type (want F32, F16 or BF16)", t.Name, t.DType)
	}
	if len(t.Data) != n*t.DType.Size() {
		return nil, fmt.Errorf("tensor %q: %d bytes for %d %s elements", t.Name, len(t.Data), n, t.DType)
	}
	DecodeFloat32s(dst, t.Data, t.DType)
	return dst, nil
}

// NewFloatTensor encodes float32 values as a tensor of dtype dt (F32, F16 or
// BF16; the narrower types round to nearest even).
func NewFloatTensor(name string, dt DType, shape []int, values []float32) (Tensor, error) {
	if !dt.IsFloat() {
		return Tensor{}, fmt.Errorf("tensor %q: dtype %s is not a float type", name, dt)
	}
	t := Tensor{Name: name, DType: dt, Shape: append([]int(nil), shape...)}
	if t.NumElements() != len(values) {
		return Tensor{}, fmt.Errorf("tensor %q: shape %v holds %d elements, got %d values", name, shape, t.NumElements(), len(values))
	}
	t.Data = make([]byte, len(values)*dt.Size())
	EncodeFloat32s(t.Data, values, dt)
	return t, nil
}

// A FileError is an error about the file at Path: reading or writing it,
// or what its contents hold. Its message is the path, ": " and Err's.
type FileError struct {
	Path string
	Err  error
}

func (e *FileError) Error() string { return e.Path + ": " + e.Err.Error() }

func (e *FileError) Unwrap() error { return e.Err }

// fileErrorf is a *FileError about path, its Err made by fmt.Errorf.
func fileErrorf(path, format string, a ...any) error {
	return &FileError{Path: path, Err: fmt.Errorf(format, a...)}
}
