package compression

// wireGroupsAMD64 is wireDecodeGroups's loop in assembly (wire_amd64.s).
//
//go:noescape
func wireGroupsAMD64(a *wireGroupArgs)

// wireEncodeAMD64 is encodeChunk's loop over groups of four in assembly
// (wire_amd64.s).
//
//go:noescape
func wireEncodeAMD64(a *wireEncArgs)
