package console

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestLoginHintAndIdle: the login page learns where this daemon keeps its
// token (GET /console/login), and a session learns the daemon's default
// idle, "0" when it has none, so the page never guesses either.
func TestLoginHintAndIdle(t *testing.T) {
	for _, tt := range []struct {
		name      string
		tokenFile string
		idle      time.Duration
		wantIdle  string
	}{
		{"no idle default", "/srv/loam/token", 0, "0"},
		{"an idle default", "/tmp/d/token", 90 * time.Minute, "1h30m"},
		{"a token given, not in a file", "", 10 * time.Minute, "10m"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(t.Context(), Config{Keys: testKeys(), TokenFile: tt.tokenFile, Idle: tt.idle}, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			w := httptest.NewRecorder()
			c.ServeHTTP(w, httptest.NewRequest("GET", "/console/login", nil))
			var hint LoginHint
			if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &hint) != nil || hint.TokenFile != tt.tokenFile {
				t.Errorf("GET /console/login: %d %s; want the token file %q", w.Code, w.Body, tt.tokenFile)
			}
			if tt.tokenFile == "" && strings.Contains(w.Body.String(), "token_file") {
				t.Errorf("GET /console/login names a token file the daemon has not: %s", w.Body)
			}

			r := httptest.NewRequest("POST", "/console/login", strings.NewReader(`{"token":"`+testToken+`"}`))
			r.Header.Set("Content-Type", "application/json")
			w = httptest.NewRecorder()
			c.ServeHTTP(w, r)
			var info SessionInfo
			if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &info) != nil || info.Idle != tt.wantIdle {
				t.Errorf("login: %d %s; want idle %q", w.Code, w.Body, tt.wantIdle)
			}
		})
	}
}
