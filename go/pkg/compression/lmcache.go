package compression

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"

	"kvlib/pkg/safetensors"
)

// LMCache's KV serializers ("serdes"), as LMCache 0.5.6 writes them (the
// wheel lmcache-0.5.6-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64,
// sha256 c7892944…1e4e, _version.py: 0.5.6, commit g3e11e108; paths
// relative to its lmcache/ package; docs/research/lmcache-0.5.6-serdes.md).
// LMCache stores KV caches; it does not attend over them: a serde turns the
// KV chunk object it stores (KV_2LTD, [2, layers, tokens, heads × head_dim]
// in the model's dtype, v1/metadata.py:106-115) into the bytes that go to
// the storage backend, and back when the chunk is retrieved. Two families:
//
//   - the remote backend's serdes, picked by the config key remote_serde
//     (v1/config.py:119, default "naive"; naive_serde/__init__.py:21-41):
//     kivi and cachegen, on KV chunks of chunk_size tokens (v1/config.py:90,
//     default 256);
//   - the L2 adapters' serdes of multiprocess mode, registered by name
//     (v1/distributed/serde/factory.py:32-72): fp8 (fp8.py:103), turboquant
//     and aesgcm.
//
// Not here: naive (the raw tensor: kvlib's none), aesgcm (encryption,
// lossless), turboquant (Triton on CUDA only, not bit-exact off it: the
// research notes), and asym_k16_v8, which 0.5.6 ships as a library
// (v1/distributed/serde/asym_k16_v8.py, v1/kv_codec/asym_k16_v8.py) but
// registers nowhere: the only register_serde_factory calls are fp8.py:103,
// aesgcm.py:180 and turboquant/turboquant.py:900, so no LMCache 0.5.6
// config can select it, and a spec naming it is refused.
var lmcache = &engine{
	name:    "lmcache",
	version: "LMCache 0.5.6 (wheel, commit g3e11e108)",
	flag:    "remote_serde: %s (LMCACHE_REMOTE_SERDE=%s, with a remote_url)",
	mode:    "prefix", // a serde of a stored prefix's cache: CacheGen's bins depend on the model's layer count
	unregistered: map[string]string{
		"asym_k16_v8": "lmcache:asym_k16_v8 is not registered in LMCache 0.5.6: v1/distributed/serde/asym_k16_v8.py is a library " +
			"no config can select (register_serde_factory names only fp8, aesgcm and turboquant)",
	},
	detail: func(f *engineFormat) string {
		switch f.name {
		case "fp8":
			return "executed: LMCache's own v1/distributed/serde/fp8.py (tests/third_party/lmcache056, verbatim from the wheel) " +
				"ran on the vector caches with this CPU torch 2.13 and gave the codec's bytes and reconstruction " +
				"(tests/test_lmcache_formats.py); the cast is torch's, which saturates from torch 2.12 on (CUDA shares the " +
				"conversion header); an older torch gives NaN past 464 instead, not modelled"
		case "kivi":
			return "executed: LMCache's own KIVISerializer and KIVIDeserializer (naive_serde/kivi_serde.py, verbatim) return " +
				"their input unchanged, checked on the vector caches; the bytes are the cache's own, as naive stores them"
		}
		return "executed: LMCache's own CacheGenSerializer and CacheGenDeserializer (the wheel's Python, verbatim in " +
			"tests/third_party/lmcache056: its CPU path, torch and the numba coder, which the wheel's comments align with its " +
			"CUDA kernels) ran on the vector caches and gave the codec's bytes (every bitstream, length, CDF and maximum) and " +
			"its reconstruction bit for bit (tests/test_lmcache_formats.py; with LMCACHE_SRC, the unpacked wheel's package " +
			"itself, numba compiling); the CUDA kernels in cuda_ops.so did not run (no GPU build here)"
	},
	formats: []*engineFormat{
		{name: "fp8", bits: 8, elems: 1, bytes: 1, evidence: EvidenceExecuted,
			flags: `lmcache server --l2-adapter '{"type": "fs", "base_path": "...", "serde": {"type": "fp8"}}'`,
			source: "v1/distributed/serde/fp8.py:34-48 (serialize: .to(torch.float8_e4m3fn)), :74-86 (deserialize), " +
				":89-103 (registered as fp8); torch 2.13 torch/headeronly/util/Float8_e4m3fn.h:171-243",
			encodeAll: encodeLMCacheFP8All, decodeAll: decodeLMCacheFP8All},
		{name: "kivi", bits: 16, elems: 1, bytes: 2, identity: true, evidence: EvidenceExecuted,
			source:    "v1/storage_backend/naive_serde/kivi_serde.py:7-22 (returns its input); naive_serde/__init__.py:31-32",
			encodeAll: (*tensorJob).encodeNone, decodeAll: (*tensorJob).decodeNone},
		{name: "cachegen", bits: 5, elems: 1, whole: true, evidence: EvidenceExecuted,
			nominal: cacheGenNominalBits,
			source: "v1/storage_backend/naive_serde/cachegen_encoder.py:46-112, cachegen_decoder.py:34-140, " +
				"cachegen_basics.py:26-133; storage_backend/serde/cachegen_encoder.py:46-70, 235-337, cachegen_decoder.py:32-113, " +
				"cachegen_basics.py:18, 177-200; v1/platform/torch_ops/cachegen_kernels.py:11-343",
			bins: cacheGenBins, encodeTensor: (*tensorJob).cacheGenEncode, decodeTensor: (*tensorJob).cacheGenDecode,
			encodeAll: func(*tensorJob, []float32, int, int) {}, decodeAll: (*tensorJob).cacheGenDequantize},
	},
}

