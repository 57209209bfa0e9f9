// Package compression implements kvq, a symmetric per-group integer
// quantizer for KV caches, its bit-packed safetensors layout, and the
// quality metrics (RMSE, SNR, cosine, max error) of a reconstruction.
//
// The arithmetic, bit-exact with the NumPy reference in the repository's
// tests: groups are runs of GroupSize consecutive elements of the tensor
// flattened row-major (the last may be shorter). Per group, in float32,
//
//	scale = max|x| / (2^(b-1) - 1), stored as FP16 (round to nearest even)
//	s     = float32(fp16 scale)
//	q     = clamp(roundHalfEven(x / s), -2^(b-1), 2^(b-1) - 1), 0 where s = 0
//	x'    = q * s
//
// The other schemes (asym, the channel axis, rotation, outliers, residual
// tokens, the ggml block types) are documented in their files. Their inner
// loops are in kernels.go; on amd64 with AVX2, kernels_amd64.s runs them 8
// values at a time with the same IEEE operations in the same order, so the
// results are bit-identical to the Go loops, which define them, run on
// every other CPU, and serve as the tests' oracle.
package compression
