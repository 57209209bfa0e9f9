package compression

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand"
	"slices"
	"strings"
	"testing"

	"kvlib/pkg/safetensors"
)

// withPortable runs fn with the assembly kernels, and the F16/BF16
// conversions' assembly, switched off.
func withPortable(fn func()) {
	saved, savedConv := useSIMD, safetensors.SetSIMD(false)
	useSIMD = false
	defer func() { useSIMD = saved; safetensors.SetSIMD(savedConv) }()
	fn()
}

func needSIMD(t testing.TB) {
	t.Helper()
	if !haveSIMD {
		t.Skip("no AVX2 on this CPU: only the portable kernels run")
	}
}

// kernelInputs are float32 vectors of every length 0..70 and some longer,
// drawn from normal values, with ties at half steps, zeros of both signs,
// subnormals and values at float32's limits mixed in.
func kernelInputs(seed int64) [][]float32 {
	r := rand.New(rand.NewSource(seed))
	special := []float32{0, float32(math.Copysign(0, -1)), 0.5, -0.5, 1.5, -2.5, 0x1p-149, -0x1p-149, 0x1p-126,
		math.MaxFloat32, -math.MaxFloat32, 65504, -65504, 7.5, -8.5}
	var out [][]float32
	for _, n := range append(rangeInts(0, 71), 127, 128, 129, 1000, 4099) {
		x := make([]float32, n)
		for i := range x {
			switch r.Intn(6) {
			case 0:
				x[i] = special[r.Intn(len(special))]
			case 1:
				x[i] = float32(r.Intn(33)-16) * 0.5 // halves: rounding ties
			default:
				x[i] = float32(r.NormFloat64() * math.Pow(2, float64(r.Intn(20)-10)))
			}
		}
		out = append(out, x)
	}
	tiny := make([]float32, 64) // subnormal blocks: the ggml scales' reciprocals overflow
	for i := range tiny {
		tiny[i] = float32(r.Intn(2001)-1000) * 0x1p-149
	}
	return append(out, tiny)
}

func rangeInts(lo, hi int) []int {
	var v []int
	for i := lo; i < hi; i++ {
		v = append(v, i)
	}
	return v
}

func codesFor(r *rand.Rand, n, bits int) []int8 {
	c := make([]int8, n)
	for i := range c {
		c[i] = int8(r.Intn(1<<bits) - 1<<(bits-1))
	}
	return c
}

func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(p, q float32) bool { return math.Float32bits(p) == math.Float32bits(q) })
}

// kernelRun runs a kernel on x and prints its whole output exactly; r
// draws the codes of the kernels that take codes.
type kernelRun func(x []float32, r *rand.Rand) string