// encodeLMCacheFP8All is the fp8 serde's write of a chunk
// (v1/distributed/serde/fp8.py:34-48, LMCache 0.5.6):
// src_tensor.to(torch.float8_e4m3fn), no scale, no clamp, no header. A
// bfloat16 or half cache widens to float32 exactly, then c10's
// fp8e4m3fn_from_fp32_value, which from torch 2.12 on (2.13 here,
// torch/headeronly/util/Float8_e4m3fn.h:171-243) rounds to nearest even
// and saturates: past 448 (and Inf, which kv-compress refuses before) to
// ±448, as NVIDIA's satfinite conversion does (fp8Format.encode); NaN
// (refused too) to 0x7f with its sign. The values past ±448 are counted
// (saturated). An older torch gives NaN past 464 instead: not modelled.
func encodeLMCacheFP8All(j *tensorJob, x []float32, qlo, qhi int) {
	codes := j.codes[qlo:qhi]
	j.saturated.Add(fp8E4M3.encodeCount(codes, x[:len(codes)], 1)) // v·1 is v
}

// decodeLMCacheFP8All is the fp8 serde's read (v1/distributed/serde/
// fp8.py:74-86, LMCache 0.5.6): the bytes
// viewed as float8_e4m3fn and cast to the destination's dtype, exact for
// every code (kv-compress rounds nothing: an e4m3 value is an f16 and a
// bf16 value).
func decodeLMCacheFP8All(j *tensorJob, y []float32, qlo, qhi int) {
	for i, c := range j.codes[qlo:qhi] {
		y[i] = fp8E4M3.decode[c]
	}
}

