// Package safetensors reads and writes the safetensors file format: an
// 8-byte little-endian header length, a JSON header that maps tensor names
// to dtype, shape and byte offsets (plus an optional "__metadata__" map of
// strings), then the raw little-endian tensor bytes.
//
// Reading validates everything a hostile file could get wrong (lengths,
// offsets, overlaps, dtypes, shapes) and reports it as an error naming the
// tensor; writing is atomic (temp file in the same directory, then rename).
package safetensors
