package compression

import "fmt"

// A TensorError is an error about one tensor, of a cache or of a
// compressed file: callers find the tensor with errors.As, and what went
// wrong (ErrNotFinite, ErrScaleOverflow, ErrLossless, a *GroupError) with
// errors.Is and errors.As on Err.
type TensorError struct {
	Tensor string
	Err    error
}

func (e *TensorError) Error() string { return fmt.Sprintf("tensor %q: %v", e.Tensor, e.Err) }

func (e *TensorError) Unwrap() error { return e.Err }

// tensorErrorf is a *TensorError about tensor name, its Err made by fmt.Errorf.
func tensorErrorf(name, format string, a ...any) error {
	return &TensorError{Tensor: name, Err: fmt.Errorf(format, a...)}
}

// A GroupError is an error about one group (or ggml block) of a tensor's
// stored form, by its index in the tensor; a *TensorError holds it.
type GroupError struct {
	Group int
	Err   error
}

func (e *GroupError) Error() string { return fmt.Sprintf("group %d: %v", e.Group, e.Err) }

func (e *GroupError) Unwrap() error { return e.Err }
