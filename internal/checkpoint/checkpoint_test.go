package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// cps makes checkpoints from ids; a trailing "*" marks one taken from
// inside the sandbox (or kept by a restore it asked for).
func cps(spec string) []*store.Checkpoint {
	var out []*store.Checkpoint
	for _, f := range strings.Fields(spec) {
		id, inside := strings.CutSuffix(f, "*")
		out = append(out, &store.Checkpoint{Checkpoint: api.Checkpoint{ID: id, Auto: strings.HasPrefix(id, "auto-"), Inside: inside}})
	}
	return out
}

func ids(cs []*store.Checkpoint) string {
	var s []string
	for _, c := range cs {
		s = append(s, c.ID)
	}
	return strings.Join(s, " ")
}

func TestIDs(t *testing.T) {
	if UserID(3) != "v3" || AutoID(12) != "auto-12" {
		t.Fatal(UserID(3), AutoID(12))
	}
	re := regexp.MustCompile(`^checkpoint-[0-9a-f]{6}$`)
	for range 20 {
		if n := NewName(); !re.MatchString(n) || CheckName(n) != nil {
			t.Fatalf("generated name %q", n)
		}
	}
}

func TestCheckName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"good", true}, {"before-upgrade.2", true}, {"A_1", true},
		{"", false}, {"-x", false}, {"has space", false}, {strings.Repeat("a", 64), false},
		{"v1", false}, {"auto-3", false}, {"v1a", true}, {"auto-x", true},
	} {
		err := CheckName(tc.name)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, api.ErrInvalid)) {
			t.Errorf("CheckName(%q) = %v", tc.name, err)
		}
	}
}

func TestLimit(t *testing.T) {
	for _, tc := range []struct {
		have   string
		by     Caller
		limits Limits
		ok     bool
	}{
		{"", Owner, Limits{10, 10}, true},
		{"v1 v2", Owner, Limits{3, 3}, true},
		{"v1 v2 v3", Owner, Limits{3, 3}, false},
		{"v1 v2 auto-1 auto-2 auto-3", Owner, Limits{3, 3}, true}, // automatic ones do not count
		{"v1 v2 v3 v4", Owner, Limits{0, 1}, true},                // 0: no limit
		// Each share counts only its own: a sandbox that filled its
		// share does not stop its owner, nor the other way round.
		{"v1* v2* v3*", Owner, Limits{3, 3}, true},
		{"v1* v2* v3*", Inside, Limits{3, 3}, false},
		{"v1 v2 v3", Inside, Limits{3, 3}, true},
		{"v1 v2* v3", Inside, Limits{10, 1}, false},
		{"v1 v2* v3*", Inside, Limits{1, 0}, true},
	} {
		err := CheckLimit(tc.by, cps(tc.have), tc.limits)
		if (err == nil) != tc.ok || (err != nil && (!errors.Is(err, api.ErrLimit) || !strings.Contains(err.Error(), "remove one"))) {
			t.Errorf("CheckLimit(%d, %q, %+v) = %v", tc.by, tc.have, tc.limits, err)
		}
	}
}

// TestPruneAutosBy: each share's restores prune only that share's
// automatic checkpoints, so that a sandbox restoring itself often never
// pushes out its owner's undo points, nor the owner's its own.
func TestPruneAutosBy(t *testing.T) {
	for _, tc := range []struct {
		have  string
		by    Caller
		prune string
	}{
		{"auto-1 auto-2 auto-3* auto-4* auto-5* auto-6* auto-7* auto-8", Owner, ""},
		{"auto-1 auto-2 auto-3* auto-4* auto-5* auto-6* auto-7* auto-8*", Inside, "auto-3"},
		{"auto-1 auto-2 auto-3 auto-4 auto-5 auto-6* auto-7", Owner, "auto-1"},
		{"auto-1 auto-2 auto-3 auto-4 auto-5 auto-6* auto-7", Inside, ""},
	} {
		if got := ids(PruneAutosBy(tc.by, cps(tc.have), KeepAuto)); got != tc.prune {
			t.Errorf("PruneAutosBy(%d, %q) = %q, want %q", tc.by, tc.have, got, tc.prune)
		}
	}
}

func TestPruneAutos(t *testing.T) {
	for _, tc := range []struct{ have, prune string }{
		{"v1 auto-1 auto-2", ""},
		{"v1 auto-1 auto-2 auto-3 auto-4 auto-5", ""},
		{"v1 auto-1 v2 auto-2 auto-3 auto-4 auto-5 auto-6", "auto-1"},
		{"auto-1 auto-2 auto-3 auto-4 auto-5 auto-6 auto-7 v9", "auto-1 auto-2"},
	} {
		if got := ids(PruneAutos(cps(tc.have), KeepAuto)); got != tc.prune {
			t.Errorf("PruneAutos(%q) = %q, want %q", tc.have, got, tc.prune)
		}
	}
}

func TestCheckComment(t *testing.T) {
	if CheckComment("site up, state v1") != nil || CheckComment("two\nlines") == nil || CheckComment(strings.Repeat("x", 1025)) == nil {
		t.Fatal("comment rules")
	}
}

func TestSyncTree(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cp")
	if err := os.MkdirAll(filepath.Join(dir, "mem"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "mem", "pages"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := SyncTree(dir); err != nil {
		t.Fatal(err)
	}
	if err := SyncTree(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("SyncTree of a missing dir succeeded")
	}
}
