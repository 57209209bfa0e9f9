package compression

import "math"

// The inner loops of the codec. Each kernel has a portable Go version,
// which defines its result and runs on every CPU, and on amd64 with AVX2
// an assembly version over whole blocks of 8 values that gives the same
// bits (kernels_test.go checks them against each other). The wrappers run
// the assembly over the blocks and the Go version over the rest.

// simdBlock is the elements an assembly kernel handles per step.
const simdBlock = 8

// useSIMD selects the assembly kernels; tests switch it off to run the
// portable code on the same inputs.
var useSIMD = haveSIMD

// simdLen is the prefix of n elements that the assembly kernels take.
func simdLen(n int) int {
	if !useSIMD {
		return 0
	}
	return n &^ (simdBlock - 1)
}

// absMaxBits is the largest float32 bit pattern of |x| (sign cleared): for
// non-negative floats the patterns order like the values, and a NaN's or
// Inf's is at least 0x7f800000.
func absMaxBits(x []float32) uint32 {
	var m uint32
	n := simdLen(len(x))
	if n > 0 {
		m = absMaxBitsAVX2(x[:n])
	}
	for _, v := range x[n:] {
		m = max(m, math.Float32bits(v)&0x7fffffff) // integer max: branch-free
	}
	return m
}

// quantSym writes codes[i] = clamp(roundHalfEven(x[i]/s), -qmax-1, qmax).
// Rounding adds and subtracts roundMagic in float32, exact for |x/s| < 2^22.
func quantSym(codes []int8, x []float32, s float32, qmax int32) {
	codes = codes[:len(x)]
	n := simdLen(len(x))
	if n > 0 {
		quantSymAVX2(codes[:n], x[:n], s, qmax)
	}
	qmin := -qmax - 1
	for i, v := range x[n:] {
		q := int32((v/s + roundMagic) - roundMagic)
		codes[n+i] = int8(min(max(q, qmin), qmax)) // integer clamp: branch-free
	}
}

// dequantSym writes dst[i] = float32(codes[i]) * s.
func dequantSym(dst []float32, codes []int8, s float32) {
	codes = codes[:len(dst)]
	n := simdLen(len(dst))
	if n > 0 {
		dequantSymAVX2(dst[:n], codes[:n], s)
	}
	for i, q := range codes[n:] {
		dst[n+i] = float32(q) * s
	}
}

// orderKey maps float32 bits to an int32 that orders like the value, with
// -0 below +0 (as Go's min and max order them): the magnitude bits of a
// negative value are flipped.
func orderKey(b uint32) int32 { return int32(b ^ uint32(int32(b)>>31)>>1) }

// fromOrderKey is the inverse of orderKey.
func fromOrderKey(k int32) float32 {
	return math.Float32frombits(uint32(k) ^ uint32(k>>31)>>1)
}

// minMax returns the smallest and largest of x (-0 below +0) and the
// largest bit pattern of |x|, which tells whether x holds a NaN or an Inf;
// lo and hi mean nothing when it does. Empty x gives (+Inf, -Inf, 0).
func minMax(x []float32) (lo, hi float32, abits uint32) {
	klo, khi := orderKey(0x7f800000), orderKey(0xff800000)
	n := simdLen(len(x))
	if n > 0 {
		klo, khi, abits = minMaxAVX2(x[:n])
	}
	for _, v := range x[n:] {
		b := math.Float32bits(v)
		k := orderKey(b)
		klo, khi, abits = min(klo, k), max(khi, k), max(abits, b&0x7fffffff)
	}
	return fromOrderKey(klo), fromOrderKey(khi), abits
}

// quantAsym writes codes[i] = roundHalfEven(clamp((x[i]-m)/s, 0, qmax)) as
// an unsigned byte. The bounds are integers, so clamping before rounding
// gives the same codes and keeps the roundMagic rounding exact.
func quantAsym(codes []int8, x []float32, m, s, qmax float32) {
	codes = codes[:len(x)]
	n := simdLen(len(x))
	if n > 0 {
		quantAsymAVX2(codes[:n], x[:n], m, s, qmax)
	}
	for i, v := range x[n:] {
		r := min(max((v-m)/s, 0), qmax)
		codes[n+i] = int8(uint8((r + roundMagic) - roundMagic))
	}
}

// dequantAsym writes dst[i] = float32(float32(codes[i]&mask) * s) + m: the
// product is rounded first (no fused multiply-add).
func dequantAsym(dst []float32, codes []int8, mask uint8, s, m float32) {
	codes = codes[:len(dst)]
	n := simdLen(len(dst))
	if n > 0 {
		dequantAsymAVX2(dst[:n], codes[:n], int32(mask), s, m)
	}
	for i, q := range codes[n:] {
		dst[n+i] = float32(float32(uint8(q)&mask)*s) + m
	}
}

// laneSums are the error sums of whole blocks of 8 pairs, kept in 8 lanes
// (pair i adds into lane i%8) so that the additions of a block are
// independent; sum folds the lanes in a fixed order.
type laneSums struct {
	x2, y2, xy, e2 [simdBlock]float64
}

