package console

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"loam.dev/loam/internal/store/sqlite"
)

// TestSessionsKept: with a store (a real SQLite file), a session outlives
// its console (a restart of the daemon), and its logout and its expiry
// are kept too.
func TestSessionsKept(t *testing.T) {
	path := filepath.Join(t.TempDir(), "loam.db")
	// open is a restart: the store opened again, a new console on it.
	open := func(now time.Time) *Console {
		t.Helper()
		st, err := sqlite.Open(t.Context(), path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		c, err := New(t.Context(), Config{Keys: testKeys(), Sessions: st}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		c.now = func() time.Time { return now }
		return c
	}
	now := time.Now()
	first := open(now)
	cookie, csrf := login(t, first)
	stay, stayCSRF := login(t, first)

	second := open(now.Add(time.Hour))
	if err := authorized(second, cookie, csrf); err != nil {
		t.Fatalf("after a restart the session is refused: %v", err)
	}
	if err := authorized(second, cookie, stayCSRF); err == nil {
		t.Error("after a restart the session takes another session's CSRF token")
	}
	r := httptest.NewRequest("POST", "/console/logout", nil)
	r.AddCookie(cookie)
	r.Header.Set(CSRFHeader, csrf)
	w := httptest.NewRecorder()
	second.ServeHTTP(w, r)
	if w.Code != http.StatusNoContent {
		t.Fatalf("logout: %d %s", w.Code, w.Body)
	}

	third := open(now.Add(2 * time.Hour))
	if err := authorized(third, cookie, csrf); err == nil {
		t.Error("a session logged out of before a restart opens the API after it")
	}
	if err := authorized(third, stay, stayCSRF); err != nil {
		t.Errorf("the other session is refused after two restarts: %v", err)
	}
	past := open(now.Add(SessionTTL + time.Minute))
	if err := authorized(past, stay, stayCSRF); err == nil {
		t.Error("a session past its TTL opens the API after a restart")
	}
}

// TestSessionsShared: two nodes' consoles on one store (Shared), running
// at once: a session made on one opens the other at once, and one logged
// out of on the other is refused by both.
func TestSessionsShared(t *testing.T) {
	path := filepath.Join(t.TempDir(), "loam.db")
	node := func() *Console {
		t.Helper()
		st, err := sqlite.Open(t.Context(), path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		c, err := New(t.Context(), Config{Keys: testKeys(), Sessions: st, Shared: true}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := node(), node()
	cookie, csrf := login(t, a)
	if err := authorized(b, cookie, csrf); err != nil {
		t.Fatalf("a session made on node a, on node b: %v", err)
	}
	r := httptest.NewRequest("POST", "/console/logout", nil)
	r.AddCookie(cookie)
	r.Header.Set(CSRFHeader, csrf)
	w := httptest.NewRecorder()
	b.ServeHTTP(w, r)
	if w.Code != http.StatusNoContent {
		t.Fatalf("logout on b: %d %s", w.Code, w.Body)
	}
	if err := authorized(a, cookie, csrf); err == nil {
		t.Error("a session logged out of on node b still opens node a")
	}
}

// authorized is c's answer to an API call made with the session's cookie
// and CSRF token.
func authorized(c *Console, cookie *http.Cookie, csrf string) error {
	r := httptest.NewRequest("POST", "/v1/sandboxes", nil)
	r.AddCookie(cookie)
	r.Header.Set(CSRFHeader, csrf)
	_, _, _, err := c.Authorize(r)
	return err
}
