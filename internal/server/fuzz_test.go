package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// fuzzSandboxes is the fake with the optional ability the fuzz targets
// reach too (pools), answering as the Manager does: an *api.Error for what
// the caller got wrong.
type fuzzSandboxes struct{ *fakeSandboxes }

func (f fuzzSandboxes) SetCheckpointPool(ctx context.Context, sandbox, checkpoint string, size int) (*api.Pool, error) {
	if _, err := f.GetCheckpoint(ctx, sandbox, checkpoint); err != nil {
		return nil, err
	}
	return &api.Pool{Size: size}, nil
}

func (f fuzzSandboxes) CheckpointPool(ctx context.Context, sandbox, checkpoint string) (*api.Pool, error) {
	return f.SetCheckpointPool(ctx, sandbox, checkpoint, 0)
}

func (f fuzzSandboxes) SetTemplatePool(ctx context.Context, template string, size int) (*api.Pool, error) {
	return nil, api.Errorf(api.CodeNotFound, "template %q not found", template)
}

func (f fuzzSandboxes) TemplatePool(ctx context.Context, template string) (*api.Pool, error) {
	return f.SetTemplatePool(ctx, template, 0)
}

var _ Pools = fuzzSandboxes{}

// fuzzBodies are realistic bodies of the routes that take one, the seeds
// the fuzzer mutates.
var fuzzBodies = map[string]string{
	"POST /v1/sandboxes":                                            `{"name":"web","template":"busybox","resources":{"cpus":1,"memory_mib":512,"disk_mib":1024},"env":{"A":"1"},"labels":{"team":"red"},"idle":"10m","http_port":8080}`,
	"PATCH /v1/sandboxes/{sandbox}":                                 `{"labels":{"team":"blue"},"idle":"1h","http_port":3000,"public":true}`,
	"POST /v1/sandboxes/{sandbox}/checkpoints":                      `{"comment":"before","memory":true,"name":"v2"}`,
	"POST /v1/sandboxes/{sandbox}/files/mkdir":                      `{"path":"/tmp/a/b","mode":"0755","user":"root"}`,
	"POST /v1/sandboxes/{sandbox}/files/move":                       `{"from":"/tmp/a","to":"/tmp/b"}`,
	"PUT /v1/sandboxes/{sandbox}/files/content":                     "hello\n",
	"PUT /v1/sandboxes/{sandbox}/network":                           `{"egress":"deny","allow":["10.0.0.0/8","example.com"],"deny":[]}`,
	"PUT /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}/pool":     `{"size":2}`,
	"PUT /v1/templates/{template}/pool":                             `{"size":1}`,
	"PUT /v1/secrets/{name}":                                        `{"value":"s3cret"}`,
	"POST /v1/images":                                               `{"ref":"docker.io/library/alpine:3"}`,
	"PUT /v1/registries/{registry}":                                 `{"username":"u","password":"p"}`,
	"PUT /v1/sandboxes/{sandbox}/services/{service}":                `{"name":"web","cmd":["python3","-m","http.server"],"env":{"PORT":"8000"},"dir":"/srv","restart":"always"}`,
	"POST /v1/sandboxes/{sandbox}/sessions":                         `{"cmd":["sh","-c","echo hi"],"env":{"X":"y"},"tty":true,"rows":24,"cols":80}`,
	"POST /v1/sandboxes/{sandbox}/sessions/{session}/signal":        `{"signal":"TERM"}`,
	"POST /v1/templates":                                            `{"name":"warm","from":{"sandbox":"box","checkpoint":"v1"},"pool":1}`,
	"PUT /v1/templates/{template}/import":                           "\x28\xb5\x2f\xfd not really zstd",
	"POST /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}/restore": ``,
}

// fuzzQueries are query strings the routes read.
var fuzzQueries = []string{
	"", "path=/etc/hosts", "path=/tmp&user=root&depth=2", "path=/tmp/x&mode=0644&append=true",
	"path=/&recursive=true", "label=team=red&label=tier", "offset=10&stderr_offset=0&follow=false",
	"force=true", "path=%00", "offset=-1", "follow=maybe", "label==", "depth=99999999999999999999",
}

// fuzzServer is one server over the fake for a whole fuzz run: its own
// socket, and a client that sends what it is given as it is.
type fuzzServer struct {
	base   string
	client *http.Client
}

var (
	fuzzOnce  sync.Once
	fuzzSrv   fuzzServer
	fuzzInner fuzzServer
)

