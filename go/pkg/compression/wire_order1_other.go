//go:build !amd64

package compression

func wireDecodeOrder1(*wireOrder1Args) { noSIMD() }

func wireEncodeOrder1(*wireEncOrder1Args) { noSIMD() }
