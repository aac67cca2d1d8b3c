package proxy

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/conns"
	"loam.dev/loam/internal/sandbox"
)

// fakeTargets serves sandboxes by name, all at one address, each of its
// Org or, when that is "", of org default.
type fakeTargets map[string]sandbox.Target

func (f fakeTargets) HTTPTarget(ctx context.Context, org, name string, admit func(sandbox.Target) error) (sandbox.Target, error) {
	t, ok := f[name]
	if t.Org == "" {
		t.Org = "default"
	}
	if !ok || t.Org != org {
		return sandbox.Target{}, api.Errorf(api.CodeNotFound, "sandbox %q not found", name)
	}
	if admit != nil {
		if err := admit(t); err != nil {
			return sandbox.Target{}, err
		}
	}
	if t.ID == "" {
		return sandbox.Target{}, api.Errorf(api.CodeUnavailable, "sandbox %s is sleeping", name)
	}
	return t, nil
}

func (f fakeTargets) DialPort(ctx context.Context, ref string, port int) (*sandbox.Stream, error) {
	return nil, api.Errorf(api.CodeNotFound, "nothing listens on TCP port %d in sandbox %s", port, ref)
}

func (f fakeTargets) Active(id string) func() { return func() {} }

func newFront(t *testing.T, targets Targets, domain string) *Handler {
	t.Helper()
	return New(targets, Config{Domain: domain, Org: "default", Token: "admin"}, slog.New(slog.DiscardHandler))
}

func TestMatch(t *testing.T) {
	for _, domain := range []string{"localhost:7070", "localhost", "Example.COM"} {
		h := newFront(t, fakeTargets{}, domain)
		base := strings.ToLower(stripPort(domain))
		for _, tc := range []struct {
			host      string
			name, org string
			ok        bool
		}{
			{"web--default." + base, "web", "default", true},
			{"web--default." + base + ":7070", "web", "default", true},
			{"web--default." + base + ":1234", "web", "default", true},
			{"WEB--Default." + strings.ToUpper(base), "web", "default", true},
			{"a--b--default." + base, "a--b", "default", true},
			{"web--default." + base + ".", "web", "default", true},
			{"web--other." + base, "web", "other", true},
			{"--default." + base, "", "", false},
			{"web--." + base, "", "", false},
			{"web." + base, "", "", false},
			{"x.web--default." + base, "", "", false},
			{base, "", "", false},
			{"127.0.0.1:7070", "", "", false},
			{"web--default." + base + ".evil.net", "", "", false},
		} {
			name, org, ok := h.Match(tc.host)
			if name != tc.name || org != tc.org || ok != tc.ok {
				t.Errorf("domain %s: Match(%q) = %q, %q, %v; want %q, %q, %v", domain, tc.host, name, org, ok, tc.name, tc.org, tc.ok)
			}
		}
	}
}

// backend is a sandbox's server: it echoes what it was sent.
func backend(t *testing.T) netip.AddrPort {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Host", r.Host)
		w.Header().Set("X-Auth", r.Header.Get("Authorization"))
		w.Header().Set("X-Token", r.Header.Get(TokenHeader))
		w.Header().Set("X-Cookie", r.Header.Get("Cookie"))
		w.Header().Set("X-Query", r.URL.RawQuery)
		w.Header().Set("X-Proto", r.Header.Get("X-Forwarded-Proto"))
		io.WriteString(w, r.Method+" "+r.URL.Path+" "+string(body))
	}))
	t.Cleanup(srv.Close)
	return netip.MustParseAddrPort(srv.Listener.Addr().String())
}

