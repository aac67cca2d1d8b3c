package console

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
)

const testToken = "loam_testtoken"

// testKeys knows the admin token testToken alone (no key store).
func testKeys() *auth.Keys {
	return auth.NewKeys("default", testToken, nil, slog.New(slog.DiscardHandler))
}

func newConsole(t testing.TB) *Console {
	t.Helper()
	c, err := New(t.Context(), Config{Keys: testKeys()}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// login logs in to c and returns the cookie and the CSRF token.
func login(t testing.TB, c *Console) (*http.Cookie, string) {
	t.Helper()
	r := httptest.NewRequest("POST", "/console/login", strings.NewReader(`{"token":"`+testToken+`"}`))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	c.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("login: %d %s", w.Code, w.Body)
	}
	var info SessionInfo
	if err := json.Unmarshal(w.Body.Bytes(), &info); err != nil || info.CSRFToken == "" {
		t.Fatalf("login answered %s (%v)", w.Body, err)
	}
	cookies := w.Result().Cookies()
	if len(cookies) != 1 || cookies[0].Name != CookieName || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode || cookies[0].Path != "/" {
		t.Fatalf("login set cookies %v; want one HttpOnly, SameSite=Strict %s for /", cookies, CookieName)
	}
	return cookies[0], info.CSRFToken
}

func TestAuthorize(t *testing.T) {
	c := newConsole(t)
	cookie, csrf := login(t, c)
	_, other := login(t, c)
	ws := func(protocols string) http.Header {
		return http.Header{"Upgrade": {"websocket"}, "Sec-Websocket-Protocol": {protocols}}
	}
	tests := []struct {
		name      string
		cookie    *http.Cookie
		header    http.Header
		has       bool
		wantError api.Code
	}{
		{name: "no cookie", has: false},
		{name: "other cookies only", cookie: &http.Cookie{Name: "loam_access", Value: "x"}, has: false},
		{name: "good", cookie: cookie, header: http.Header{CSRFHeader: {csrf}}, has: true},
		{name: "no CSRF", cookie: cookie, has: true, wantError: api.CodeForbidden},
		{name: "empty CSRF", cookie: cookie, header: http.Header{CSRFHeader: {""}}, has: true, wantError: api.CodeForbidden},
		{name: "other session's CSRF", cookie: cookie, header: http.Header{CSRFHeader: {other}}, has: true, wantError: api.CodeForbidden},
		{name: "CSRF as subprotocol without upgrade", cookie: cookie, header: http.Header{"Sec-Websocket-Protocol": {CSRFProtocolPrefix + csrf}}, has: true, wantError: api.CodeForbidden},
		{name: "websocket with CSRF subprotocol", cookie: cookie, header: ws("loam.v1, " + CSRFProtocolPrefix + csrf), has: true},
		{name: "websocket without CSRF", cookie: cookie, header: ws("loam.v1"), has: true, wantError: api.CodeForbidden},
		{name: "websocket with a wrong CSRF", cookie: cookie, header: ws("loam.v1, " + CSRFProtocolPrefix + other), has: true, wantError: api.CodeForbidden},
		{name: "forged cookie", cookie: &http.Cookie{Name: CookieName, Value: strings.Repeat("0", 64)}, header: http.Header{CSRFHeader: {csrf}}, has: true, wantError: api.CodeUnauthorized},
		{name: "empty cookie", cookie: &http.Cookie{Name: CookieName, Value: ""}, header: http.Header{CSRFHeader: {csrf}}, has: true, wantError: api.CodeUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/v1/sandboxes", nil)
			for k, v := range tt.header {
				r.Header[http.CanonicalHeaderKey(k)] = v
			}
			if tt.cookie != nil {
				r.AddCookie(tt.cookie)
			}
			_, _, has, err := c.Authorize(r)
			if has != tt.has {
				t.Errorf("has session = %v; want %v", has, tt.has)
			}
			if tt.wantError == "" {
				if err != nil {
					t.Errorf("error %v; want none", err)
				}
				return
			}
			ae, ok := err.(*api.Error)
			if !ok || ae.Code != tt.wantError {
				t.Errorf("error %v; want %s", err, tt.wantError)
			}
		})
	}
}