// CacheGen (remote_serde: cachegen), as LMCache 0.5.6 encodes and decodes
// a KV chunk object on its CPU path (the torch/numba baseline the wheel
// routes to without an accelerator, v1/platform/base/device_ops.py:241-251,
// which its comments say is aligned with the CUDA kernels; the research
// notes compare the two line by line). For one chunk of n <= chunk_size
// tokens (256, v1/config.py:90), per layer and role (K and V apart,
// storage_backend/serde/cachegen_encoder.py:85-100, 293-294):
//
//  1. Quantization, torch_quant_vectorized (cachegen_encoder.py:46-70):
//     MAX = bins//2 - 1 (float32: 15 for 32 bins, 7 for 16), one maximum per
//     token over all heads × head_dim, max1 = amax|x| in the cache's dtype;
//     factor = MAX / max1 (float32), symbol = int8(round_half_even(x·factor
//     + MAX)), each step a float32 rounding. A token whose max1 is 0 (or so
//     small that the factor overflows) gets NaN or ±Inf, which CPU torch's
//     conversion to int8 makes 0 (x86's cvttss2si, measured): symbol 0 for
//     every channel of that token.
//  2. CDF per (layer, channel) over the chunk's n tokens, calculate_cdf
//     (cachegen_kernels.py:300-343) with num_bins = int(bins.max()) = 32
//     whatever the layer: cdf[k] = floor(65503·#{t: sym < k} / n) + k for
//     k = 0..32, stored int16 (33 entries; 16-bin layers leave the upper
//     symbols at count 0).
//  3. Arithmetic coding, per (layer, channel) stream of the chunk's
//     symbols in token order, restarting every 256 tokens
//     (CACHEGEN_GPU_MAX_TOKENS_PER_CHUNK, cachegen_basics.py:18;
//     cachegen_encoder.py:312-328: one stream per chunk at chunk_size 256):
//     _encode_single_channel (cachegen_kernels.py:11-98), a 32-bit
//     Witten–Neal–Cleary coder with 16-bit frequencies, bits MSB first, the
//     last byte padded with zeros; at most 256 bytes a stream (the output
//     buffer; 256 symbols of at most 31 levels cost under 160).
//  4. The read (cachegen_decoder.py:32-113; naive_serde/cachegen_decoder.py:
//     67-125): _decode_single_channel (cachegen_kernels.py:131-213), then
//     do_dequantize in float32, ((sym - MAX) / MAX) · max1, then .to(dtype)
//     (round to nearest even). An all-zero token comes back as -0.
//
// The bins, CacheGenConfig.from_model_name (naive_serde/cachegen_basics.py:
// 26-133): for a model of fewer than 10 layers, 32 everywhere; else keys
// 32 in layers 0-9 and 16 after, values 32 in layers 0-1 and 16 after (the
// named 7B, 8B and 9B entries are the same rule at 32 and 40 layers).
// kv-compress counts the model's layers as the cache's (the largest
// layer_{i} + 1), and records each tensor's bins in its header (bins).
//
// The stored form. LMCache pickles a CacheGenGPUEncoderOutput
// (storage_backend/serde/cachegen_basics.py:177-194): per 256-token
// sub-chunk a uint8 bitstream (every stream, layer-major, K layers then V)
// and an int32 [2L, C] table of stream lengths, an int16 [2L, C, 33] CDF,
// and the maxima [L, n, 1] of K and of V in the cache's dtype. NAME.codes
// holds this tensor's (layer, role) share of those tensors, chunk after
// chunk (per batch row, tokens 0-255, 256-511, ...), each chunk as
//
//	maxima   n × the dtype's bytes, little-endian (max_tensors_key[l, :, 0])
//	CDF      C × 33 uint16 (cdf[row, c, :], C = heads × head_dim, c = h·D + d)
//	lengths  C × uint32 (bytestream_lengths[row, c])
//	streams  the C streams, channel after channel (its slice of bytestream)
//
// so that its size is exactly the bytes LMCache stores for it. Not stored
// (LMCache's, not the tensor's): the pickle framing of each chunk object,
// about 1.8 KB shared by all its layers (1,828 to 1,865 bytes measured with
// torch 2.13 on CPU; it depends on the torch version, the tensors' device
// and the digits of their sizes). A
// last chunk of fewer than 256 tokens is stored as LMCache stores it with
// save_unfull_chunk: true; with its default false (v1/config.py:385-389)
// LMCache stores no partial chunk and recomputes those tokens.
const (
	cacheGenChunk   = 256                 // tokens per chunk object (chunk_size, v1/config.py:90) and per stream (cachegen_basics.py:18)
	cacheGenNB      = 32                  // int(bins.max()): 32 for every bins table
	cacheGenLp      = cacheGenNB + 1      // CDF entries per channel
	cacheGenMaxLen  = 256                 // a stream's output buffer (cachegen_encoder.py:303-307)
	cacheGenCDFTop  = 0xFFFF - cacheGenNB // calculate_cdf's max_uint16_value (cachegen_kernels.py:332)
	cacheGenCDFSize = 2 * cacheGenLp      // bytes of one channel's CDF
)

// cacheGenNominalBits is lmcache:cachegen's nominal size per element, at
// most, of a full 256-token chunk: the CDF (33 × 16 bits per channel) and
// the stream length (32 bits per channel) spread over 256 tokens, 2.1875
// bits, plus the codes at their most (log2 31, the widest bins); the
// maxima (one per token over all heads) are left out. Measured sizes come
// from compress (the codes are entropy-coded: 2.38 bits on SmolLM2-135M's
// bfloat16 cache, 4.65 bits in all, docs/engines.md).
var cacheGenNominalBits = float64(cacheGenCDFSize*8+32)/cacheGenChunk + math.Log2(31)