func TestAccessAndForwarding(t *testing.T) {
	addr := backend(t)
	targets := fakeTargets{
		"priv":  {ID: "sb-1", Name: "priv", Addr: addr, AccessToken: "acc1"},
		"pub":   {ID: "sb-2", Name: "pub", Addr: addr, Public: true, AccessToken: "acc2"},
		"sleep": {Name: "sleep", Public: true},
		// A private sandbox that cannot serve: access is decided first.
		"psleep": {Name: "psleep"},
		"dead":   {ID: "sb-3", Name: "dead", Addr: netip.MustParseAddrPort("127.0.0.1:1"), Public: true},
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "api") })
	front := httptest.NewServer(newFront(t, targets, "localhost:7070").Mount(api))
	defer front.Close()

	do := func(method, host, path string, hdr map[string]string, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, front.URL+path, strings.NewReader(body))
		req.Host = host
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	read := func(resp *http.Response) string {
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}

	if got := read(do("GET", "127.0.0.1", "/healthz", nil, "")); got != "api" {
		t.Errorf("a request not for a sandbox: %q, want the API's", got)
	}
	for _, tc := range []struct {
		what   string
		method string
		host   string
		path   string
		hdr    map[string]string
		status int
	}{
		{"private, no token", "GET", "priv--default.localhost:7070", "/", nil, 401},
		{"private, wrong token", "GET", "priv--default.localhost:7070", "/", map[string]string{TokenHeader: "nope"}, 401},
		{"private, other sandbox's token", "GET", "priv--default.localhost:7070", "/", map[string]string{TokenHeader: "acc2"}, 401},
		{"private, access token", "GET", "priv--default.localhost:7070", "/", map[string]string{TokenHeader: "acc1"}, 200},
		{"private, API token in header", "GET", "priv--default.localhost:7070", "/", map[string]string{TokenHeader: "admin"}, 200},
		{"private, API token as bearer", "GET", "priv--default.localhost:7070", "/", map[string]string{"Authorization": "Bearer admin"}, 200},
		{"private, API token as bearer, scheme in lower case", "GET", "priv--default.localhost:7070", "/", map[string]string{"Authorization": "bearer admin"}, 200},
		{"private, cookie", "GET", "priv--default.localhost:7070", "/", map[string]string{"Cookie": TokenCookie + "=acc1"}, 200},
		{"private, query", "GET", "priv--default.localhost:7070", "/a?x=1&loam_token=acc1", nil, 303},
		{"private, query on a POST", "POST", "priv--default.localhost:7070", "/a?loam_token=acc1", nil, 200},
		{"public", "GET", "pub--default.localhost:7070", "/", nil, 200},
		{"unknown", "GET", "nope--default.localhost:7070", "/", nil, 404},
		{"sleeping", "GET", "sleep--default.localhost:7070", "/", nil, 503},
		{"private and sleeping, no token", "GET", "psleep--default.localhost:7070", "/", nil, 401},
		{"not listening", "GET", "dead--default.localhost:7070", "/", nil, 502},
	} {
		resp := do(tc.method, tc.host, tc.path, tc.hdr, "")
		if resp.StatusCode != tc.status {
			t.Errorf("%s: status %d, want %d: %s", tc.what, resp.StatusCode, tc.status, read(resp))
		}
		if tc.status >= 400 && !strings.Contains(resp.Header.Get("Content-Type"), "text/html") {
			t.Errorf("%s: an error page of type %q", tc.what, resp.Header.Get("Content-Type"))
		}
	}

	resp := do("GET", "priv--default.localhost:7070", "/a?x=1&loam_token=acc1", nil, "")
	if loc := resp.Header.Get("Location"); loc != "/a?x=1" {
		t.Errorf("redirect to %q, want /a?x=1", loc)
	}
	c := resp.Header.Get("Set-Cookie")
	for _, want := range []string{TokenCookie + "=acc1", "HttpOnly", "SameSite=Lax", "Path=/"} {
		if !strings.Contains(c, want) {
			t.Errorf("cookie %q lacks %q", c, want)
		}
	}

	// What reaches the sandbox: the method, path and body, the client's
	// Host, and none of loam's credentials; the app's own are kept.
	resp = do("POST", "priv--default.localhost:7070", "/p?q=1&loam_token=admin", map[string]string{
		"Cookie": "app=1; " + TokenCookie + "=acc1", "Authorization": "Bearer admin",
	}, "hello")
	if got := read(resp); got != "POST /p hello" {
		t.Errorf("POST through the URL: %q", got)
	}
	h := resp.Header
	if h.Get("X-Host") != "priv--default.localhost:7070" || h.Get("X-Auth") != "" || h.Get("X-Cookie") != "app=1" || h.Get("X-Query") != "q=1" {
		t.Errorf("the sandbox saw host %q, auth %q, cookie %q, query %q", h.Get("X-Host"), h.Get("X-Auth"), h.Get("X-Cookie"), h.Get("X-Query"))
	}
	if strings.Contains(resp.Header.Get("Set-Cookie"), "admin") {
		t.Errorf("the API token was set as a cookie: %q", resp.Header.Get("Set-Cookie"))
	}
	// The API token never reaches the sandbox, whatever the case of its scheme.
	resp = do("GET", "pub--default.localhost:7070", "/", map[string]string{"Authorization": "bEARER admin"}, "")
	if got := resp.Header.Get("X-Auth"); got != "" {
		t.Errorf("the sandbox saw the API token: auth %q", got)
	}
	resp = do("GET", "pub--default.localhost:7070", "/", map[string]string{"Authorization": "Bearer app-secret", TokenHeader: "acc2"}, "")
	if resp.Header.Get("X-Auth") != "Bearer app-secret" || resp.Header.Get("X-Token") != "" {
		t.Errorf("the sandbox saw auth %q, access token %q", resp.Header.Get("X-Auth"), resp.Header.Get("X-Token"))
	}
}