func TestSessionsExpireAndLogOut(t *testing.T) {
	c := newConsole(t)
	now := time.Now()
	c.now = func() time.Time { return now }
	cookie, csrf := login(t, c)
	call := func() error {
		r := httptest.NewRequest("GET", "/v1/sandboxes", nil)
		r.AddCookie(cookie)
		r.Header.Set(CSRFHeader, csrf)
		_, _, _, err := c.Authorize(r)
		return err
	}
	if err := call(); err != nil {
		t.Fatal(err)
	}
	now = now.Add(SessionTTL)
	if err := call(); err == nil {
		t.Fatal("a session past its TTL still opens the API")
	}

	now = time.Now()
	cookie, csrf = login(t, c)
	r := httptest.NewRequest("POST", "/console/logout", nil)
	r.AddCookie(cookie)
	w := httptest.NewRecorder()
	c.ServeHTTP(w, r)
	if w.Code != http.StatusForbidden {
		t.Fatalf("logout without the CSRF token: %d; want 403", w.Code)
	}
	r.Header.Set(CSRFHeader, csrf)
	w = httptest.NewRecorder()
	c.ServeHTTP(w, r)
	if w.Code != http.StatusNoContent {
		t.Fatalf("logout: %d %s", w.Code, w.Body)
	}
	if err := call(); err == nil {
		t.Fatal("a session still opens the API after its logout")
	}
}

func TestSessionsBounded(t *testing.T) {
	c := newConsole(t)
	first, _ := login(t, c)
	for range maxSessions {
		login(t, c)
	}
	if n := len(c.sessions); n > maxSessions {
		t.Fatalf("%d sessions kept; at most %d", n, maxSessions)
	}
	r := httptest.NewRequest("GET", "/console/session", nil)
	r.AddCookie(first)
	w := httptest.NewRecorder()
	c.ServeHTTP(w, r)
	if w.Code != http.StatusUnauthorized {
		t.Fatalf("the oldest session, beyond the bound: %d; want 401", w.Code)
	}
}

func TestStatic(t *testing.T) {
	c := newConsole(t)
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	h := c.Mount(next)
	tests := []struct {
		method, target string
		want           int
		contentType    string
	}{
		{"GET", "/", 200, "text/html; charset=utf-8"},
		{"HEAD", "/", 200, "text/html; charset=utf-8"},
		{"GET", "/index.html", 200, "text/html; charset=utf-8"},
		{"GET", "/assets/app.js", 200, "text/javascript; charset=utf-8"},
		{"GET", "/assets/app.css", 200, "text/css; charset=utf-8"},
		{"GET", "/assets/", 404, "application/json"},
		{"GET", "/assets/../console.go", 404, "application/json"},
		{"GET", "/assets/..%2fconsole.go", 404, "application/json"},
		{"GET", "/assets/%2e%2e/%2e%2e/etc/passwd", 404, "application/json"},
		{"GET", "/assets/app.js%00", 404, "application/json"},
		{"GET", "/assets//app.js", 404, "application/json"},
		{"GET", "/console", 404, "application/json"},
		{"GET", "/console/nope", 404, "application/json"},
		{"DELETE", "/", 405, "application/json"},
		{"PUT", "/console/login", 405, "application/json"},
		{"GET", "/v1/sandboxes", http.StatusTeapot, ""},
		{"GET", "/healthz", http.StatusTeapot, ""},
		{"GET", "/dist/index.html", http.StatusTeapot, ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.target, func(t *testing.T) {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(tt.method, tt.target, nil))
			if w.Code != tt.want {
				t.Fatalf("%d %s; want %d", w.Code, w.Body, tt.want)
			}
			if tt.contentType != "" && w.Header().Get("Content-Type") != tt.contentType {
				t.Errorf("Content-Type %q; want %q", w.Header().Get("Content-Type"), tt.contentType)
			}
			if tt.want == 200 && !strings.Contains(w.Header().Get("Content-Security-Policy"), "default-src 'self'") {
				t.Errorf("no Content-Security-Policy limiting the page to the daemon: %q", w.Header().Get("Content-Security-Policy"))
			}
			if tt.want >= 400 && tt.want < 500 && tt.want != http.StatusTeapot {
				var e api.ErrorBody
				if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error == nil {
					t.Errorf("body %q is not the API's error shape", w.Body)
				}
			}
		})
	}
	// A revalidation with the file's ETag is answered without the file.
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/assets/app.js", nil))
	r := httptest.NewRequest("GET", "/assets/app.js", nil)
	r.Header.Set("If-None-Match", w.Header().Get("ETag"))
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusNotModified || w.Body.Len() != 0 {
		t.Errorf("revalidation: %d with %d bytes; want 304 and none", w.Code, w.Body.Len())
	}
}