// ErrCacheGen reports a CacheGen part of a compressed file that is not
// what LMCache's encoder writes: truncated, a length or CDF out of range,
// or a stream that does not decode to its CDF's counts.
var ErrCacheGen = errors.New("CacheGen stream")

// cacheGenBins is CacheGenConfig.from_model_name's bins for the tensor
// name in a cache of the given tensors (naive_serde/cachegen_basics.py:
// 84-129, LMCache 0.5.6, with num_hidden_layers the cache's layer count).
func cacheGenBins(name string, names []string) (int, error) {
	layer, role, ok := slotOf(name)
	if !ok {
		return 0, fmt.Errorf("lmcache:cachegen needs tensors named layer_{i}_key and layer_{i}_value: its bins depend on " +
			"the layer and the role (naive_serde/cachegen_basics.py:84-129)")
	}
	layers := 0
	for _, n := range names {
		if l, _, ok := slotOf(n); ok {
			layers = max(layers, l+1)
		}
	}
	switch {
	case layers < 10:
		return 32, nil
	case role == KeyRole && layer < 10, role == ValueRole && layer < 2:
		return 32, nil
	}
	return 16, nil
}

// cacheGenMax is MAX = bins // 2 - 1, a float32 (storage_backend/serde/
// cachegen_encoder.py:61, LMCache 0.5.6).
func cacheGenMax(bins int) float32 { return float32(bins/2 - 1) }

// cacheGenChunks calls fn for each chunk object of a [b, h, t, d] tensor:
// its batch row and first token, and its tokens n (chunk_size 256,
// v1/config.py:90, LMCache 0.5.6; a batch row is a request of its own).
func (l *layout) cacheGenChunks(fn func(b, t0, n int) error) error {
	if l.n == 0 {
		return nil
	}
	for b := 0; b < l.b; b++ {
		for t0 := 0; t0 < l.t; t0 += cacheGenChunk {
			if err := fn(b, t0, min(cacheGenChunk, l.t-t0)); err != nil {
				return err
			}
		}
	}
	return nil
}

// cacheGenSizeRange is the least and the most bytes NAME.codes can hold
// for the layout: per chunk the maxima, CDFs and lengths, and 1 to 256
// bytes a stream. In closed form, so that a header's shape costs nothing
// to check (the shape's product is at most 2^48: no overflow).
func (l *layout) cacheGenSizeRange() (lo, hi int) {
	if l.n == 0 {
		return 0, 0
	}
	c, chunks := l.h*l.d, l.b*((l.t+cacheGenChunk-1)/cacheGenChunk)
	fixed := l.b*l.t*l.esz + chunks*c*(cacheGenCDFSize+4)
	return fixed + chunks*c, fixed + chunks*c*cacheGenMaxLen
}

// cacheGenSymbol is one element's symbol (storage_backend/serde/
// cachegen_encoder.py:65-68, LMCache 0.5.6):
// round(x·factor + MAX).to(torch.int8) in float32, each product and sum
// rounded (no fused multiply-add); NaN and ±Inf (an all-zero token: 0·Inf)
// convert to 0, as CPU torch's int8 cast gives them.
func cacheGenSymbol(x, factor, mx float32) uint8 {
	v := float32(x*factor) + mx
	if v != v || v > math.MaxInt32 || v < math.MinInt32 {
		return 0
	}
	return uint8(int32(math.RoundToEven(float64(v))))
}

// cacheGenCDF is calculate_cdf of one channel's n symbols
// (v1/platform/torch_ops/cachegen_kernels.py:300-343, LMCache 0.5.6):
// cdf[k] = floor(65503·cum[k]/n) + k.
func cacheGenCDF(cdf *[cacheGenLp]uint16, hist *[cacheGenNB]int) {
	n, cum := 0, 0
	for _, h := range hist {
		n += h
	}
	for k := 0; k <= cacheGenNB; k++ {
		cdf[k] = uint16(int64(cacheGenCDFTop)*int64(cum)/int64(max(n, 1)) + int64(k))
		if k < cacheGenNB {
			cum += hist[k]
		}
	}
}