// kernelRuns are the kernels and the calls that exercise them.
func kernelRuns() map[string]kernelRun {
	type run = kernelRun
	bitsOf := func(v []float32) string {
		b := make([]uint32, len(v))
		for i := range v {
			b[i] = math.Float32bits(v[i])
		}
		return fmt.Sprint(b)
	}
	scales := []float32{1, 0.37, 0x1p-24, 3e-5, 1e4}
	kernels := map[string]run{
		"absMaxBits": func(x []float32, r *rand.Rand) string { return fmt.Sprint(absMaxBits(x)) },
		"minMax": func(x []float32, r *rand.Rand) string {
			lo, hi, ab := minMax(x)
			return fmt.Sprint(math.Float32bits(lo), math.Float32bits(hi), ab)
		},
		"quantSym": func(x []float32, r *rand.Rand) string {
			var s strings.Builder
			for bits := 2; bits <= 8; bits++ {
				for _, sc := range scales {
					c := make([]int8, len(x))
					quantSym(c, x, sc, int32(1)<<(bits-1)-1)
					s.WriteString(fmt.Sprint(c))
				}
			}
			return s.String()
		},
		"quantAsym": func(x []float32, r *rand.Rand) string {
			var s strings.Builder
			for bits := 2; bits <= 8; bits++ {
				for _, sc := range scales {
					c := make([]int8, len(x))
					quantAsym(c, x, -0.75, sc, float32(int(1)<<bits-1))
					s.WriteString(fmt.Sprint(c))
				}
			}
			return s.String()
		},
		"dequant": func(x []float32, r *rand.Rand) string {
			var s strings.Builder
			for _, bits := range []int{2, 4, 8} {
				c := codesFor(r, len(x), bits)
				y := make([]float32, len(x))
				dequantSym(y, c, 0.0371)
				s.WriteString(bitsOf(y))
				dequantAsym(y, c, uint8(1<<bits-1), 0.0371, -1.25)
				s.WriteString(bitsOf(y))
			}
			return s.String()
		},
		"Accumulator.Add": func(x []float32, r *rand.Rand) string {
			y := make([]float32, len(x))
			for i := range y {
				y[i] = x[i] + float32(r.NormFloat64()*0.01)
				if i%7 == 0 {
					y[i] = x[i] // no error: bin 0
				}
			}
			var a Accumulator
			a.Add(x, y)
			a.Add(y, x)
			b, _ := json.Marshal(a)
			return string(b) + fmt.Sprint(math.Float64bits(a.SumX2), math.Float64bits(a.SumE2), math.Float64bits(a.SumXY))
		},
		"Pack": func(x []float32, r *rand.Rand) string {
			var s strings.Builder
			for _, bits := range []int{2, 3, 4, 8} {
				c := codesFor(r, len(x), bits)
				d := make([]byte, PackedLen(len(c), bits))
				Pack(d, c, bits)
				s.WriteString(fmt.Sprint(d))
			}
			return s.String()
		},
		"ggml": func(x []float32, r *rand.Rand) string {
			var s strings.Builder
			for i := 0; i+GGMLBlock <= len(x); i += GGMLBlock {
				b := x[i : i+GGMLBlock]
				imax, ab := argAbsMax32(b)
				s.WriteString(fmt.Sprint(imax, ab))
				var q [GGMLBlock]uint8
				for _, id := range []float32{0, 0.75, 3.5e4, float32(math.Inf(1))} {
					offsetCodes32(&q, b, 0, id, 8.5, 15)
					s.WriteString(fmt.Sprint(q))
					offsetCodes32(&q, b, -1.5, id, 0.5, 31)
					s.WriteString(fmt.Sprint(q))
					roundCodes32(&q, b, id)
					s.WriteString(fmt.Sprint(q))
				}
				for _, m := range []Method{Q4_0, Q4_1, Q5_0, Q5_1, Q8_0} {
					blk := make([]byte, GGMLBlockBytes(m))
					err := QuantizeBlockGGML(m, b, blk)
					y := make([]float32, GGMLBlock)
					if err == nil {
						err = DequantizeBlockGGML(m, blk, y)
					}
					s.WriteString(fmt.Sprint(blk, err) + bitsOf(y))
				}
			}
			return s.String()
		},
		"transpose": func(x []float32, r *rand.Rand) string {
			var s strings.Builder
			for _, rc := range [][2]int{{8, 8}, {16, 8}, {8, 24}, {3, 8}, {8, 5}, {40, 16}} {
				m := rc[0] * rc[1]
				if len(x) < m {
					continue
				}
				src := x[:len(x)/m*m]
				dst := make([]float32, len(src))
				transpose(dst, src, rc[0], rc[1])
				s.WriteString(bitsOf(dst))
			}
			return s.String()
		},
		"clampAbs": func(x []float32, r *rand.Rand) string {
			var s strings.Builder
			for _, lim := range []float32{65504, 0x1.fep127, 1} {
				v := slices.Clone(x)
				clampAbs(v, lim)
				s.WriteString(bitsOf(v))
			}
			return s.String()
		},
		"lloydMax": func(x []float32, r *rand.Rand) string {
			var s strings.Builder
			for bits := MinLMBits; bits <= MaxLMBits; bits++ {
				c := make([]int8, len(x))
				h, err := QuantizeGroupLM(x, bits, c)
				s.WriteString(fmt.Sprint(h, err, c))
				for _, sc := range scales {
					var tb lmTables
					lmBooks[bits].tables(sc, &tb)
					if firstNonFinite(x) < 0 { // the quantizer refuses NaN and Inf before any sum
						s.WriteString(fmt.Sprint(math.Float32bits(tb.sqErr(x, 1<<bits))))
					}
					y := make([]float32, len(x))
					DequantizeGroupLM(y, codesFor(r, len(x), bits), bits, safetensors.Float32ToFP16(sc))
					s.WriteString(bitsOf(y))
				}
			}
			return s.String()
		},
		"RotateRows": func(x []float32, r *rand.Rand) string {
			var s strings.Builder
			for _, d := range []int{1, 2, 4, 8, 16, 64, 128} {
				v := slices.Clone(x[:len(x)/d*d])
				RotateRows(v, d)
				s.WriteString(bitsOf(v))
			}
			return s.String()
		},
		"sylvester": func(x []float32, r *rand.Rand) string {
			var s strings.Builder
			for b := 1; b <= len(x) && b <= 1024; b <<= 1 {
				v := slices.Clone(x[:b])
				sylvesterButterfly(v)
				s.WriteString(bitsOf(v))
				tqRotate(v)
				s.WriteString(bitsOf(v))
			}
			return s.String()
		},
		"nvfp4": func(x []float32, r *rand.Rand) string {
			var s strings.Builder
			for i := 0; i+nvfp4Block <= len(x); i += nvfp4Block {
				for _, w := range []nvfp4Writer{nvfp4VLLM, nvfp4VLLM4over6, nvfp4TRTLLM} {
					for _, k := range []float32{1, 0.37, 1e-3, 3e4} {
						blk := make([]byte, nvfp4Bytes)
						nf, sat := w.quantize(x[i:i+nvfp4Block], blk, k)
						y := make([]float32, nvfp4Block)
						nvfp4Dequantize(blk, y, k)
						s.WriteString(fmt.Sprint(nf, sat, blk) + bitsOf(y))
						r.Read(blk)
						nvfp4Dequantize(blk, y, k)
						s.WriteString(bitsOf(y))
					}
				}
			}
			v := x[:len(x)/nvfp4Block*nvfp4Block]
			for _, w := range []nvfp4Writer{nvfp4VLLM, nvfp4VLLM4over6, nvfp4TRTLLM} {
				run := make([]byte, len(v)/nvfp4Block*nvfp4Bytes)
				nf, sat := w.quantizeRun(v, run, blockRun{k: 0.37, elems: nvfp4Block})
				y := make([]float32, len(v))
				nvfp4DequantizeRun(run, y, blockRun{k: 0.37, elems: nvfp4Block})
				s.WriteString(fmt.Sprint(nf, sat, run) + bitsOf(y))
			}
			return s.String()
		},
		"int8PerTokenHead": func(x []float32, r *rand.Rand) string {
			// vLLM's int8_per_token_head write and read of head vectors of
			// x (the codes' kernel on whole 32s, the Go loop on the rest)
			var s strings.Builder
			q, dq := perHeadQuantizer(perHeadInt8), perHeadDequantizer(perHeadInt8)
			inf := slices.Clone(x) // heads with an Inf (a scale of Inf: Inf·0 is a NaN code) or a NaN
			for i := 5; i < len(inf); i += 37 {
				inf[i] = float32(math.Inf(1 - 2*(i&1)))
			}
			for i := 70; i < len(inf); i += 301 {
				inf[i] = float32(math.NaN())
			}
			for _, d := range []int{32, 64, 96, 40, -64} {
				x := x
				if d < 0 {
					x, d = inf, -d
				}
				for i := 0; i+d <= len(x); i += d {
					dst := make([]byte, d+4)
					nf := q(x[i:i+d], dst)
					y := make([]float32, d)
					dq(dst, y)
					s.WriteString(fmt.Sprint(nf, dst) + bitsOf(y))
				}
			}
			return s.String()
		},
		"nvfp4FourSix": func(x []float32, r *rand.Rand) string {
			// the kernel of nvfp4_4over6's choice against fourSixError, on finite
			// blocks and the output scales candidate gives (0, normal, Inf), the
			// finite ones taken by the kernel
			var s strings.Builder
			for i := 0; i+nvfp4Block <= len(x); i += nvfp4Block {
				blk := x[i : i+nvfp4Block]
				if absMaxBits(blk) >= 0x7f800000 {
					continue
				}
				vecMax := math.Float32frombits(absMaxBits(blk))
				oss := []float32{0, 1, 0.37, 0x1p-126, 0x1.fffffep-126, 3e-38, 6e37, math.MaxFloat32, float32(math.Ldexp(1+r.Float64(), r.Intn(250)-125))}
				for _, k := range []float32{1, 1e-3, 3e4} {
					for _, w := range []nvfp4Writer{nvfp4VLLM4over6, nvfp4TRTLLM} {
						_, _, os4 := w.candidate(vecMax, 1/k, rcpApproxFTZ(1/k), 0.25)
						_, _, os6 := w.candidate(vecMax, 1/k, rcpApproxFTZ(1/k), nvfp4Rcp6)
						oss = append(oss, os4, os6)
					}
				}
				for j, os4 := range oss {
					for _, os6 := range []float32{oss[(j+1)%len(oss)], oss[r.Intn(len(oss))]} {
						if max(math.Float32bits(os4), math.Float32bits(os6)) >= 0x7f800000 {
							continue
						}
						var c [nvfp4Block / 2]byte
						var e4, e6 float32
						var past6 uint32
						var four bool
						if useSIMD && haveFMA {
							e4, e6, past6, four = nvfp4FourSixAVX2(&c, (*[nvfp4Block]float32)(blk), os4, fourSixDQ(os4), os6, fourSixDQ(os6))
						} else {
							e4, e6 = fourSixError(blk, os4), fourSixError(blk, os6)
							four = e4 < e6
							os := os6
							if four {
								os = os4
							}
							for k, v := range blk {
								p := float32(v * os)
								c[k/2] |= nvfp4Code(p) << (4 * (k & 1))
								if p > 6 || p < -6 {
									past6 |= 1 << k
								}
							}
						}
						s.WriteString(fmt.Sprint(math.Float32bits(e4), math.Float32bits(e6), past6, four, c))
					}
				}
			}
			return s.String()
		},
		"mx": func(x []float32, r *rand.Rand) string {
			var s strings.Builder
			for i := 0; i+kvfp4Block <= len(x); i += kvfp4Block {
				blk := make([]byte, kvfp4Bytes)
				nf := sglangQuantizeFP4(x[i:i+kvfp4Block], blk)
				y := make([]float32, kvfp4Block)
				sglangDequantizeFP4(blk, y)
				s.WriteString(fmt.Sprint(nf, blk) + bitsOf(y))
				r.Read(blk)
				sglangDequantizeFP4(blk, y)
				s.WriteString(bitsOf(y))
			}
			for _, el := range []mxElement{mxFP4, mxFP8} {
				quant, dequant := mxQuantizer(el), mxDequantizer(el)
				size := mxBlock + 1
				if el.nibble {
					size = mxBlock/2 + 1
				}
				for i := 0; i+mxBlock <= len(x); i += mxBlock {
					blk := make([]byte, size)
					nf := quant(x[i:i+mxBlock], blk)
					y := make([]float32, mxBlock)
					dequant(blk, y)
					s.WriteString(fmt.Sprint(nf, blk) + bitsOf(y))
					r.Read(blk)
					dequant(blk, y)
					s.WriteString(bitsOf(y))
				}
			}
			return s.String()
		},
		"turboquant": func(x []float32, r *rand.Rand) string {
			var s strings.Builder
			for _, d := range []int{16, 32, 64, 128} {
				for i := 0; i+d <= len(x); i += d {
					for _, b := range []int{3, 4} {
						blk := make([]byte, (d*b+7)/8+2)
						nf := tqKeyQuantize(b, x[i:i+d], blk)
						y := make([]float32, d)
						tqKeyDequantize(b, blk, y)
						s.WriteString(fmt.Sprint(nf, blk) + bitsOf(y))
						vb := make([]byte, (d*b+7)/8+4)
						nf = tqValueQuantize(b, x[i:i+d], vb)
						tqValueDequantize(b, vb, y)
						s.WriteString(fmt.Sprint(nf, vb) + bitsOf(y))
					}
				}
			}
			return s.String()
		},
		"iq4nl": func(x []float32, r *rand.Rand) string {
			var s strings.Builder
			for i := 0; i+GGMLBlock <= len(x); i += GGMLBlock {
				blk := make([]byte, 18)
				nf := llamaQuantizeIQ4NL(x[i:i+GGMLBlock], blk)
				y := make([]float32, GGMLBlock)
				llamaDequantizeIQ4NL(blk, y)
				s.WriteString(fmt.Sprint(nf, blk) + bitsOf(y))
				r.Read(blk) // any scale: NaN, Inf, subnormal
				llamaDequantizeIQ4NL(blk, y)
				s.WriteString(bitsOf(y))
			}
			// the kernels' sums themselves, in float32 (the stored fp16 scale
			// hides most of their last bits), on x and on ordinary values,
			// whose sums the order of addition moves
			nice := make([]float32, 16*GGMLBlock)
			for i := range nice {
				nice[i] = float32(r.NormFloat64())
			}
			for i, x := 0, append(slices.Clone(x[:len(x)/(2*GGMLBlock)*2*GGMLBlock]), nice...); i+2*GGMLBlock <= len(x); i += 2 * GGMLBlock {
				a, b := x[i:i+GGMLBlock], x[i+GGMLBlock:i+2*GGMLBlock]
				ida, oka := iq4nlID(a)
				idb, okb := iq4nlID(b)
				if !oka || !okb {
					continue
				}
				var sums [4]float32
				d := make([]byte, 36)
				if useSIMD {
					sums = iq4nlQuant2AVX2(&d[2], (*[2 * GGMLBlock]float32)(x[i:i+2*GGMLBlock]), ida, idb)
					var one [4]float32
					one[0], one[1] = iq4nlQuantAVX2((*[GGMLBlock / 2]byte)(d[20:36]), (*[GGMLBlock]float32)(a), ida)
					one[2], one[3] = iq4nlQuantAVX2((*[GGMLBlock / 2]byte)(d[20:36]), (*[GGMLBlock]float32)(b), idb)
					if one != sums && !slices.ContainsFunc(sums[:], func(v float32) bool { return v != v }) {
						return fmt.Sprint("iq4nlQuantAVX2 and iq4nlQuant2AVX2 differ: ", one, sums)
					}
				} else {
					for k, blk := range [][]float32{a, b} {
						var q [GGMLBlock]uint8
						for j, v := range blk {
							q[j] = uint8(bestIndexIQ4NL(float32([]float32{ida, idb}[k] * v)))
						}
						sums[2*k], sums[2*k+1] = iq4nlSums(blk, &q)
						for j := 0; j < 16; j++ {
							d[18*k+2+j] = q[j] | q[j+16]<<4
						}
					}
				}
				s.WriteString(fmt.Sprint(bitsOf(sums[:]), d))
			}
			for _, off := range []int{0, GGMLBlock} { // runs of blocks, pairs at either parity
				if len(x) < off {
					continue
				}
				v := x[off : off+(len(x)-off)/GGMLBlock*GGMLBlock]
				run := make([]byte, len(v)/GGMLBlock*18)
				nf, _ := llamaQuantizeIQ4NLRun(v, run, blockRun{elems: GGMLBlock})
				y := make([]float32, len(v))
				llamaDequantizeIQ4NLRun(run, y, blockRun{elems: GGMLBlock})
				s.WriteString(fmt.Sprint(nf, run) + bitsOf(y))
			}
			// blocks whose id is 1 (max -127): each x·id on, just below and
			// just above a midpoint
			var on []float32
			for _, m := range iq4nlMids {
				on = append(on, m, math.Nextafter32(m, -200), math.Nextafter32(m, 200))
			}
			for len(on)%(GGMLBlock-1) != 0 {
				on = append(on, 0)
			}
			for i := 0; i < len(on); i += GGMLBlock - 1 {
				b := append([]float32{-127}, on[i:i+GGMLBlock-1]...)
				blk := make([]byte, 18)
				nf := llamaQuantizeIQ4NL(b, blk)
				s.WriteString(fmt.Sprint(nf, blk))
			}
			for _, m := range iq4nlMids { // each id·v on, just below and just above a midpoint
				for _, v := range []float32{m, math.Nextafter32(m, -200), math.Nextafter32(m, 200)} {
					y := make([]float32, GGMLBlock)
					for j := range y {
						y[j] = v
					}
					var c [GGMLBlock]int8
					if useSIMD {
						tqCodesAVX2(c[:], y, iq4nlMids[:])
					} else {
						for j := range c {
							c[j] = int8(bestIndexIQ4NL(y[j]))
						}
					}
					s.WriteString(fmt.Sprint(c))
				}
			}
			return s.String()
		},
		"int4": func(x []float32, r *rand.Rand) string {
			var s strings.Builder
			for _, d := range []int{8, 16, 64, 128} {
				for i := 0; i+d <= len(x); i += d {
					for _, dt := range []safetensors.DType{safetensors.F32, safetensors.F16} {
						blk := make([]byte, d/2+4)
						nf := vllmInt4Quantize(x[i:i+d], blk, dt)
						y := make([]float32, d)
						vllmInt4Dequantize(blk, y)
						s.WriteString(fmt.Sprint(nf, blk) + bitsOf(y))
					}
				}
			}
			return s.String()
		},
		"e4m3": func(x []float32, r *rand.Rand) string {
			var s strings.Builder
			x = append(x, fp8Ties(fp8E4M3)...)
			for _, mul := range []float32{1, 0.37, 3e4, 0x1p-127, 0x1p20, float32(math.Inf(1))} {
				c := make([]uint8, len(x))
				n := e4m3Encode(c, x, mul)
				for i, v := range x[n:] {
					c[n+i] = fp8E4M3.encode(float32(v * mul))
				}
				s.WriteString(fmt.Sprint(c))
			}
			return s.String()
		},
		"e5m2": func(x []float32, r *rand.Rand) string {
			var s strings.Builder
			x = append(x, fp8Ties(fp8E5M2)...)
			for _, mul := range []float32{1, 0.37, 3e4, 0x1p-127, 0x1p20, float32(math.Inf(1)), 1e-5, 7e3} {
				c := make([]uint8, len(x))
				n := fp8E5M2.encodeKernel(c, x, mul)
				for i, v := range x[n:] {
					c[n+i] = fp8E5M2.encode(float32(v * mul))
				}
				s.WriteString(fmt.Sprint(c))
			}
			return s.String()
		},
		"rn16s": func(x []float32, r *rand.Rand) string {
			v := slices.Clone(x)
			rn16s(v)
			return bitsOf(v)
		},
		"exllama": func(x []float32, r *rand.Rand) string {
			var s strings.Builder
			for bits := 2; bits <= 8; bits++ {
				quant, dequant := exl3Quantizer(bits), exl3Dequantizer(bits)
				size := 4*bits + 2
				for i := 0; i+exl3Group <= len(x); i += exl3Group {
					blk := make([]byte, size)
					nf := quant(x[i:i+exl3Group], blk)
					y := make([]float32, exl3Group)
					dequant(blk, y)
					s.WriteString(fmt.Sprint(nf, blk) + bitsOf(y))
					r.Read(blk[:size-2])
					binary.LittleEndian.PutUint16(blk[size-2:], uint16(r.Intn(0x7c01))) // up to Inf
					dequant(blk, y)
					s.WriteString(bitsOf(y))
				}
			}
			// Finite fp16 scales and Inf (a NaN scale's payload is the F16C read's, either way).
			scales := []uint16{0x3c00, 0x0001, 0x2e66, 0x7bff, 0x7c00, 0xfc00, 0x8000, 0x5640}
			for _, bits := range []int{4, 8} {
				quant, dequant := exl2Quantizer(bits), exl2Dequantizer(bits)
				size := exl2Chunk*bits/8 + 4
				for i := 0; i+exl2Chunk <= len(x); i += exl2Chunk {
					blk := make([]byte, size)
					nf := quant(x[i:i+exl2Chunk], blk)
					y := make([]float32, exl2Chunk)
					dequant(blk, y)
					s.WriteString(fmt.Sprint(nf, blk) + bitsOf(y))
					r.Read(blk[:size-4])
					for g := 0; g < 2; g++ {
						binary.LittleEndian.PutUint16(blk[size-4+2*g:], scales[r.Intn(len(scales))])
					}
					dequant(blk, y)
					s.WriteString(bitsOf(y))
				}
			}
			return s.String()
		},
	}
	return kernels
}

