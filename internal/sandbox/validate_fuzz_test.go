package sandbox

import (
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/secret"
	"loam.dev/loam/internal/template"
)

// safeComponent reports whether s can be one component of a host path, as
// every name the API takes ends up being (a sandbox's directory, a
// template's, a checkpoint's, a service's file in the agent).
func safeComponent(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/\x00\\") &&
		filepath.IsLocal(s) && filepath.Base(s) == s && utf8.ValidString(s) && len(s) <= 255
}

// wantInvalid fails unless err is nil or the API's invalid.
func wantInvalid(t *testing.T, what string, err error) {
	t.Helper()
	var ae *api.Error
	if err != nil && (!errors.As(err, &ae) || ae.Code != api.CodeInvalid) {
		t.Fatalf("%s: %v, want nil or an invalid error", what, err)
	}
}

// FuzzNames checks the validation of every name and id the API takes: what
// is accepted is a safe path component of the documented characters (and
// a sandbox name a DNS label, never an id); what is refused is invalid,
// the user's error.
func FuzzNames(f *testing.F) {
	for _, s := range []string{
		"web", "a", "my-box-2", "sb-000000000001", "sb-abcdefghijkl", "Web", "-web", "web-", "we--b",
		strings.Repeat("a", 63), strings.Repeat("a", 64), "..", ".", "a/b", "a\x00b", "é", "v1", "auto-3",
		"warm.v2", "_SECRET", "team/tier", "1abc", "", " ", "a.b_c-d", "/etc/hosts", "tmp\\x", ".tmp-import-x", "s-abc123", "s-../x",
	} {
		f.Add(s, 40, "10m", 1.0, 512, "acme")
	}
	f.Add("box", 0, "0", math.NaN(), -1, "")
	f.Add("box", 63, "1ns", math.Inf(1), 1<<40, "a--b")
	f.Fuzz(func(t *testing.T, s string, max int, idle string, cpus float64, mib int, org string) {
		if err := checkName(s, max); err == nil {
			if !ValidName(s) || len(s) > max || len(s) > 63 || !safeComponent(s) || idRE.MatchString(s) ||
				strings.HasSuffix(s, "-") || strings.Contains(s, "--") || s[0] < 'a' || s[0] > 'z' {
				t.Fatalf("sandbox name %q (max %d) accepted", s, max)
			}
		} else {
			wantInvalid(t, "checkName", err)
		}
		if ValidName(s) && !safeComponent(s) {
			t.Fatalf("ValidName(%q) but not a path component", s)
		}
		if err := CheckOrg(org); err == nil && (!ValidName(org) || MaxNameLen(org) < len("sb-000000000001")) {
			t.Fatalf("org %q accepted", org)
		}
		if err := template.CheckName(s); err == nil {
			if !safeComponent(s) || strings.HasPrefix(s, ".") || len(s) > 63 {
				// A leading "." marks a template's unfinished data, which
				// the sweep at start-up removes.
				t.Fatalf("template name %q accepted", s)
			}
		} else {
			wantInvalid(t, "template.CheckName", err)
		}
		if err := checkpoint.CheckName(s); err == nil {
			if !safeComponent(s) || strings.HasPrefix(s, ".") || len(s) > 63 {
				t.Fatalf("checkpoint name %q accepted", s)
			}
		} else {
			wantInvalid(t, "checkpoint.CheckName", err)
		}
		if err := secret.CheckName(s); err == nil && (!safeComponent(s) || strings.HasPrefix(s, ".")) {
			t.Fatalf("secret name %q accepted", s)
		} else {
			wantInvalid(t, "secret.CheckName", err)
		}
		if api.ValidServiceName(s) && !safeComponent(s) {
			t.Fatalf("service name %q accepted", s)
		}
		if api.ValidSessionID(s) && (!safeComponent(s) || !strings.HasPrefix(s, "s-")) {
			t.Fatalf("session id %q accepted", s)
		}
		if api.ValidLabelKey(s) && (len(s) > 63 || !utf8.ValidString(s) || strings.ContainsAny(s, "\x00=,")) {
			t.Fatalf("label key %q accepted", s)
		}
		if err := api.CheckFilePath("path", s); err == nil && (!strings.HasPrefix(s, "/") || strings.ContainsRune(s, 0)) {
			t.Fatalf("file path %q accepted", s)
		} else {
			wantInvalid(t, "api.CheckFilePath", err)
		}
		wantInvalid(t, "checkEnv", checkEnv(map[string]string{s: idle}))
		wantInvalid(t, "checkLabels", checkLabels(map[string]string{s: idle}))
		if err := checkIdle(idle, time.Minute); err == nil && idle != "" {
			if d, perr := time.ParseDuration(idle); perr != nil || d != 0 && d < time.Minute {
				t.Fatalf("idle %q accepted", idle)
			}
		} else {
			wantInvalid(t, "checkIdle", err)
		}
		r := api.Resources{CPUs: cpus, MemoryMiB: mib, DiskMiB: mib}
		if err := checkResources(r); err == nil {
			if math.IsNaN(cpus) || cpus < 0 || cpus > maxCPUs || mib != 0 && (mib < minMemoryMiB || mib > maxMemoryMiB) {
				t.Fatalf("resources %+v accepted", r)
			}
		} else {
			wantInvalid(t, "checkResources", err)
		}
		wantInvalid(t, "checkPort", checkPort(mib))
	})
}
