package compression

// PackedLen is the number of bytes n codes of the given width occupy.
func PackedLen(n, bits int) int { return (n*bits + 7) / 8 }

// Pack stores codes as a little-endian bit stream: code i occupies bits
// [i*bits, (i+1)*bits) in two's complement, bit k in byte k/8 at position
// k%8. For 4 bits that is two codes a byte, the first in the low nibble.
// dst must hold PackedLen(len(codes), bits) bytes.
func Pack(dst []byte, codes []int8, bits int) {
	switch bits {
	case 8:
		for i, q := range codes {
			dst[i] = byte(q)
		}
		return
	case 4:
		pack4(dst, codes)
		return
	case 2:
		pack2(dst, codes)
		return
	}
	mask := uint32(1)<<bits - 1
	var acc uint32
	nacc := 0
	j := 0
	for _, q := range codes {
		acc |= (uint32(q) & mask) << nacc
		nacc += bits
		for nacc >= 8 {
			dst[j] = byte(acc)
			j++
			acc >>= 8
			nacc -= 8
		}
	}
	if nacc > 0 {
		dst[j] = byte(acc)
	}
}

// Unpack is the inverse of Pack: it fills codes from src.
func Unpack(codes []int8, src []byte, bits int) {
	switch bits {
	case 8:
		for i := range codes {
			codes[i] = int8(src[i])
		}
		return
	case 4:
		n := len(codes) &^ 1
		src := src[:(len(codes)+1)/2]
		for i := 0; i < n; i += 2 {
			b := src[i/2]
			codes[i], codes[i+1] = int8(b<<4)>>4, int8(b)>>4
		}
		if n < len(codes) {
			codes[n] = int8(src[n/2]<<4) >> 4
		}
		return
	}
	shift := 8 - bits
	var acc uint32
	nacc := 0
	j := 0
	for i := range codes {
		for nacc < bits {
			acc |= uint32(src[j]) << nacc
			j++
			nacc += 8
		}
		codes[i] = int8(byte(acc)<<shift) >> shift
		acc >>= bits
		nacc -= bits
	}
}