// TestKernelsMatchPortable checks every assembly kernel bit for bit
// against its Go version, including the tails the Go version finishes.
func TestKernelsMatchPortable(t *testing.T) {
	needSIMD(t)
	for name, k := range kernelRuns() {
		t.Run(name, func(t *testing.T) {
			for _, x := range kernelInputs(11) {
				checkKernel(t, name, k, x)
			}
		})
	}
}

// FuzzKernelsMatchPortable runs every kernel on float32s read from the
// fuzzer's bytes, any bit pattern included.
func FuzzKernelsMatchPortable(f *testing.F) {
	needSIMD(f)
	for _, x := range kernelInputs(2)[60:] {
		b := make([]byte, 4*len(x))
		for i, v := range x {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
		f.Add(b)
	}
	kernels := kernelRuns()
	f.Fuzz(func(t *testing.T, b []byte) {
		x := make([]float32, len(b)/4)
		for i := range x {
			x[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		for name, k := range kernels {
			checkKernel(t, name, k, x)
		}
	})
}

// fp8Ties are the values halfway between each two neighbouring finite
// codes of f, both signs: round to nearest even decides each.
func fp8Ties(f *fp8Format) []float32 {
	var t []float32
	for c := 0; c < int(f.maxCode); c++ {
		m := float32((float64(f.decode[c]) + float64(f.decode[c+1])) / 2) // exact in float32
		t = append(t, m, -m)
	}
	return t
}

// checkKernel runs k on x with and without the assembly kernels.
func checkKernel(t *testing.T, name string, k kernelRun, x []float32) {
	t.Helper()
	if name != "absMaxBits" && name != "minMax" && name != "ggml" && name != "transpose" && name != "clampAbs" && name != "rn16s" && name != "nvfp4" && name != "nvfp4FourSix" && name != "iq4nl" && name != "mx" && name != "e4m3" && name != "e5m2" && name != "int4" {
		x = finite(slices.Clone(x)) // the other kernels see finite values only
	}
	seed := int64(len(x)) // the same random codes for both runs
	got := k(slices.Clone(x), rand.New(rand.NewSource(seed)))
	var want string
	withPortable(func() { want = k(slices.Clone(x), rand.New(rand.NewSource(seed))) })
	if got != want {
		at := 0
		for at < min(len(got), len(want)) && got[at] == want[at] {
			at++
		}
		at = max(0, at-100)
		t.Fatalf("%s, len %d: assembly and Go differ\n asm …%.300s\n  go …%.300s", name, len(x), got[at:], want[at:])
	}
}

// finite replaces NaN, Inf and the largest magnitudes, whose scaled values
// or squares overflow, by ordinary values.
func finite(x []float32) []float32 {
	for i, v := range x {
		if !(math.Abs(float64(v)) <= 1e6) {
			x[i] = 1
		}
	}
	return x
}

// TestMinMaxOrdersSignedZeros pins the -0 < +0 order on both paths.
func TestMinMaxOrdersSignedZeros(t *testing.T) {
	negZero := float32(math.Copysign(0, -1))
	x := make([]float32, 24)
	x[17] = negZero
	check := func() {
		lo, hi, ab := minMax(x)
		if math.Float32bits(lo) != 0x80000000 || math.Float32bits(hi) != 0 || ab != 0 {
			t.Fatalf("minMax = %v (%#x), %v, %#x; want -0, +0, 0", lo, math.Float32bits(lo), hi, ab)
		}
	}
	check()
	withPortable(check)
}

// TestCompressSIMDMatchesPortable compresses a cache with every preset and
// the other stages on, with the assembly kernels and without: the stored
// bytes, the reconstruction and the report must be identical.
func TestCompressSIMDMatchesPortable(t *testing.T) {
	needSIMD(t)
	src := randomCache(5, 2, 2, 77, 64)
	half := func(dt safetensors.DType, seed int64) *safetensors.File {
		f := randomCache(seed, 1, 2, 50, 32)
		for i := range f.Tensors {
			x, _ := f.Tensors[i].Float32s(nil)
			f.Tensors[i], _ = safetensors.NewFloatTensor(f.Tensors[i].Name, dt, f.Tensors[i].Shape, x)
		}
		return f
	}
	f16, bf16 := half(safetensors.F16, 6), half(safetensors.BF16, 8)
	specs := append(PresetNames(), "k=asym3/g48/channel,v=sym5/g40", "k=sym4/g64/rot/out0.01,v=asym4/g64/rot/res16",
		"k=asym2/g32/channel/res8,v=sym6/g16/out0.02", "int4+lossless")
	for _, name := range specs {
		spec, err := ParseSpec(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []*safetensors.File{src, f16, bf16} {
			cfg := Config{Spec: spec, Thresholds: DefaultThresholds}
			got, err := Compress(f, cfg)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			var want *Result
			withPortable(func() { want, err = Compress(f, cfg) })
			if err != nil {
				t.Fatal(err)
			}
			var gb, wb bytes.Buffer
			if err := safetensors.Encode(&gb, got.Compressed); err != nil {
				t.Fatal(err)
			}
			if err := safetensors.Encode(&wb, want.Compressed); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(gb.Bytes(), wb.Bytes()) {
				t.Errorf("%s: compressed files differ", name)
			}
			for i := range got.Restored.Tensors {
				if !bytes.Equal(got.Restored.Tensors[i].Data, want.Restored.Tensors[i].Data) {
					t.Errorf("%s: tensor %s: reconstructions differ", name, got.Restored.Tensors[i].Name)
				}
			}
			gr, _ := json.Marshal(got.Report)
			wr, _ := json.Marshal(want.Report)
			if !bytes.Equal(gr, wr) {
				t.Errorf("%s: reports differ\n asm %.400s\n  go %.400s", name, gr, wr)
			}
			back, _, err := Decompress(got.Compressed, 2)
			if err != nil {
				t.Fatal(err)
			}
			for i := range back.Tensors {
				if !bytes.Equal(back.Tensors[i].Data, got.Restored.Tensors[i].Data) {
					t.Errorf("%s: decompressed tensor %s differs from Compress's reconstruction", name, back.Tensors[i].Name)
				}
			}
		}
	}
}

func BenchmarkKernels(b *testing.B) {
	x := make([]float32, 1<<14)
	y := make([]float32, len(x))
	r := rand.New(rand.NewSource(1))
	for i := range x {
		x[i] = float32(r.NormFloat64())
		y[i] = x[i] + float32(r.NormFloat64()*0.01)
	}
	codes := make([]int8, len(x))
	packed := make([]byte, len(x))
	kernels := []struct {
		name string
		fn   func()
	}{
		{"QuantizeGroup", func() {
			for i := 0; i < len(x); i += 64 {
				QuantizeGroup(x[i:i+64], 4, codes[i:i+64])
			}
		}},
		{"QuantizeGroupAsym", func() {
			for i := 0; i < len(x); i += 64 {
				QuantizeGroupAsym(x[i:i+64], 4, codes[i:i+64])
			}
		}},
		{"DequantizeGroup", func() {
			for i := 0; i < len(x); i += 64 {
				DequantizeGroup(y[i:i+64], codes[i:i+64], 0x2c00)
			}
		}},
		{"Accumulator.Add", func() { var a Accumulator; a.Add(x, y) }},
		{"Pack4", func() { Pack(packed, codes, 4) }},
		{"RotateRows64", func() { RotateRows(y, 64) }},
	}
	for _, k := range kernels {
		for _, simd := range []bool{true, false} {
			if simd && !haveSIMD {
				continue
			}
			name := k.name + "/go"
			if simd {
				name = k.name + "/avx2"
			}
			b.Run(name, func(b *testing.B) {
				saved := useSIMD
				useSIMD = simd
				defer func() { useSIMD = saved }()
				b.SetBytes(int64(4 * len(x)))
				for i := 0; i < b.N; i++ {
					k.fn()
				}
			})
		}
	}
}

// TestSharedVectorsPortable checks the portable kernels against the shared
// vectors (the gguf package's blocks among them), as a CPU without AVX2 runs.
func TestSharedVectorsPortable(t *testing.T) {
	withPortable(func() {
		TestSharedVectors(t)
		TestSharedVectorsV2(t)
	})
}

// TestClampKeepsNaNAndSaturates pins clampAbs on both paths where the
// vector instructions and Go's min/max could differ: NaNs of either sign
// with payloads, infinities and signed zeros.
func TestClampKeepsNaNAndSaturates(t *testing.T) {
	in := []uint32{0x7fc00000, 0xffc00000, 0x7f800001, 0xff812345, 0x7f800000, 0xff800000, 0, 0x80000000,
		0x477fe000, 0x477ff000, 0xc77ff000, 0x3f800000, 0x7f7fffff, 0xff7fffff, 0x00000001, 0x80000001}
	x := make([]float32, len(in))
	for i, b := range in {
		x[i] = math.Float32frombits(b)
	}
	for _, lim := range []float32{65504, 0x1.fep127} {
		got := slices.Clone(x)
		clampAbs(got, lim)
		want := slices.Clone(x)
		withPortable(func() { clampAbs(want, lim) })
		for i := range x {
			g, w := math.Float32bits(got[i]), math.Float32bits(want[i])
			if g != w {
				t.Errorf("lim %g, %#08x: asm %#08x, Go %#08x", lim, in[i], g, w)
			}
			if v := float64(x[i]); !math.IsNaN(v) && math.Abs(float64(got[i])) > float64(lim) {
				t.Errorf("lim %g: %#08x not clamped: %g", lim, in[i], got[i])
			}
		}
	}
}
