package version

import (
	"runtime/debug"
	"testing"
)

func TestString(t *testing.T) {
	defer func(v string) { Version = v }(Version)
	Version = "v1.4.0-3-gabcdef1"
	if got := String(); got != "v1.4.0-3-gabcdef1" {
		t.Errorf("String() with a link-time version = %q", got)
	}
	Version = ""
	if got := String(); got == "" {
		t.Error("String() without a link-time version is empty")
	}
}

func TestFromBuildInfo(t *testing.T) {
	rev := []debug.BuildSetting{{Key: "vcs.revision", Value: "3c4798b1234567890abcdef"}, {Key: "vcs.modified", Value: "false"}}
	dirty := []debug.BuildSetting{{Key: "vcs.revision", Value: "3c4798b1234567890abcdef"}, {Key: "vcs.modified", Value: "true"}}
	tests := []struct {
		name     string
		version  string
		settings []debug.BuildSetting
		want     string
	}{
		{"go install of a tag", "v1.2.3", rev, "v1.2.3"},
		{"go build in a checkout", "(devel)", rev, "devel-3c4798b12345"},
		{"with changes", "(devel)", dirty, "devel-3c4798b12345-dirty"},
		{"a pseudo-version", "v0.0.0-20261203185000-3c4798b12345+dirty", dirty, "devel-3c4798b12345-dirty"},
		{"nothing known", "(devel)", nil, "(devel)"},
		{"no version at all", "", nil, "(devel)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bi := &debug.BuildInfo{Main: debug.Module{Version: tt.version}, Settings: tt.settings}
			if got := fromBuildInfo(bi); got != tt.want {
				t.Errorf("fromBuildInfo = %q, want %q", got, tt.want)
			}
		})
	}
}
