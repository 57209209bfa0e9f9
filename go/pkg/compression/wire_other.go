//go:build !amd64

package compression

func wireGroupsAMD64(*wireGroupArgs) { noSIMD() }

func wireEncodeAMD64(*wireEncArgs) { noSIMD() }
