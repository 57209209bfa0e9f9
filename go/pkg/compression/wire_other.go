//go:build !amd64

package compression

func wireGroupsAMD64(*wireGroupArgs) { noSIMD() }

func wireEncodeAMD64(*wireEncArgs) { noSIMD() }

const haveWireAVX512 = false

func wireDecode32(*wireDecode32Args) { noSIMD() }

func wireEncodeWideAMD64(*wireEncWideArgs) { noSIMD() }

func wireEncode32(*wireEnc32Args) { noSIMD() }

func wireFill32([]uint32, uint32) { noSIMD() }

func wireUnpack4AVX2([]uint8, []byte) { noSIMD() }

func wireUnpack2AVX2([]uint8, []byte) { noSIMD() }

func wireUnpack3AVX2([]uint8, []byte) { noSIMD() }
