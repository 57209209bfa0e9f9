package compression

// wireDecodeOrder1 is wireDecode32 for mode 4's token rows: each lane's
// table row from its channel's base and the code d bytes before it
// (wire_order1_amd64.s; AVX-512F).
//
//go:noescape
func wireDecodeOrder1(a *wireOrder1Args)

// wireEncodeOrder1 is wireEncode32 for mode 4's token rows, from the
// highest group down (wire_order1_amd64.s; AVX-512F).
//
//go:noescape
func wireEncodeOrder1(a *wireEncOrder1Args)
