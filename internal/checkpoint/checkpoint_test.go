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

func cps(spec string) []*store.Checkpoint {
	var out []*store.Checkpoint
	for _, id := range strings.Fields(spec) {
		out = append(out, &store.Checkpoint{Checkpoint: api.Checkpoint{ID: id, Auto: strings.HasPrefix(id, "auto-")}})
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
		have  string
		limit int
		ok    bool
	}{
		{"", 10, true},
		{"v1 v2", 3, true},
		{"v1 v2 v3", 3, false},
		{"v1 v2 auto-1 auto-2 auto-3", 3, true}, // automatic ones do not count
		{"v1 v2 v3 v4", 0, true},                // 0: no limit
	} {
		err := CheckLimit(cps(tc.have), tc.limit)
		if (err == nil) != tc.ok || (err != nil && (!errors.Is(err, api.ErrLimit) || !strings.Contains(err.Error(), "remove one first"))) {
			t.Errorf("CheckLimit(%q, %d) = %v", tc.have, tc.limit, err)
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
