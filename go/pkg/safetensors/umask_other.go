//go:build !unix

package safetensors

// umask is the usual default where there is none to read.
func umask() uint32 { return 0o022 }
