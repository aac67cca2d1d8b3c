// Package testenv says once what a test does when the machine lacks
// something it needs (root, runsc, a tool): it is skipped on a developer's
// machine, and it fails under CI=true, where a skip would pass a run that
// tested nothing; and the small pieces the tests of many packages share
// (SyncBuffer).
//
// It is imported by tests only.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// CI reports whether the tests run in CI (CI=true), where whatever a test
// needs must be there.
func CI() bool { return os.Getenv("CI") == "true" }

// Missing ends tb because what it needs is missing, as the message says:
// it skips tb, or fails it under CI.
func Missing(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if CI() {
		tb.Fatalf("%s; CI=true, so this is a failure", fmt.Sprintf(format, args...))
	}
	tb.Skipf(format, args...)
}

// Root ends tb (see Missing) unless it runs as root.
func Root(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		Missing(tb, "needs root")
	}
}

// Tool is the path of the program name (looked up on PATH, then in
// /usr/sbin, which a user's PATH may lack), or it ends tb (see Missing).
func Tool(tb testing.TB, name string) string {
	tb.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	p, err := exec.LookPath("/usr/sbin/" + name)
	if err != nil {
		Missing(tb, "needs %s (scripts/setup installs it)", name)
	}
	return p
}

// Runsc is the runsc binary to test with, and ends tb (see Missing)
// unless it runs as root with one: $LOAM_RUNSC, else the first of pinned
// (the builds a caller knows of) that exists, else runsc on PATH.
func Runsc(tb testing.TB, pinned ...string) string {
	tb.Helper()
	Root(tb)
	if p := os.Getenv("LOAM_RUNSC"); p != "" {
		return p
	}
	for _, p := range pinned {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, err := exec.LookPath("runsc")
	if err != nil {
		Missing(tb, "no runsc: set LOAM_RUNSC or run scripts/setup")
	}
	return p
}