// TestUpgrade: a connection upgrade (a WebSocket's handshake) passes
// through, and the connection then carries bytes both ways.
func TestUpgrade(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		io.Copy(c, br)
	}()
	targets := fakeTargets{"ws": {ID: "sb-1", Name: "ws", Addr: netip.MustParseAddrPort(ln.Addr().String()), Public: true}}
	front := httptest.NewServer(newFront(t, targets, "localhost").Mount(http.NotFoundHandler()))
	defer front.Close()

	c, err := net.Dial("tcp", front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: ws--default.localhost\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v, %v", resp, err)
	}
	io.WriteString(c, "ping\n")
	line, err := br.ReadString('\n')
	if err != nil || line != "ping\n" {
		t.Fatalf("echo through the upgraded connection: %q, %v", line, err)
	}
}

// TestTLS: under TLS the cookie is Secure and the sandbox is told the
// request came over https.
func TestTLS(t *testing.T) {
	addr := backend(t)
	targets := fakeTargets{"priv": {ID: "sb-1", Name: "priv", Addr: addr, AccessToken: "acc1"}}
	h := New(targets, Config{Domain: "loam.example.com", Org: "default", Token: "admin", TLS: true}, slog.New(slog.DiscardHandler))
	front := httptest.NewTLSServer(h.Mount(http.NotFoundHandler()))
	defer front.Close()
	c := front.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

	req, _ := http.NewRequest("GET", front.URL+"/?loam_token=acc1", nil)
	req.Host = "priv--default.loam.example.com"
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ck := resp.Header.Get("Set-Cookie"); resp.StatusCode != http.StatusSeeOther || !strings.Contains(ck, "Secure") {
		t.Errorf("under TLS: %d, cookie %q", resp.StatusCode, ck)
	}
	req, _ = http.NewRequest("GET", front.URL+"/", nil)
	req.Host = "priv--default.loam.example.com"
	req.Header.Set("Cookie", TokenCookie+"=acc1")
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Proto") != "https" {
		t.Errorf("under TLS: %d, X-Forwarded-Proto %q", resp.StatusCode, resp.Header.Get("X-Proto"))
	}
}

// TestKeepAliveOnlyPastTheDoor: under the daemon's connection limiter, a
// request the front door refuses closes its connection; one it lets
// through (public, or with a token) may keep it.
func TestKeepAliveOnlyPastTheDoor(t *testing.T) {
	addr := backend(t)
	targets := fakeTargets{
		"priv": {ID: "sb-1", Name: "priv", Addr: addr, AccessToken: "acc1"},
		"pub":  {ID: "sb-2", Name: "pub", Addr: addr, Public: true, AccessToken: "acc2"},
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "api") })
	front := httptest.NewServer(conns.New(100, 100, slog.New(slog.DiscardHandler)).Handler(newFront(t, targets, "localhost:7070").Mount(api)))
	defer front.Close()
	for _, tc := range []struct {
		host  string
		hdr   map[string]string
		close bool
	}{
		{"priv--default.localhost:7070", nil, true},
		{"nope--default.localhost:7070", nil, true},
		{"priv--default.localhost:7070", map[string]string{TokenHeader: "acc1"}, false},
		{"priv--default.localhost:7070", map[string]string{"Authorization": "bearer admin"}, false},
		{"pub--default.localhost:7070", nil, false},
	} {
		req, _ := http.NewRequest("GET", front.URL+"/", nil)
		req.Host = tc.host
		for k, v := range tc.hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.Close != tc.close {
			t.Errorf("%s %v: status %d, Connection: close %v, want %v", tc.host, tc.hdr, resp.StatusCode, resp.Close, tc.close)
		}
	}
}

// drainedBody is a request body the server drained and closed once its
// bytes were read, as the HTTP/1 server does when the answer's header is
// written.
type drainedBody struct{ r io.Reader }

