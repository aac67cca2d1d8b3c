package console

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/sqlite"
)

// TestLoginWithKey: an API key of any scope logs in, and the session is
// that key's (its org, id and scope, which the page shows); revoking the
// key ends the session; every login, and every wrong one, is in the audit
// log with the key that made it.
func TestLoginWithKey(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "loam.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	keys := auth.NewKeys("default", testToken, st, slog.New(slog.DiscardHandler))
	c, err := New(ctx, Config{Keys: keys, Audit: st, Sessions: st}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	k, err := keys.Create(ctx, keys.Admin(), "default", api.CreateKey{Name: "watcher", Scope: api.ScopeRead})
	if err != nil {
		t.Fatal(err)
	}
	post := func(token string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/console/login", strings.NewReader(`{"token":"`+token+`"}`))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		c.ServeHTTP(w, r)
		return w
	}
	if w := post(api.KeyPrefix + "nosuchkey"); w.Code != http.StatusUnauthorized {
		t.Fatalf("login with a wrong key: %d %s", w.Code, w.Body)
	}
	w := post(k.Secret)
	var info SessionInfo
	if err := json.Unmarshal(w.Body.Bytes(), &info); w.Code != http.StatusOK || err != nil {
		t.Fatalf("login with a read key: %d %s", w.Code, w.Body)
	}
	if info.Scope != api.ScopeRead || info.Key != k.ID || info.Org != "default" {
		t.Errorf("the read key's session: %+v", info)
	}
	cookie := w.Result().Cookies()[0]
	session := func() (*httptest.ResponseRecorder, SessionInfo) {
		r := httptest.NewRequest("GET", "/console/session", nil)
		r.AddCookie(cookie)
		w := httptest.NewRecorder()
		c.ServeHTTP(w, r)
		var info SessionInfo
		_ = json.Unmarshal(w.Body.Bytes(), &info)
		return w, info
	}
	if w, got := session(); w.Code != http.StatusOK || got.Scope != api.ScopeRead || got.Key != k.ID {
		t.Errorf("GET /console/session: %d %s", w.Code, w.Body)
	}
	r := httptest.NewRequest("GET", "/v1/sandboxes", nil)
	r.AddCookie(cookie)
	r.Header.Set(CSRFHeader, info.CSRFToken)
	if org, key, ok, err := c.Authorize(r); !ok || err != nil || org != "default" || key != k.ID {
		t.Errorf("Authorize: %q %q %v %v; want the key's", org, key, ok, err)
	}

	if err := keys.Revoke(ctx, "default", k.ID); err != nil {
		t.Fatal(err)
	}
	if w, _ := session(); w.Code != http.StatusUnauthorized {
		t.Errorf("GET /console/session after the key was revoked: %d %s, want 401", w.Code, w.Body)
	}

	evs, err := st.ListAudit(ctx, store.AuditFilter{Action: "console.login", Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].Outcome != "unauthorized" || evs[0].Key != "" || evs[1].Outcome != "ok" || evs[1].Key != k.ID || evs[1].Org != "default" || evs[1].Client == "" {
		t.Errorf("the audit log of the logins: %+v", evs)
	}
}
