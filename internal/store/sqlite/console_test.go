package sqlite

import (
	"path/filepath"
	"testing"
	"time"

	"loam.dev/loam/internal/store"
)

// TestConsoleSessions: sessions are kept across a reopen, listed while
// they last, replaced by key, and deleted by key or once expired.
func TestConsoleSessions(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "loam.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	for _, cs := range []*store.ConsoleSession{
		{Key: "a", CSRFToken: "ca", ExpiresAt: now.Add(2 * time.Hour)},
		{Key: "b", CSRFToken: "cb", ExpiresAt: now.Add(time.Hour)},
		{Key: "old", CSRFToken: "co", ExpiresAt: now.Add(-time.Minute)},
		{Key: "a", CSRFToken: "ca2", ExpiresAt: now.Add(3 * time.Hour)},
	} {
		if err := s.PutConsoleSession(ctx, cs); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(ctx, path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	list := func() string {
		t.Helper()
		got, err := s.ListConsoleSessions(ctx, now)
		if err != nil {
			t.Fatal(err)
		}
		var out string
		for _, cs := range got {
			out += cs.Key + "=" + cs.CSRFToken + "@" + cs.ExpiresAt.Sub(now).String() + " "
		}
		return out
	}
	if got := list(); got != "b=cb@1h0m0s a=ca2@3h0m0s " {
		t.Errorf("after a reopen: %q", got)
	}
	if err := s.DeleteConsoleSessions(ctx, now, "b", "nope"); err != nil {
		t.Fatal(err)
	}
	if got := list(); got != "a=ca2@3h0m0s " {
		t.Errorf("after deleting b: %q", got)
	}
	var n int
	if err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM console_sessions`).Scan(&n); err != nil || n != 1 {
		t.Errorf("%d rows (%v) after a delete that also prunes, want 1: the expired one stays", n, err)
	}
	if err := s.DeleteConsoleSessions(ctx, now.Add(4*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := list(); got != "" {
		t.Errorf("after everything expired: %q", got)
	}
}