func (b *drainedBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		return n, http.ErrBodyReadAfterClose
	}
	return n, err
}

func (b *drainedBody) Close() error { return nil }

// TestBodyDrainedByTheAnswer: the Transport's read past a body's declared
// length, which the answer's header can make come after the server closed
// it, is the body's end, not an error that would cut the answer
// (golang/go#40747). A body cut short, or one of no declared length, still
// fails.
func TestBodyDrainedByTheAnswer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		length  int64
		wantErr error
	}{
		{"all of it read", 6, nil},
		{"cut short", 10, http.ErrBodyReadAfterClose},
		{"chunked", -1, http.ErrBodyReadAfterClose},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/", nil)
			r.Body, r.ContentLength = &drainedBody{strings.NewReader("a body")}, tc.length
			got, err := io.ReadAll(newPacedBody(httptest.NewRecorder(), r, 0))
			if string(got) != "a body" || err != tc.wantErr {
				t.Fatalf("read %q, %v; want %q, %v", got, err, "a body", tc.wantErr)
			}
		})
	}
}

// fakeKeys knows API keys by their secret.
type fakeKeys map[string]auth.Principal

func (f fakeKeys) Authenticate(ctx context.Context, token string) (auth.Principal, error) {
	if p, ok := f[token]; ok {
		return p, nil
	}
	return auth.Principal{}, auth.ErrWrongToken
}

// TestKeysOpenURLs: an API key of scope write opens the URLs of the
// sandboxes its labels select; a read key, a key outside its labels and
// an unknown key open none; a key of another org finds none (404); no key
// reaches the sandbox.
func TestKeysOpenURLs(t *testing.T) {
	addr := backend(t)
	targets := fakeTargets{
		"red":  {ID: "sb-1", Name: "red", Addr: addr, AccessToken: "acc1", Labels: map[string]string{"team": "red"}},
		"blue": {ID: "sb-2", Name: "blue", Addr: addr, AccessToken: "acc2", Labels: map[string]string{"team": "blue"}},
	}
	k := api.KeyPrefix
	keys := fakeKeys{
		k + "write": {Org: "default", Scope: api.ScopeWrite},
		k + "read":  {Org: "default", Scope: api.ScopeRead},
		k + "red":   {Org: "default", Scope: api.ScopeWrite, Labels: map[string]string{"team": "red"}},
		// A key of another org finds no sandbox of this one: 404, as
		// for a name that does not exist, never 401.
		k + "other": {Org: "other", Scope: api.ScopeAdmin},
	}
	front := httptest.NewServer(New(targets, Config{Domain: "localhost:7070", Org: "default", Token: "admin", Keys: keys}, slog.New(slog.DiscardHandler)).Mount(http.NotFoundHandler()))
	defer front.Close()
	for _, tc := range []struct {
		host, how, key string
		status         int
	}{
		{"red", "bearer", "write", 200},
		{"red", "header", "write", 200},
		{"red", "query", "write", 303},
		{"red", "bearer", "read", 401},
		{"red", "bearer", "nosuch", 401},
		{"red", "bearer", "red", 200},
		{"blue", "bearer", "red", 401},
		{"blue", "query", "red", 401},
		{"red", "bearer", "other", 404},
		{"red", "header", "other", 404},
		{"red", "query", "other", 404},
		{"nosuch", "bearer", "other", 404},
	} {
		req, _ := http.NewRequest("GET", front.URL+"/", nil)
		req.Host = tc.host + "--default.localhost:7070"
		switch tc.how {
		case "bearer":
			req.Header.Set("Authorization", "Bearer "+k+tc.key)
		case "header":
			req.Header.Set(TokenHeader, k+tc.key)
		case "query":
			req.URL.RawQuery = TokenParam + "=" + k + tc.key
		}
		c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s by %s with key %s: %d, want %d", tc.host, tc.how, tc.key, resp.StatusCode, tc.status)
		}
		if resp.StatusCode == 200 && resp.Header.Get("X-Auth") != "" {
			t.Errorf("%s by %s with key %s: the sandbox saw %q", tc.host, tc.how, tc.key, resp.Header.Get("X-Auth"))
		}
		if c := resp.Header.Get("Set-Cookie"); c != "" && !strings.Contains(c, TokenCookie+"=acc1") {
			t.Errorf("%s by %s with key %s: cookie %q, want the sandbox's access token", tc.host, tc.how, tc.key, c)
		}
	}
}