// cacheGenEncodeStream appends the arithmetic code of syms to dst:
// _encode_single_channel (cachegen_kernels.py:11-98, LMCache 0.5.6), the
// 32-bit coder of csrc/cuda/ac_enc.cu's encode_with_accessor_kernel. A
// symbol s codes as [cdf[s], cdf[s+1]) of 2^16, the last one (31) as
// [cdf[31], 2^16); bits MSB first, the last byte padded with zeros.
// The kernel renormalizes a bit at a time; here a symbol's run of shared
// top bits of low and high (as many as the leading zeros of low^high) is
// shifted out at once, then its run of underflow steps (low 01..., high
// 10...: the leading ones of low&^high below the top bit), which writes
// the same bits (cacheGenEncodeStreamRef in the tests is the kernel's loop
// as written). cdf must be strictly increasing, as calculate_cdf's is.
func cacheGenEncodeStream(dst []byte, syms []uint8, cdf *[cacheGenLp]uint16) []byte {
	w := cgBitWriter{dst: dst}
	low, high := uint32(0), uint32(0xFFFFFFFF)
	pending := 0
	for _, s := range syms {
		span := uint64(high) - uint64(low) + 1
		cl, ch := uint64(cdf[s]), uint64(0x10000)
		if int(s) != cacheGenLp-2 {
			ch = uint64(cdf[s+1])
		}
		high = uint32(uint64(low) + span*ch>>16 - 1)
		low = uint32(uint64(low) + span*cl>>16)
		if x := low ^ high; x < 0x80000000 { // n >= 1 shared top bits: the first carries the pending ones
			n := uint(bits.LeadingZeros32(x))
			w.first(high>>31, pending)
			pending = 0
			w.put(uint64(high)>>(32-n)&(1<<(n-1)-1), n-1)
			low, high = uint32(uint64(low)<<n), uint32(uint64(high)<<n|(1<<n-1))
		}
		if k := uint(bits.LeadingZeros32(^((low &^ high) << 1))); k > 0 { // at most 31
			pending += int(k)
			low, high = low<<k&0x7FFFFFFF, high<<k|(1<<k-1)|0x80000000
		}
	}
	w.first(low>>30&1, pending+1)
	return w.flush()
}

// cgBitWriter appends bits MSB first: the low n bits of acc are not yet a byte.
type cgBitWriter struct {
	dst []byte
	acc uint64
	n   uint
}

// put appends the k <= 56 low bits of v (v < 1<<k).
func (w *cgBitWriter) put(v uint64, k uint) {
	w.acc, w.n = w.acc<<k|v, w.n+k
	for w.n >= 8 {
		w.n -= 8
		w.dst = append(w.dst, byte(w.acc>>w.n))
	}
}

// first appends bit b, then p copies of 1-b (the coder's pending bits).
func (w *cgBitWriter) first(b uint32, p int) {
	w.put(uint64(b), 1)
	fill := uint64(0)
	if b == 0 {
		fill = ^uint64(0)
	}
	for ; p > 0; p -= 48 {
		k := uint(min(p, 48))
		w.put(fill&(1<<k-1), k)
	}
}

// flush pads the last byte with zeros.
func (w *cgBitWriter) flush() []byte {
	if w.n > 0 {
		w.dst = append(w.dst, byte(w.acc<<(8-w.n)))
	}
	return w.dst
}

