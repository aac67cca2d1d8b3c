package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"loam.dev/loam/api"
)

// cookieSessions is a BrowserSessions whose one session is the cookie
// "s=good", and whose CSRF token is the header X-CSRF: ok.
type cookieSessions struct{}

func (cookieSessions) Authorize(r *http.Request) (org, key string, ok bool, err error) {
	c, err := r.Cookie("s")
	if err != nil {
		return "", "", false, nil
	}
	if c.Value != "good" {
		return "", "", true, api.Errorf(api.CodeUnauthorized, "unknown session")
	}
	if r.Header.Get("X-CSRF") != "ok" {
		return "", "", true, api.Errorf(api.CodeForbidden, "no CSRF token")
	}
	return DefaultOrg, api.AdminKeyID, true, nil
}

// TestBrowserSessions checks how the API weighs a session cookie against
// a token: a token decides alone when given; a cookie opens the API only
// as its BrowserSessions says; without BrowserSessions a cookie is nothing.
func TestBrowserSessions(t *testing.T) {
	with := New(newFake(), testToken, discardLog(), WithBrowserSessions(cookieSessions{}))
	without := New(newFake(), testToken, discardLog())
	tests := []struct {
		name     string
		srv      *Server
		auth     string
		protocol string
		cookie   string
		csrf     string
		want     int
	}{
		{name: "cookie and CSRF", srv: with, cookie: "good", csrf: "ok", want: 200},
		{name: "cookie without CSRF", srv: with, cookie: "good", want: 403},
		{name: "unknown cookie", srv: with, cookie: "bad", csrf: "ok", want: 401},
		{name: "nothing", srv: with, want: 401},
		{name: "token", srv: with, auth: "Bearer " + testToken, want: 200},
		{name: "token and unknown cookie", srv: with, auth: "Bearer " + testToken, cookie: "bad", want: 200},
		{name: "wrong token and good cookie", srv: with, auth: "Bearer nope", cookie: "good", csrf: "ok", want: 401},
		{name: "empty bearer and good cookie", srv: with, auth: "Bearer ", cookie: "good", csrf: "ok", want: 401},
		{name: "wrong socket token and good cookie", srv: with, protocol: api.WebSocketProtocol + ", " + api.WebSocketTokenPrefix + "nope", cookie: "good", csrf: "ok", want: 401},
		{name: "cookie without sessions", srv: without, cookie: "good", csrf: "ok", want: 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/v1/sandboxes", nil)
			if tt.auth != "" {
				r.Header.Set("Authorization", tt.auth)
			}
			if tt.protocol != "" {
				r.Header.Set("Sec-WebSocket-Protocol", tt.protocol)
			}
			if tt.cookie != "" {
				r.AddCookie(&http.Cookie{Name: "s", Value: tt.cookie})
			}
			if tt.csrf != "" {
				r.Header.Set("X-CSRF", tt.csrf)
			}
			w := httptest.NewRecorder()
			tt.srv.ServeHTTP(w, r)
			if w.Code != tt.want {
				t.Fatalf("%d %s; want %d", w.Code, w.Body, tt.want)
			}
		})
	}
}

// TestCORSRefusesSessionHeaders checks that the API's CORS answer lets no
// other origin send a browser session's CSRF header: a page on another
// origin (a sandbox's, on the console's site) must not be able to make a
// call that a session cookie would authorize. The name is the console's
// (console.CSRFHeader), which this package does not import.
func TestCORSRefusesSessionHeaders(t *testing.T) {
	srv := New(newFake(), testToken, discardLog(), WithBrowserSessions(cookieSessions{}))
	r := httptest.NewRequest("OPTIONS", "/v1/sandboxes", nil)
	r.Header.Set("Origin", "http://web--default.localhost:7070")
	r.Header.Set("Access-Control-Request-Method", "POST")
	r.Header.Set("Access-Control-Request-Headers", "x-loam-csrf")
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, r)
	allowed := strings.ToLower(w.Header().Get("Access-Control-Allow-Headers"))
	if strings.Contains(allowed, "x-loam-csrf") || allowed == "*" {
		t.Fatalf("a preflight may send the CSRF header: Access-Control-Allow-Headers %q", allowed)
	}
	if w.Header().Get("Access-Control-Allow-Credentials") != "" {
		t.Fatalf("CORS answers allow credentials: %v", w.Header())
	}
}