func TestLogin(t *testing.T) {
	c := newConsole(t)
	tests := []struct {
		name, contentType, body string
		want                    int
	}{
		{"form", "application/x-www-form-urlencoded", "token=" + testToken, 400},
		{"text", "text/plain", `{"token":"` + testToken + `"}`, 400},
		{"no type", "", `{"token":"` + testToken + `"}`, 400},
		{"wrong token", "application/json", `{"token":"loam_wrong"}`, 401},
		{"empty token", "application/json", `{"token":""}`, 401},
		{"unknown field", "application/json", `{"token":"` + testToken + `","admin":true}`, 400},
		{"not JSON", "application/json", `{"token":`, 400},
		{"array", "application/json", `[]`, 400},
		{"huge", "application/json", `{"token":"` + strings.Repeat("a", 1<<20) + `"}`, 400},
		{"good, with charset", "application/json; charset=utf-8", `{"token":"` + testToken + `"}`, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/console/login", strings.NewReader(tt.body))
			if tt.contentType != "" {
				r.Header.Set("Content-Type", tt.contentType)
			}
			w := httptest.NewRecorder()
			c.ServeHTTP(w, r)
			if w.Code != tt.want {
				t.Fatalf("%d %s; want %d", w.Code, w.Body, tt.want)
			}
			if tt.want != 200 && len(w.Result().Cookies()) != 0 {
				t.Errorf("a refused login set a cookie")
			}
		})
	}
}

// FuzzConsole sends the console's handler any method, path, cookie, CSRF
// header and body: each answer is a 2xx, 3xx or 4xx, never a 500 or a
// panic, and only a known page file is ever served.
func FuzzConsole(f *testing.F) {
	f.Add("GET", "/", "", "", "")
	f.Add("GET", "/assets/../../etc/passwd", "", "", "")
	f.Add("POST", "/console/login", "", "", `{"token":"`+testToken+`"}`)
	f.Add("POST", "/console/logout", "x", "y", "")
	f.Add("GET", "/console/session", strings.Repeat("a", 64), "", "")
	f.Add("GET", "/assets/app.js", "", "", "")
	f.Add("GET", "/console/%00", "\x00", "\xff", "\x00")
	// One console for every input: logins pile up in it, as in a daemon
	// (maxSessions bounds them).
	c := newConsole(f)
	f.Fuzz(func(t *testing.T, method, target, cookie, csrf, body string) {
		r, err := http.NewRequest(method, "http://daemon"+target, strings.NewReader(body))
		if err != nil {
			return
		}
		if !Owns(r.URL.Path) {
			return
		}
		r.Header.Set("Content-Type", "application/json")
		if cookie != "" {
			r.Header.Set("Cookie", CookieName+"="+cookie)
		}
		r.Header.Set(CSRFHeader, csrf)
		w := httptest.NewRecorder()
		c.ServeHTTP(w, r)
		if w.Code >= 500 {
			t.Fatalf("%s %q: %d %s", method, target, w.Code, w.Body)
		}
		if w.Code == 200 && r.Method == "GET" && !strings.HasPrefix(r.URL.Path, "/console/") {
			name := r.URL.Path
			if name == "/" {
				name = "/index.html"
			}
			if _, ok := c.files[name]; !ok {
				t.Fatalf("%q served though it is no file of the page", target)
			}
		}
	})
}