// cacheGenDecodeStream decodes len(out) symbols from the stream b:
// _decode_single_channel (cachegen_kernels.py:131-213, LMCache 0.5.6;
// csrc/ac_dec.cu's decode_prefix_with_accessor_kernel), bytes past the
// stream read as 0 as the CUDA kernel reads them. (The numba port starts
// from the 4 bytes at the stream's offset whatever its length, so a stream
// shorter than 4 bytes reads its successor's first bytes: the coder's
// termination leaves the value inside the last interval whatever follows,
// and the symbols are the same, as the tests check on LMCache's own run.)
// The kernel's binary search of the CDF is, for a strictly increasing cdf
// from 0 (calculate_cdf's; cacheGenCDFValid), the largest s <= 31 with
// cdf[s] <= count, found here in five steps without a branch; the
// renormalization shifts as cacheGenEncodeStream's does, an underflow run
// of k steps taking value to (value<<k) ^ 2^31 (each step's value -= 2^30
// then <<1), with the next bits of the stream below.
func cacheGenDecodeStream(out []uint8, b []byte, cdf *[cacheGenLp]uint16) {
	r := cgBitReader{b: b}
	value := r.read(32)
	low, high := uint32(0), uint32(0xFFFFFFFF)
	for i := range out {
		span := uint64(high) - uint64(low) + 1
		count := uint16(((uint64(value-low)+1)*0x10000 - 1) / span)
		s := 0
		if cdf[16] <= count {
			s = 16
		}
		if t := s + 8; cdf[t] <= count {
			s = t
		}
		if t := s + 4; cdf[t] <= count {
			s = t
		}
		if t := s + 2; cdf[t] <= count {
			s = t
		}
		if t := s + 1; cdf[t] <= count {
			s = t
		}
		out[i] = uint8(s)
		if i == len(out)-1 {
			break
		}
		cl, ch := uint64(cdf[s]), uint64(0x10000)
		if s != cacheGenLp-2 {
			ch = uint64(cdf[s+1])
		}
		high = uint32(uint64(low) + span*ch>>16 - 1)
		low = uint32(uint64(low) + span*cl>>16)
		if x := low ^ high; x < 0x80000000 {
			n := uint(bits.LeadingZeros32(x))
			low, high = uint32(uint64(low)<<n), uint32(uint64(high)<<n|(1<<n-1))
			value = uint32(uint64(value)<<n) | r.read(n)
		}
		if k := uint(bits.LeadingZeros32(^((low &^ high) << 1))); k > 0 {
			low, high = low<<k&0x7FFFFFFF, high<<k|(1<<k-1)|0x80000000
			value = value<<k ^ 0x80000000 | r.read(k)
		}
	}
}

// cgBitReader reads a stream's bits MSB first from bit pos, zeros past its end.
type cgBitReader struct {
	b   []byte
	pos uint
}

// read returns the next k <= 32 bits.
func (r *cgBitReader) read(k uint) uint32 {
	i := r.pos >> 3
	var w uint64
	if i+8 <= uint(len(r.b)) {
		w = binary.BigEndian.Uint64(r.b[i:])
	} else {
		for j := i; j < i+8; j++ {
			w <<= 8
			if j < uint(len(r.b)) {
				w |= uint64(r.b[j])
			}
		}
	}
	w <<= r.pos & 7
	r.pos += k
	return uint32(w >> (64 - k))
}

// cacheGenCDFValid says whether cdf could be calculate_cdf's: 0 first,
// 65535 last, strictly increasing (each entry adds its index to a
// non-decreasing floor), the precondition of the stream coders.
func cacheGenCDFValid(cdf *[cacheGenLp]uint16) bool {
	if cdf[0] != 0 || cdf[cacheGenNB] != 0xFFFF {
		return false
	}
	for k := 1; k <= cacheGenNB; k++ {
		if cdf[k] <= cdf[k-1] {
			return false
		}
	}
	return true
}

// cacheGenState is a CacheGen tensor decoded from its stored form: each
// element's symbol (natural order) and each token's maximum, by batch row.
type cacheGenState struct {
	sym []uint8
	max []float32 // [b·t + token]
	// level is ((sym - MAX) / MAX) in float32 by symbol, do_dequantize's
	// first two steps (cachegen_decoder.py:38-40).
	level [cacheGenNB]float32
}