// fold is ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)), the order in which the
// assembly folds its two 4-lane registers.
func fold(l *[simdBlock]float64) float64 {
	return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

// histTables holds the histogram counts of a block kernel in 4 tables
// (pair i counts in table i%4), so that neighbours in the same bin do not
// wait on each other's increment.
type histTables [4][HistBins]int64

// addBlocks accumulates the pairs of x and y (len(x) a multiple of 8) into
// the lane sums and histogram tables, and returns the bits of the largest
// float32 |y - x|.
func addBlocks(s *laneSums, h *histTables, x, y []float32) uint32 {
	if useSIMD {
		return addBlocksAVX2(x, y[:len(x)], s, h)
	}
	var maxe uint32
	for b := 0; b+simdBlock <= len(x); b += simdBlock {
		for k := 0; k < simdBlock; k++ {
			xf, yf := float64(x[b+k]), float64(y[b+k])
			e := yf - xf
			// The conversions keep the compiler from fusing multiply and add.
			s.x2[k] += float64(xf * xf)
			s.y2[k] += float64(yf * yf)
			s.xy[k] += float64(xf * yf)
			s.e2[k] += float64(e * e)
			ae := math.Float32bits(y[b+k]-x[b+k]) & 0x7fffffff
			maxe = max(maxe, ae)
			h[k%4][histBin(ae)]++
		}
	}
	return maxe
}

// pack4 stores two 4-bit codes a byte, the first in the low nibble.
func pack4(dst []byte, codes []int8) {
	n := 0
	if useSIMD {
		n = len(codes) &^ 31
		if n > 0 {
			pack4AVX2(dst[:n/2], codes[:n])
		}
	}
	m := n + (len(codes)-n)&^1
	for i := n; i < m; i += 2 {
		dst[i/2] = byte(codes[i])&0x0f | byte(codes[i+1])<<4
	}
	if m < len(codes) {
		dst[m/2] = byte(codes[m]) & 0x0f
	}
}

// pack2 stores four 2-bit codes a byte, the first in the lowest bits.
func pack2(dst []byte, codes []int8) {
	n := 0
	if useSIMD {
		n = len(codes) &^ 31
		if n > 0 {
			pack2AVX2(dst[:n/4], codes[:n])
		}
	}
	for i := n; i < len(codes); i += 4 {
		var b byte
		for k := 0; k < 4 && i+k < len(codes); k++ {
			b |= byte(codes[i+k]) & 3 << (2 * k)
		}
		dst[i/4] = b
	}
}

// hadamard8 runs the transform's stages h = 1, 2 and 4 on every block of 8
// values of x (len(x) a multiple of 8).
func hadamard8(x []float32) {
	n := simdLen(len(x))
	if n > 0 {
		hadamard8AVX2(x[:n])
	}
	for i := n; i+8 <= len(x); i += 8 {
		butterfly8((*[8]float32)(x[i : i+8]))
	}
}

// hadamardStage runs stage h of the transform over x (len(x) a multiple
// of 2h): v[j], v[j+h] = v[j] + v[j+h], v[j] - v[j+h] for each block of 2h.
func hadamardStage(x []float32, h int) {
	if useSIMD && h%simdBlock == 0 {
		hadamardStageAVX2(x, h)
		return
	}
	for i := 0; i+2*h <= len(x); i += 2 * h {
		a, b := x[i:i+h:i+h], x[i+h:i+2*h:i+2*h]
		for j := range a {
			a[j], b[j] = a[j]+b[j], a[j]-b[j]
		}
	}
}

// scale multiplies every element of x by c.
func scale(x []float32, c float32) {
	n := simdLen(len(x))
	if n > 0 {
		scaleAVX2(x[:n], c)
	}
	for i := n; i < len(x); i++ {
		x[i] *= c
	}
}

// clampAbs limits x to [-lim, lim] in place. A NaN stays exactly the same
// NaN (no comparison holds for it; the assembly's VMAXPS/VMINPS return the
// value operand). Go's min and max would set bits of lim in a NaN's payload,
// which reaches a BF16's bits: clamped reconstructions are never NaN for
// finite input, but the definition is exact for every input.
func clampAbs(x []float32, lim float32) {
	n := simdLen(len(x))
	if n > 0 {
		clampAbsAVX2(x[:n], lim)
	}
	for i := n; i < len(x); i++ {
		if v := x[i]; v > lim {
			x[i] = lim
		} else if v < -lim {
			x[i] = -lim
		}
	}
}

// The ggml block kernels take one block of GGMLBlock (32) values.

// argAbsMax32 returns the first index of the largest |x| and its bits.
func argAbsMax32(x []float32) (imax int, abits uint32) {
	x = x[:GGMLBlock]
	if useSIMD {
		return argAbsMax32AVX2(x)
	}
	for i, v := range x {
		if b := math.Float32bits(v) & 0x7fffffff; b > abits {
			abits, imax = b, i
		}
	}
	return imax, abits
}

// offsetCodes32 writes q[i] = truncCode(float32(float32(x[i]-lo)*id) + off, qmax),
// the codes of q4_0 and q5_0 (lo = 0, where x - 0 is x exactly) and of q4_1 and q5_1.
func offsetCodes32(q *[GGMLBlock]uint8, x []float32, lo, id, off float32, qmax uint8) {
	x = x[:GGMLBlock]
	if useSIMD {
		offsetCodes32AVX2(q[:], x, lo, id, off, float32(qmax))
		return
	}
	for i, v := range x {
		q[i] = truncCode(float32(float32(v-lo)*id)+off, qmax)
	}
}

// roundCodes32 writes the q8_0 codes: x*id rounded half away from zero and
// clamped to [-128, 127], as a byte; 0 where x*id is not finite (the
// oracle's cast gives 0 there). A block's own scale keeps |x*id| <= 127.
func roundCodes32(q *[GGMLBlock]uint8, x []float32, id float32) {
	x = x[:GGMLBlock]
	if useSIMD {
		roundCodes32AVX2(q[:], x, id)
		return
	}
	for i, v := range x {
		t := float64(float32(v * id))
		q[i] = 0
		if math.Abs(t) < math.Inf(1) {
			q[i] = uint8(int8(min(max(math.Round(t), -128), 127)))
		}
	}
}
