//go:build unix

package safetensors

import "syscall"

// umask is the process's file mode creation mask. Reading it means
// setting it, so it is put straight back.
func umask() uint32 {
	m := syscall.Umask(0)
	syscall.Umask(m)
	return uint32(m)
}