// cacheGenEncode quantizes and codes the whole tensor into j.codes, chunk
// after chunk, as LMCache 0.5.6's encode_function does each chunk object
// (storage_backend/serde/cachegen_encoder.py:277-337: torch_quant_vectorized,
// calculate_cdf, encode_ntokens, collect_bytes), then decodes the stored
// bytes back (cacheGenDecode) for the reconstruction, as Decompress does.
// A NaN or Inf in the cache is refused (its index in the source tensor).
func (j *tensorJob) cacheGenEncode() error {
	l := j.l
	c, esz := l.h*l.d, j.dtype.Size()
	mx := cacheGenMax(j.bins)
	lo, _ := l.cacheGenSizeRange()
	out := make([]byte, 0, lo+lo/2)
	n0 := min(cacheGenChunk, l.t)
	x := make([]float32, n0*c)     // the chunk, [token][channel]
	sym := make([]uint8, c*n0)     // its symbols, [channel][token]
	row := make([]float32, n0*l.d) // one head's tokens
	var hist [cacheGenNB]int
	var cdf [cacheGenLp]uint16
	err := l.cacheGenChunks(func(b, t0, n int) error {
		for h := 0; h < l.h; h++ {
			base := ((b*l.h+h)*l.t + t0) * l.d
			safetensors.DecodeFloat32s(row[:n*l.d], j.src[base*esz:(base+n*l.d)*esz], j.dtype)
			if i := firstNonFinite(row[:n*l.d]); i >= 0 {
				return tensorErrorf(j.name, "element %d is %v (%w)", base+i, row[i], ErrNotFinite)
			}
			for t := 0; t < n; t++ {
				copy(x[t*c+h*l.d:t*c+(h+1)*l.d], row[t*l.d:(t+1)*l.d])
			}
		}
		for t := 0; t < n; t++ {
			xt := x[t*c : (t+1)*c]
			m := math.Float32frombits(absMaxBits(xt))
			switch j.dtype { // exact: m is a value of the dtype
			case safetensors.BF16:
				out = binary.LittleEndian.AppendUint16(out, safetensors.Float32ToBF16(m))
			case safetensors.F16:
				out = binary.LittleEndian.AppendUint16(out, safetensors.Float32ToFP16(m))
			default:
				out = binary.LittleEndian.AppendUint32(out, math.Float32bits(m))
			}
			factor := mx / m
			for ch, v := range xt {
				sym[ch*n+t] = cacheGenSymbol(v, factor, mx)
			}
		}
		for ch := 0; ch < c; ch++ {
			hist = [cacheGenNB]int{}
			for _, s := range sym[ch*n : (ch+1)*n] {
				hist[s]++
			}
			cacheGenCDF(&cdf, &hist)
			for _, v := range cdf {
				out = binary.LittleEndian.AppendUint16(out, v)
			}
		}
		lengths := len(out)
		out = append(out, make([]byte, 4*c)...)
		for ch := 0; ch < c; ch++ {
			start := len(out)
			cdfAt(&cdf, out[lengths-cacheGenCDFSize*c+cacheGenCDFSize*ch:])
			out = cacheGenEncodeStream(out, sym[ch*n:(ch+1)*n], &cdf)
			size := len(out) - start
			if size > cacheGenMaxLen { // 256 symbols of at most 31 levels take under 160 bytes
				return tensorErrorf(j.name, "internal error: a CacheGen stream of %d bytes, past LMCache's %d", size, cacheGenMaxLen)
			}
			binary.LittleEndian.PutUint32(out[lengths+4*ch:], uint32(size))
		}
		return nil
	})
	if err != nil {
		return err
	}
	j.codes = out
	return j.cacheGenRead(false) // its own streams: no need to code them again
}

// cdfAt reads one channel's 33 uint16 CDF entries from b.
func cdfAt(cdf *[cacheGenLp]uint16, b []byte) {
	for k := range cdf {
		cdf[k] = binary.LittleEndian.Uint16(b[2*k:])
	}
}

// cacheGenDecode parses j.codes into j.cg: every chunk's maxima, CDFs,
// lengths and streams, decoded as LMCache 0.5.6's decode_function_gpu
// decodes them (storage_backend/serde/cachegen_decoder.py:57-113,
// decode_fast_prefsum, cachegen_kernels.py:256-297). Whatever LMCache's encoder could not have
// written is an ErrCacheGen naming the chunk: a part cut short, a maximum
// that is not a finite |x|, a stream length outside 1..256, a symbol past
// the tensor's bins, a CDF that is not calculate_cdf's of the decoded
// symbols, a stream that is not the encoder's code of them, bytes left
// over. Memory is the tensor's size (one byte an element), which the
// stored size bounds (checkStored).
func (j *tensorJob) cacheGenDecode() error { return j.cacheGenRead(true) }

