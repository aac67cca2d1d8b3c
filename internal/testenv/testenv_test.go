package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// recorder is a testing.TB that records how a helper ended it. Skipf and
// Fatalf stop the caller, as testing's do, by a panic that run recovers.
type recorder struct {
	testing.TB
	skipped, failed string
}

type stopped struct{}

func (r *recorder) Helper() {}
func (r *recorder) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
	panic(stopped{})
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	panic(stopped{})
}

// run calls f with a recorder and returns it once f returns or stops.
func run(t *testing.T, f func(tb testing.TB)) *recorder {
	r := &recorder{TB: t}
	func() {
		defer func() {
			if v := recover(); v != nil {
				if _, ok := v.(stopped); !ok {
					panic(v)
				}
			}
		}()
		f(r)
	}()
	return r
}

func TestMissing(t *testing.T) {
	t.Setenv("CI", "")
	r := run(t, func(tb testing.TB) { Missing(tb, "needs %s", "x") })
	if r.skipped != "needs x" || r.failed != "" {
		t.Errorf("outside CI: skipped %q, failed %q; want a skip", r.skipped, r.failed)
	}
	t.Setenv("CI", "true")
	r = run(t, func(tb testing.TB) { Missing(tb, "needs %s", "x") })
	if r.failed != "needs x; CI=true, so this is a failure" || r.skipped != "" {
		t.Errorf("under CI: skipped %q, failed %q; want a failure", r.skipped, r.failed)
	}
	t.Setenv("CI", "false")
	if CI() {
		t.Error("CI() with CI=false")
	}
}

func TestTool(t *testing.T) {
	t.Setenv("CI", "true")
	r := run(t, func(tb testing.TB) {
		if p := Tool(tb, "sh"); p == "" {
			t.Error("Tool(sh) is empty")
		}
	})
	if r.failed != "" || r.skipped != "" {
		t.Errorf("Tool(sh): skipped %q, failed %q", r.skipped, r.failed)
	}
	r = run(t, func(tb testing.TB) {
		Tool(tb, "loam-no-such-tool")
		t.Error("Tool of a missing tool returned")
	})
	if r.failed == "" {
		t.Error("Tool of a missing tool under CI did not fail")
	}
}

func TestRootAndRunsc(t *testing.T) {
	t.Setenv("CI", "")
	fake := filepath.Join(t.TempDir(), "runsc")
	if err := os.WriteFile(fake, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("LOAM_RUNSC", "")
	var got string
	r := run(t, func(tb testing.TB) { got = Runsc(tb, filepath.Join(t.TempDir(), "none"), fake) })
	if os.Geteuid() != 0 {
		if r.skipped != "needs root" {
			t.Errorf("Runsc without root: skipped %q, failed %q; want a skip for root", r.skipped, r.failed)
		}
		return
	}
	if got != fake || r.skipped != "" || r.failed != "" {
		t.Errorf("Runsc: %q (skipped %q, failed %q), want the pinned %s", got, r.skipped, r.failed, fake)
	}
	t.Setenv("LOAM_RUNSC", "/from/env")
	if r := run(t, func(tb testing.TB) { got = Runsc(tb, fake) }); got != "/from/env" {
		t.Errorf("Runsc with LOAM_RUNSC: %q (%+v), want /from/env", got, r)
	}
}