// fuzzServers are the daemon's API and the in-sandbox API of box, over the
// fake, for the whole process.
func fuzzServers() (daemon, inside fuzzServer) {
	fuzzOnce.Do(func() {
		client := &http.Client{
			Timeout:       10 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
		// Left open for the whole process: the fuzzing workers call
		// this once each and run until they are killed.
		fake := fuzzSandboxes{newFake()}
		fuzzSrv = fuzzServer{httptest.NewServer(New(fake, testToken, discardLog(), append(fakeServices(fake.fakeSandboxes), WithPools(fake))...)).URL, client}
		in := NewInside(fake, []byte("secret"), discardLog())
		fuzzInner = fuzzServer{httptest.NewServer(in.handler("sb-000000000001")).URL, client}
	})
	return fuzzSrv, fuzzInner
}

// escapeRaw percent-encodes the bytes a request line cannot hold, so that
// whatever else the fuzzer wrote reaches the server as it is.
// In a path, '?' is escaped too: it would start the query.
func escapeRaw(s string, path bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == '#' || c == '%' && path && !validEscape(s[i:]) || path && c == '?' {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// validEscape reports whether s starts with a well-formed %XX: a bad one
// makes the client refuse the URL.
func validEscape(s string) bool {
	ishex := func(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }
	return len(s) >= 3 && ishex(s[1]) && ishex(s[2])
}

// fillPattern puts params into the {names} of a route's path, in order.
func fillPattern(path string, params []string) string {
	parts := strings.Split(path, "/")
	n := 0
	for i, p := range parts {
		if strings.HasPrefix(p, "{") && strings.HasSuffix(p, "}") {
			v := "x"
			if n < len(params) {
				v = params[n]
			}
			n++
			parts[i] = v
		}
	}
	return strings.Join(parts, "/")
}

// fuzzRequest is one request a fuzz target sends.
type fuzzRequest struct {
	method, path, query string
	header              http.Header
	body                []byte
}

// checkAnswer sends req and checks what every answer of the API must be:
// no 5xx (the fake fails nothing, so a 5xx is the handler's own), an error
// in the API's shape with the status of its code, and an answer in bounded
// time.
func checkAnswer(t *testing.T, srv fuzzServer, req fuzzRequest) {
	u := srv.base + escapeRaw(req.path, true)
	if req.query != "" {
		u += "?" + escapeRaw(req.query, false)
	}
	r, err := http.NewRequest(req.method, u, strings.NewReader(string(req.body)))
	if err != nil {
		return // not a request a client can send (a bad method)
	}
	for k, vs := range req.header {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	start := time.Now()
	resp, err := srv.client.Do(r)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) && ue.Timeout() {
			t.Fatalf("%s %s: no answer in %s", req.method, u, time.Since(start))
		}
		if strings.Contains(err.Error(), "invalid header") || strings.Contains(err.Error(), "invalid method") {
			return // the client refuses to send it
		}
		t.Fatalf("%s %s: %v", req.method, u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return // a WebSocket: closing ours ends the handler's
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", req.method, u, err)
	}
	if resp.StatusCode >= 500 {
		t.Fatalf("%s %s %q (headers %v): %d %s", req.method, u, req.body, req.header, resp.StatusCode, body)
	}
	if resp.StatusCode < 400 {
		return
	}
	var e api.ErrorBody
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s %s: %d with Content-Type %q: %s", req.method, u, resp.StatusCode, ct, body)
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil || e.Error.Code == "" || e.Error.Message == "" {
		t.Fatalf("%s %s: %d, not the error shape (%v): %s", req.method, u, resp.StatusCode, err, body)
	}
	if e.Error.Code.HTTPStatus() != resp.StatusCode {
		t.Fatalf("%s %s: status %d for code %s: %s", req.method, u, resp.StatusCode, e.Error.Code, body)
	}
}

// FuzzAPI sends every route of the API, and of the in-sandbox API, a
// fuzzed path, query and body, through the real handlers over the fake
// manager.
func FuzzAPI(f *testing.F) {
	routes := Routes()
	for i, rt := range routes {
		method, path, _ := strings.Cut(rt, " ")
		body := fuzzBodies[rt]
		q := fuzzQueries[i%len(fuzzQueries)]
		f.Add(uint16(i), false, method, "box", "v1", "web", q, "application/json", []byte(body))
		f.Add(uint16(i), false, method, "sb-000000000001", "missing", "../x", "", "", []byte(`{"name":1}`))
		if strings.Contains(path, "{sandbox}/checkpoints") || strings.HasSuffix(path, "{sandbox}") {
			f.Add(uint16(i), true, method, "box", "v1", "", q, "application/json", []byte(body))
		}
	}
	f.Add(uint16(0), false, "GET", "box//..", "%2e%2e", "a\x00b", "path=%zz&path=/&&=", "text/plain", []byte("null"))
	f.Add(uint16(1), false, "POST", "", "", "", "", "", []byte(`{"name":"x"} {"name":"y"}`))
	f.Add(uint16(2), false, "PATCH", "box", "", "", "", "", []byte(`{"labels":{"a":1},"resources":{"cpus":"1"}}`))
	f.Add(uint16(3), false, "GET", "sleepy", "v1", "", "", "", []byte(`[`))
	f.Fuzz(func(t *testing.T, route uint16, inside bool, method, p1, p2, p3, query, contentType string, body []byte) {
		daemon, in := fuzzServers()
		srv, token := daemon, testToken
		if inside {
			srv, token = in, NewInside(nil, []byte("secret"), discardLog()).Token("sb-000000000001")
		}
		rt := routes[int(route)%len(routes)]
		m, path, _ := strings.Cut(rt, " ")
		if method == "" {
			method = m
		}
		h := http.Header{"Authorization": {"Bearer " + token}}
		if contentType != "" {
			h.Set("Content-Type", contentType)
		}
		checkAnswer(t, srv, fuzzRequest{method: method, path: fillPattern(path, []string{p1, p2, p3}), query: query, header: h, body: body})
	})
}

// FuzzHeaders sends a few routes fuzzed headers: the token (as a bearer
// token and as a WebSocket subprotocol), the content type, the WebSocket
// upgrade headers, CORS.
func FuzzHeaders(f *testing.F) {
	f.Add("GET", "/v1/sandboxes/box", "Bearer "+testToken, "", "", "", "", "", "")
	f.Add("GET", "/v1/sandboxes", "Bearer", "", "", "", "", "https://example.com", "")
	f.Add("GET", "/v1/sandboxes", "bearer "+testToken, "", "", "", "", "", "")
	f.Add("GET", "/v1/sandboxes/box/exec", "", "websocket", "Upgrade", "13", api.WebSocketProtocol+", "+api.WebSocketTokenPrefix+testToken, "", "")
	f.Add("GET", "/v1/sandboxes/box/exec", "Bearer "+testToken, "websocket", "Upgrade", "8", "", "", "")
	f.Add("GET", "/v1/sandboxes/box/sessions/s1/attach", "Bearer "+testToken, "WebSocket", "keep-alive, Upgrade", "13", "x, , "+api.WebSocketTokenPrefix, "", "")
	f.Add("GET", "/v1/sandboxes/box/ports/8080/stream", "Bearer "+testToken, "websocket", "Upgrade", "13", "", "", "")
	f.Add("GET", "/v1/sandboxes/box/files/watch", "Bearer "+testToken, "h2c", "Upgrade", "", "", "", "")
	f.Add("OPTIONS", "/v1/sandboxes", "", "", "", "", "", "null", "DELETE")
	f.Add("PUT", "/v1/sandboxes/box/files/content", "Bearer "+testToken, "", "", "", "", "", "")
	f.Add("GET", "/v1/sandboxes/box/files/content", "Bearer "+testToken+"x", "", "", "", "", "", "")
	f.Add("POST", "/v1/sandboxes", "Bearer "+testToken, "", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, method, path, auth, upgrade, connection, wsVersion, wsProtocol, origin, acrm string) {
		daemon, _ := fuzzServers()
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		h := http.Header{}
		set := func(k, v string) {
			if v != "" {
				h.Set(k, v)
			}
		}
		set("Authorization", auth)
		set("Upgrade", upgrade)
		set("Connection", connection)
		set("Sec-WebSocket-Version", wsVersion)
		set("Sec-WebSocket-Protocol", wsProtocol)
		set("Origin", origin)
		set("Access-Control-Request-Method", acrm)
		if upgrade != "" {
			set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		}
		set("Content-Type", "application/json")
		checkAnswer(t, daemon, fuzzRequest{method: method, path: path, header: h, body: []byte(`{"name":"hdr"}`)})
	})
}

// FuzzExecRequest feeds the daemon the first message of an exec socket:
// it is a request with a command, or refused as invalid.
func FuzzExecRequest(f *testing.F) {
	f.Add(true, []byte(`{"cmd":["sh","-c","echo hi"],"env":{"A":"1"},"dir":"/tmp","user":"root","tty":true,"rows":24,"cols":80}`))
	f.Add(true, []byte(`{"cmd":[]}`))
	f.Add(true, []byte(`{"cmd":"sh"}`))
	f.Add(true, []byte(`{"cmd":["a"],"env":{"A":1},"rows":"x"}`))
	f.Add(true, []byte(`{"cmd":["a"],"bogus":1}`))
	f.Add(true, []byte(`{"cmd":["a"]} trailing`))
	f.Add(false, []byte(`{"cmd":["a"]}`))
	f.Add(true, []byte(`{"env":{"a":{"b":[1]}}}`))
	f.Fuzz(func(t *testing.T, text bool, first []byte) {
		typ := websocket.MessageBinary
		if text {
			typ = websocket.MessageText
		}
		req, err := execRequest(typ, first)
		var ae *api.Error
		switch {
		case err == nil:
			if len(req.Cmd) == 0 || req.Cmd[0] == "" {
				t.Fatalf("%q accepted with no command", first)
			}
		case !errors.As(err, &ae) || ae.Code != api.CodeInvalid || ae.Message == "":
			t.Fatalf("%q: %v, want invalid", first, err)
		}
	})
}