// cacheGenRead is cacheGenDecode; without verify it trusts that each
// stream is the coder's code of its symbols (the encoder's own output) and
// does not code them again to compare.
func (j *tensorJob) cacheGenRead(verify bool) error {
	l := j.l
	if j.bins != 16 && j.bins != 32 {
		return tensorErrorf(j.name, "CacheGen bins %d, want 16 or 32 (%w)", j.bins, ErrCacheGen)
	}
	c, esz := l.h*l.d, j.dtype.Size()
	mx := cacheGenMax(j.bins)
	cg := &cacheGenState{sym: make([]uint8, l.n), max: make([]float32, l.b*l.t)}
	for s := range cg.level {
		cg.level[s] = float32(float32(s)-mx) / mx
	}
	p := j.codes
	n0 := min(cacheGenChunk, l.t)
	syms, maxima := make([]uint8, n0), make([]float32, n0)
	check := make([]byte, 0, cacheGenMaxLen+8)
	var hist [cacheGenNB]int
	var cdf, want [cacheGenLp]uint16
	err := l.cacheGenChunks(func(b, t0, n int) error {
		bad := func(format string, a ...any) error {
			return tensorErrorf(j.name, "batch %d tokens %d-%d: %s (%w)", b, t0, t0+n-1, fmt.Sprintf(format, a...), ErrCacheGen)
		}
		fixed := n*esz + c*(cacheGenCDFSize+4)
		if len(p) < fixed {
			return bad("%d bytes left, the maxima, CDFs and lengths take %d", len(p), fixed)
		}
		maxima := maxima[:n]
		safetensors.DecodeFloat32s(maxima, p[:n*esz], j.dtype)
		for t, m := range maxima {
			if !(m >= 0) || math.IsInf(float64(m), 0) || math.Signbit(float64(m)) {
				return bad("token %d: maximum %v is not a finite |x|", t0+t, m)
			}
		}
		copy(cg.max[b*l.t+t0:], maxima)
		cdfs, lengths := p[n*esz:], p[n*esz+c*cacheGenCDFSize:]
		streams := p[fixed:]
		off := 0
		for ch := 0; ch < c; ch++ {
			size := int(binary.LittleEndian.Uint32(lengths[4*ch:]))
			if size < 1 || size > cacheGenMaxLen || size > len(streams)-off {
				return bad("channel %d: stream length %d, want 1..%d within the %d bytes left", ch, size, cacheGenMaxLen, len(streams)-off)
			}
			stream := streams[off : off+size]
			off += size
			cdfAt(&cdf, cdfs[cacheGenCDFSize*ch:])
			if !cacheGenCDFValid(&cdf) {
				return bad("channel %d: a CDF that is not calculate_cdf's (0 to 65535, strictly increasing)", ch)
			}
			cacheGenDecodeStream(syms[:n], stream, &cdf)
			hist = [cacheGenNB]int{}
			for t, s := range syms[:n] {
				if s > uint8(2*mx) {
					return bad("channel %d token %d: symbol %d past bins %d", ch, t0+t, s, j.bins)
				}
				hist[s]++
			}
			if cacheGenCDF(&want, &hist); want != cdf {
				return bad("channel %d: the stream does not decode to its CDF's counts", ch)
			}
			if verify {
				if check = cacheGenEncodeStream(check[:0], syms[:n], &cdf); string(check) != string(stream) {
					return bad("channel %d: the stream is not the coder's code of the symbols it decodes to", ch)
				}
			}
			h, d := ch/l.d, ch%l.d
			base := ((b*l.h+h)*l.t+t0)*l.d + d
			for t, s := range syms[:n] {
				cg.sym[base+t*l.d] = s
			}
		}
		p = streams[off:]
		return nil
	})
	if err != nil {
		return err
	}
	if len(p) != 0 {
		return tensorErrorf(j.name, "%d bytes after the last chunk (%w)", len(p), ErrCacheGen)
	}
	j.cg = cg
	return nil
}

// cacheGenDequantize is do_dequantize on elements [qlo, qhi) (natural
// order): ((sym - MAX) / MAX) · max1 in float32 (storage_backend/serde/
// cachegen_decoder.py:32-42, LMCache 0.5.6); the pipeline rounds it to the
// cache's dtype, .to(self.dtype) (v1/storage_backend/naive_serde/
// cachegen_decoder.py:123-125).
func (j *tensorJob) cacheGenDequantize(y []float32, qlo, qhi int) {
	l, cg := j.l, j.cg
	for i := qlo; i < qhi; {
		r := i / l.d // a row of head_dim values shares its token's maximum
		m := cg.max[r/(l.h*l.t)*l.t+r%l.t]
		end := min(qhi, (r+1)*l.d)
		for ; i < end; i++ {
			y[i-qlo] = cg.level[cg.sym[i]&(cacheGenNB-1)] * m
		}
	}
}
