// Package version says which loam this binary is, for loam --version, loam
// version and the MCP server's handshake.
package version

import (
	"runtime/debug"
	"strings"
)

// Version, when set at link time, is the binary's version:
//
//	go build -ldflags "-X loam.dev/loam/internal/version.Version=$(git describe --tags --always --dirty)" ./cmd/loam
//
// scripts/setup sets it. When it is empty, String reads the build's own
// information instead.
var Version string

// String is the binary's version: Version when the link set it; else the
// main module's version as go install stamps it (v1.2.3); else, for a
// go build in a git checkout, the commit, "devel-" and 12 hex digits
// (with "-dirty" when the tree had changes); "(devel)" when nothing says.
func String() string {
	if Version != "" {
		return Version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(devel)"
	}
	return fromBuildInfo(bi)
}

// fromBuildInfo is String's reading of bi.
func fromBuildInfo(bi *debug.BuildInfo) string {
	if v := bi.Main.Version; v != "" && v != "(devel)" && !strings.HasPrefix(v, "v0.0.0-") {
		return v
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		if v := bi.Main.Version; v != "" {
			return v
		}
		return "(devel)"
	}
	v := "devel-" + rev[:min(12, len(rev))]
	if dirty {
		v += "-dirty"
	}
	return v
}
