package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// errorCase is an odd request and the error it must get.
type errorCase struct {
	name string
	req  request
	// status and code of the answer; msg is part of its message.
	status int
	code   api.Code
	msg    string
	// allow is the Allow header a 405 must carry.
	allow string
	// header is a header the answer must carry, as "Name: value".
	header string
}

// checkErrors sends each case to base and checks that its answer is the
// API's JSON error: every answer of the API is JSON, whatever went wrong.
func checkErrors(t *testing.T, base string, cases []errorCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, base, testToken, tc.req)
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d (body %q)", resp.StatusCode, tc.status, body)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q, want application/json (body %q)", ct, body)
			}
			if tc.allow != "" && resp.Header.Get("Allow") != tc.allow {
				t.Errorf("Allow %q, want %q", resp.Header.Get("Allow"), tc.allow)
			}
			if name, value, ok := strings.Cut(tc.header, ": "); ok && resp.Header.Get(name) != value {
				t.Errorf("%s %q, want %q", name, resp.Header.Get(name), value)
			}
			if tc.req.method == http.MethodHead {
				if len(body) != 0 {
					t.Errorf("HEAD answered with a body: %q", body)
				}
				return
			}
			var eb struct {
				Error *struct {
					Code    *api.Code `json:"code"`
					Message *string   `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &eb); err != nil || eb.Error == nil || eb.Error.Code == nil || eb.Error.Message == nil {
				t.Fatalf("body %q is not {\"error\":{\"code\":…,\"message\":…}} (%v)", body, err)
			}
			if *eb.Error.Code != tc.code {
				t.Errorf("code %q, want %q (message %q)", *eb.Error.Code, tc.code, *eb.Error.Message)
			}
			if !strings.Contains(*eb.Error.Message, tc.msg) || *eb.Error.Message == "" {
				t.Errorf("message %q, want it to contain %q", *eb.Error.Message, tc.msg)
			}
		})
	}
}

// labels is a query of n label filters.
func labels(n int, key func(i int) string) string {
	q := url.Values{}
	for i := range n {
		q.Add("label", key(i)+"=v")
	}
	return "/v1/sandboxes?" + q.Encode()
}

func TestErrorShape(t *testing.T) {
	base := serve(t, New(newFake(), testToken, discardLog(), fakeServices(newFake())...))
	get := func(path string) request { return request{method: "GET", path: path} }
	upgrade := func(version string) map[string]string {
		return map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": version}
	}
	cases := []errorCase{
		// Wrong methods on each route.
		{name: "PUT templates", req: request{method: "PUT", path: "/v1/templates"}, status: 405, code: api.CodeMethodNotAllowed, msg: "PUT", allow: "GET, HEAD, POST"},
		{name: "DELETE sandboxes", req: request{method: "DELETE", path: "/v1/sandboxes"}, status: 405, code: api.CodeMethodNotAllowed, msg: "DELETE", allow: "GET, HEAD, POST"},
		{name: "PUT sandbox", req: request{method: "PUT", path: "/v1/sandboxes/box", body: "{}"}, status: 405, code: api.CodeMethodNotAllowed, allow: "DELETE, GET, HEAD, PATCH"},
		{name: "POST exec", req: request{method: "POST", path: "/v1/sandboxes/box/exec"}, status: 405, code: api.CodeMethodNotAllowed, allow: "GET, HEAD"},
		{name: "PUT checkpoints", req: request{method: "PUT", path: "/v1/sandboxes/box/checkpoints"}, status: 405, code: api.CodeMethodNotAllowed, allow: "GET, HEAD, POST"},
		{name: "POST checkpoint", req: request{method: "POST", path: "/v1/sandboxes/box/checkpoints/v1"}, status: 405, code: api.CodeMethodNotAllowed, allow: "DELETE, GET, HEAD"},
		{name: "GET restore", req: get("/v1/sandboxes/box/checkpoints/v1/restore"), status: 405, code: api.CodeMethodNotAllowed, allow: "POST"},
		{name: "POST healthz", req: request{method: "POST", path: "/healthz"}, status: 405, code: api.CodeMethodNotAllowed, allow: "GET, HEAD"},
		{name: "OPTIONS", req: request{method: "OPTIONS", path: "/v1/sandboxes"}, status: 405, code: api.CodeMethodNotAllowed, allow: "GET, HEAD, POST"},
		{name: "wrong method without token", req: request{method: "DELETE", path: "/v1/sandboxes", token: "-"}, status: 405, code: api.CodeMethodNotAllowed},

		// Unknown paths.
		{name: "unknown", req: get("/v1/nope"), status: 404, code: api.CodeNotFound, msg: "/v1/nope"},
		{name: "unknown below a sandbox", req: get("/v1/sandboxes/box/nope"), status: 404, code: api.CodeNotFound},
		{name: "unknown version", req: get("/v2/sandboxes"), status: 404, code: api.CodeNotFound},
		{name: "root", req: get("/"), status: 404, code: api.CodeNotFound},
		{name: "trailing slash", req: get("/v1/sandboxes/"), status: 404, code: api.CodeNotFound},
		{name: "unknown without token", req: request{method: "GET", path: "/v1/nope", token: "-"}, status: 404, code: api.CodeNotFound},

		// Unclean paths are not redirected (with an HTML body): they name the clean path.
		{name: "double slash", req: get("/v1//sandboxes"), status: 404, code: api.CodeNotFound, msg: `"/v1/sandboxes"`},
		{name: "dot", req: get("/v1/./sandboxes/box"), status: 404, code: api.CodeNotFound, msg: `"/v1/sandboxes/box"`},
		{name: "dot dot", req: get("/v1/sandboxes/../templates"), status: 404, code: api.CodeNotFound, msg: `"/v1/templates"`},
		{name: "unclean and unknown", req: request{method: "DELETE", path: "/v1//nope"}, status: 404, code: api.CodeNotFound, msg: `"/v1/nope"`},

		// Exec without the WebSocket upgrade; refusals about the sandbox come first.
		{name: "exec without upgrade", req: get("/v1/sandboxes/box/exec"), status: 426, code: api.CodeUpgradeRequired, msg: "WebSocket", header: "Upgrade: websocket"},
		{name: "HEAD exec", req: request{method: "HEAD", path: "/v1/sandboxes/box/exec"}, status: 426, header: "Upgrade: websocket"},
		{name: "exec on a missing sandbox", req: get("/v1/sandboxes/nope/exec"), status: 404, code: api.CodeNotFound, msg: "nope"},
		{name: "exec on a sleeping sandbox", req: get("/v1/sandboxes/sleepy/exec"), status: 409, code: api.CodeConflict},
		{name: "exec without a key", req: request{method: "GET", path: "/v1/sandboxes/box/exec", header: upgrade("13")}, status: 400, code: api.CodeInvalid, msg: "exec: WebSocket protocol violation: missing Sec-WebSocket-Key"},
		{name: "exec of another version", req: request{method: "GET", path: "/v1/sandboxes/box/exec", header: upgrade("8")}, status: 400, code: api.CodeInvalid, msg: "version", header: "Sec-WebSocket-Version: 13"},
		{name: "exec without token", req: request{method: "GET", path: "/v1/sandboxes/box/exec", token: "-"}, status: 401, code: api.CodeUnauthorized},

		// HEAD is GET without the body.
		{name: "HEAD missing sandbox", req: request{method: "HEAD", path: "/v1/sandboxes/nope"}, status: 404},
		{name: "HEAD without token", req: request{method: "HEAD", path: "/v1/sandboxes", token: "-"}, status: 401},

		// Bodies of the wrong type name the body, and nested fields by path.
		{name: "array body", req: request{method: "POST", path: "/v1/sandboxes", body: "[]"}, status: 400, code: api.CodeInvalid, msg: "body: must be an object, not an array"},
		{name: "null body", req: request{method: "POST", path: "/v1/sandboxes", body: "null"}, status: 400, code: api.CodeInvalid, msg: "body: must be an object, not null"},
		{name: "number body", req: request{method: "POST", path: "/v1/sandboxes", body: "1"}, status: 400, code: api.CodeInvalid, msg: "body: must be an object, not a number"},
		{name: "string body", req: request{method: "POST", path: "/v1/sandboxes", body: `"x"`}, status: 400, code: api.CodeInvalid, msg: "body: must be an object, not a string"},
		{name: "bool body", req: request{method: "POST", path: "/v1/sandboxes", body: `true`}, status: 400, code: api.CodeInvalid, msg: "body: must be an object, not true or false"},
		{name: "empty body", req: request{method: "POST", path: "/v1/sandboxes"}, status: 400, code: api.CodeInvalid, msg: "body: empty"},
		{name: "array checkpoint body", req: request{method: "POST", path: "/v1/sandboxes/box/checkpoints", body: "[]"}, status: 400, code: api.CodeInvalid, msg: "body: must be an object, not an array"},
		{name: "null checkpoint body", req: request{method: "POST", path: "/v1/sandboxes/box/checkpoints", body: "null"}, status: 400, code: api.CodeInvalid, msg: "body: must be an object, not null"},
		{name: "nested object", req: request{method: "POST", path: "/v1/sandboxes", body: `{"resources":[]}`}, status: 400, code: api.CodeInvalid, msg: "resources: must be an object, not an array"},
		{name: "nested number", req: request{method: "POST", path: "/v1/sandboxes", body: `{"resources":{"cpus":"1"}}`}, status: 400, code: api.CodeInvalid, msg: "resources.cpus: must be a number, not a string"},
		{name: "fraction for an integer", req: request{method: "POST", path: "/v1/sandboxes", body: `{"resources":{"memory_mib":1.5}}`}, status: 400, code: api.CodeInvalid, msg: "resources.memory_mib: must be an integer, not 1.5"},
		{name: "map value", req: request{method: "POST", path: "/v1/sandboxes", body: `{"labels":{"a":1}}`}, status: 400, code: api.CodeInvalid, msg: "labels: each value must be a string, not a number"},
		{name: "nested string", req: request{method: "POST", path: "/v1/sandboxes", body: `{"from":{"sandbox":1}}`}, status: 400, code: api.CodeInvalid, msg: "from.sandbox: must be a string, not a number"},
		{name: "bool field", req: request{method: "POST", path: "/v1/sandboxes/box/checkpoints", body: `{"memory":"no"}`}, status: 400, code: api.CodeInvalid, msg: "memory: must be true or false, not a string"},
		{name: "string for an integer", req: request{method: "POST", path: "/v1/sandboxes", body: `{"http_port":"80"}`}, status: 400, code: api.CodeInvalid, msg: "http_port: must be an integer, not a string"},
		{name: "big body", req: request{method: "POST", path: "/v1/sandboxes", body: `{"name":"` + strings.Repeat("a", 2<<20) + `"}`}, status: 400, code: api.CodeInvalid, msg: "body: larger than 1048576 bytes"},
		{name: "unknown field", req: request{method: "POST", path: "/v1/sandboxes", body: `{"nmae":"x"}`}, status: 400, code: api.CodeInvalid, msg: "nmae: unknown field"},
		{name: "two values", req: request{method: "POST", path: "/v1/sandboxes", body: `{}{}`}, status: 400, code: api.CodeInvalid, msg: "more than one JSON value"},
		{name: "bad JSON", req: request{method: "POST", path: "/v1/sandboxes", body: `{"name":`}, status: 400, code: api.CodeInvalid, msg: "body"},

		// A member named twice: encoding/json would keep the last one,
		// other parsers the first.
		{name: "duplicate key", req: request{method: "POST", path: "/v1/sandboxes", body: `{"name":"a","name":"b"}`}, status: 400, code: api.CodeInvalid, msg: "name: given twice"},
		{name: "duplicate key, escaped", req: request{method: "POST", path: "/v1/sandboxes", body: `{"name":"a","\u006eame":"b"}`}, status: 400, code: api.CodeInvalid, msg: "name: given twice"},
		{name: "duplicate nested key", req: request{method: "POST", path: "/v1/sandboxes", body: `{"resources":{"cpus":1,"cpus":2}}`}, status: 400, code: api.CodeInvalid, msg: "resources.cpus: given twice"},
		{name: "duplicate label", req: request{method: "POST", path: "/v1/sandboxes", body: `{"labels":{"team":"red","team":"blue"}}`}, status: 400, code: api.CodeInvalid, msg: "labels.team: given twice"},
		{name: "duplicate key in a checkpoint", req: request{method: "POST", path: "/v1/sandboxes/box/checkpoints", body: `{"memory":true,"memory":false}`}, status: 400, code: api.CodeInvalid, msg: "memory: given twice"},

		// JSON is UTF-8: invalid bytes are refused, not made U+FFFD.
		{name: "label of invalid UTF-8", req: request{method: "POST", path: "/v1/sandboxes", body: "{\"labels\":{\"team\":\"caf\xe9\"}}"}, status: 400, code: api.CodeInvalid, msg: "body: not valid UTF-8"},
		{name: "name of invalid UTF-8", req: request{method: "POST", path: "/v1/sandboxes", body: "{\"name\":\"\xff\"}"}, status: 400, code: api.CodeInvalid, msg: "body: not valid UTF-8"},

		// Label filters are checked as labels are, and bounded.
		{name: "a thousand label filters", req: get(labels(1000, func(i int) string { return fmt.Sprint("k", i) })), status: 400, code: api.CodeInvalid, msg: "at most 64"},
		{name: "65 label filters", req: get(labels(65, func(i int) string { return fmt.Sprint("k", i) })), status: 400, code: api.CodeInvalid, msg: "at most 64"},
		{name: "label filter without value", req: get("/v1/sandboxes?label=team"), status: 400, code: api.CodeInvalid, msg: "key=value"},
		{name: "label filter with a bad key", req: get("/v1/sandboxes?label=" + url.QueryEscape("te am=red")), status: 400, code: api.CodeInvalid, msg: `"te am"`},
		{name: "label filter with a long key", req: get("/v1/sandboxes?label=" + strings.Repeat("k", 64) + "=v"), status: 400, code: api.CodeInvalid},
		{name: "label filter with a long value", req: get("/v1/sandboxes?label=team=" + strings.Repeat("v", 256)), status: 400, code: api.CodeInvalid, msg: "255"},
		{name: "label key twice", req: get("/v1/sandboxes?label=team=red&label=team=blue"), status: 400, code: api.CodeInvalid, msg: "team"},
		{name: "label filter of invalid UTF-8", req: get("/v1/sandboxes?label=team=caf%E9"), status: 400, code: api.CodeInvalid, msg: "UTF-8"},

		{name: "no token", req: request{method: "GET", path: "/v1/sandboxes", token: "-"}, status: 401, code: api.CodeUnauthorized},
		{name: "missing sandbox", req: get("/v1/sandboxes/nope"), status: 404, code: api.CodeNotFound},
	}
	checkErrors(t, base, cases)
}

func TestLabelFilters(t *testing.T) {
	fake := newFake()
	base := serve(t, New(fake, testToken, discardLog(), fakeServices(fake)...))
	tests := []struct {
		name  string
		path  string
		want  map[string]string
		count int
	}{
		{"none", "/v1/sandboxes", map[string]string{}, 2},
		{"one", "/v1/sandboxes?label=team=red", map[string]string{"team": "red"}, 1},
		{"empty value", "/v1/sandboxes?label=team=", map[string]string{"team": ""}, 0},
		{"value with =", "/v1/sandboxes?label=team=a=b", map[string]string{"team": "a=b"}, 0},
		{"same filter twice", "/v1/sandboxes?label=team=red&label=team=red", map[string]string{"team": "red"}, 1},
		{"key of every kind", "/v1/sandboxes?label=" + url.QueryEscape("a.b_c/d-E9=x"), map[string]string{"a.b_c/d-E9": "x"}, 0},
		{"64 filters", labels(64, func(i int) string { return fmt.Sprint("k", i) }), nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := do(t, base, testToken, request{method: "GET", path: tt.path})
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			var list api.SandboxList
			if err := json.Unmarshal(body, &list); err != nil {
				t.Fatal(err)
			}
			if len(list.Sandboxes) != tt.count {
				t.Errorf("%d sandboxes, want %d", len(list.Sandboxes), tt.count)
			}
			got := fake.lastFilter()
			if tt.want == nil {
				if len(got) != 64 {
					t.Errorf("filter of %d labels, want 64", len(got))
				}
			} else if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("filter %v, want %v", got, tt.want)
			}
		})
	}
}

// TestInsideErrorShape checks the in-sandbox API answers odd requests with
// the same JSON errors.
func TestInsideErrorShape(t *testing.T) {
	in := NewInside(newFake(), []byte("secret"), discardLog())
	base := serve(t, in.handler("sb-000000000001"))
	tok := in.Token("sb-000000000001")
	cases := []errorCase{
		{name: "DELETE own sandbox", req: request{method: "DELETE", path: "/v1/sandboxes/box", token: tok}, status: 405, code: api.CodeMethodNotAllowed, allow: "GET, HEAD"},
		{name: "GET restore", req: request{method: "GET", path: "/v1/sandboxes/box/checkpoints/v1/restore", token: tok}, status: 405, code: api.CodeMethodNotAllowed, allow: "POST"},
		{name: "templates", req: request{method: "GET", path: "/v1/templates", token: tok}, status: 404, code: api.CodeNotFound, msg: "no such endpoint inside a sandbox: GET /v1/templates"},
		{name: "list", req: request{method: "GET", path: "/v1/sandboxes", token: tok}, status: 404, code: api.CodeNotFound},
		{name: "unclean", req: request{method: "GET", path: "/v1//sandboxes/box", token: tok}, status: 404, code: api.CodeNotFound, msg: `"/v1/sandboxes/box"`},
		{name: "array body", req: request{method: "POST", path: "/v1/sandboxes/box/checkpoints", token: tok, body: "[]"}, status: 400, code: api.CodeInvalid, msg: "body: must be an object, not an array"},
		{name: "another sandbox", req: request{method: "GET", path: "/v1/sandboxes/sleepy", token: tok}, status: 404, code: api.CodeNotFound},
		{name: "the daemon's token", req: request{method: "GET", path: "/v1/sandboxes/box"}, status: 401, code: api.CodeUnauthorized},
	}
	checkErrors(t, base, cases)
}

// TestSuccess checks that ordinary requests still succeed, exec's
// WebSocket included.
func TestSuccess(t *testing.T) {
	base := serve(t, New(newFake(), testToken, discardLog(), fakeServices(newFake())...))
	tests := []struct {
		req    request
		status int
	}{
		{request{method: "GET", path: "/healthz", token: "-"}, 200},
		{request{method: "GET", path: "/v1/templates"}, 200},
		{request{method: "HEAD", path: "/v1/sandboxes"}, 200},
		{request{method: "POST", path: "/v1/sandboxes", body: `{"name":"new"}`}, 201},
		{request{method: "GET", path: "/v1/sandboxes/box"}, 200},
		{request{method: "DELETE", path: "/v1/sandboxes/box"}, 204},
		{request{method: "POST", path: "/v1/sandboxes/box/checkpoints"}, 201},
		{request{method: "POST", path: "/v1/sandboxes/box/checkpoints", body: `{"memory":false}`}, 201},
		{request{method: "GET", path: "/v1/sandboxes/box/checkpoints"}, 200},
		{request{method: "GET", path: "/v1/sandboxes/box/checkpoints/v1"}, 200},
		{request{method: "POST", path: "/v1/sandboxes/box/checkpoints/v1/restore"}, 200},
		{request{method: "DELETE", path: "/v1/sandboxes/box/checkpoints/v1"}, 204},
	}
	for _, tt := range tests {
		t.Run(tt.req.method+" "+tt.req.path, func(t *testing.T) {
			resp, body := do(t, base, testToken, tt.req)
			if resp.StatusCode != tt.status {
				t.Errorf("status %d, want %d: %s", resp.StatusCode, tt.status, body)
			}
		})
	}
}

// TestExec checks the exec WebSocket still upgrades through the writers
// that wrap it, and that a first message of the wrong kind is named.
func TestExec(t *testing.T) {
	base := serve(t, New(newFake(), testToken, discardLog(), fakeServices(newFake())...))
	hdr := http.Header{"Authorization": {"Bearer " + testToken}}
	tests := []struct {
		name  string
		first string
		want  api.ExecControl
	}{
		{"runs", `{"cmd":["true"]}`, api.ExecControl{Type: api.ExecExit}},
		{"array", `[]`, api.ExecControl{Type: api.ExecError, Error: api.Errorf(api.CodeInvalid, "body: must be an object, not an array")}},
		{"wrong field", `{"cmd":"true"}`, api.ExecControl{Type: api.ExecError, Error: api.Errorf(api.CodeInvalid, "cmd: must be an array, not a string")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/v1/sandboxes/box/exec", &websocket.DialOptions{HTTPHeader: hdr})
			if err != nil {
				t.Fatal(err)
			}
			defer c.CloseNow()
			if err := c.Write(ctx, websocket.MessageText, []byte(tt.first)); err != nil {
				t.Fatal(err)
			}
			_, b, err := c.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var got api.ExecControl
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			got.ExitCode = nil
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %s, want %+v", b, tt.want)
			}
		})
	}
}

// TestWebSocketTokenSubprotocol checks that a WebSocket can carry the token
// as a subprotocol, as a browser must, that the server picks
// api.WebSocketProtocol and never echoes the token, and that a wrong token,
// or the subprotocol on a request that is no upgrade, is refused.
func TestWebSocketTokenSubprotocol(t *testing.T) {
	base := serve(t, New(newFake(), testToken, discardLog(), fakeServices(newFake())...))
	ws := "ws" + strings.TrimPrefix(base, "http")
	tests := []struct {
		name      string
		protocols []string
		path      string
		ok        bool
	}{
		{"exec", []string{api.WebSocketProtocol, api.WebSocketTokenPrefix + testToken}, "/v1/sandboxes/box/exec", true},
		{"token first", []string{api.WebSocketTokenPrefix + testToken, api.WebSocketProtocol}, "/v1/sandboxes/box/exec", true},
		{"port watch", []string{api.WebSocketProtocol, api.WebSocketTokenPrefix + testToken}, "/v1/sandboxes/box/ports/watch", true},
		{"wrong token", []string{api.WebSocketProtocol, api.WebSocketTokenPrefix + "wrong"}, "/v1/sandboxes/box/exec", false},
		{"token prefix only", []string{api.WebSocketProtocol, api.WebSocketTokenPrefix}, "/v1/sandboxes/box/exec", false},
		{"longer token", []string{api.WebSocketProtocol, api.WebSocketTokenPrefix + testToken + "x"}, "/v1/sandboxes/box/exec", false},
		{"no token", []string{api.WebSocketProtocol}, "/v1/sandboxes/box/exec", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, resp, err := websocket.Dial(ctx, ws+tt.path, &websocket.DialOptions{Subprotocols: tt.protocols})
			if !tt.ok {
				if err == nil {
					c.CloseNow()
					t.Fatal("dialled without the right token")
				}
				if resp == nil || resp.StatusCode != http.StatusUnauthorized {
					t.Fatalf("answer %v, want 401 (%v)", resp, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.CloseNow()
			if c.Subprotocol() != api.WebSocketProtocol {
				t.Errorf("subprotocol %q, want %q", c.Subprotocol(), api.WebSocketProtocol)
			}
			if got := resp.Header.Values("Sec-WebSocket-Protocol"); len(got) != 1 || got[0] != api.WebSocketProtocol {
				t.Errorf("Sec-WebSocket-Protocol %q, want only %q", got, api.WebSocketProtocol)
			}
		})
	}
	// Outside an upgrade the subprotocol header is no credential.
	checkErrors(t, base, []errorCase{
		{name: "subprotocol on plain GET", req: request{method: "GET", path: "/v1/sandboxes", token: "-",
			header: map[string]string{"Sec-WebSocket-Protocol": api.WebSocketTokenPrefix + testToken}}, status: 401, code: api.CodeUnauthorized},
	})
}

// TestCORS: a web page of any origin may call the API with its token (a
// preflight is answered without one), and read the answer; a call without
// the token is still refused; the in-sandbox API takes no part.
func TestCORS(t *testing.T) {
	base := serve(t, New(newFake(), testToken, discardLog(), fakeServices(newFake())...))
	origin := map[string]string{"Origin": "https://app.example.com"}
	resp, _ := do(t, base, testToken, request{method: "OPTIONS", path: "/v1/sandboxes/box", token: "-",
		header: map[string]string{"Origin": "https://app.example.com", "Access-Control-Request-Method": "PATCH", "Access-Control-Request-Headers": "authorization, content-type"}})
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != "*" ||
		!strings.Contains(resp.Header.Get("Access-Control-Allow-Methods"), "PATCH") ||
		!strings.Contains(resp.Header.Get("Access-Control-Allow-Headers"), "Authorization") {
		t.Errorf("preflight: %d %v", resp.StatusCode, resp.Header)
	}
	resp, body := do(t, base, testToken, request{method: "GET", path: "/v1/sandboxes/box", header: origin})
	if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("GET with an Origin: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	resp, _ = do(t, base, testToken, request{method: "GET", path: "/v1/sandboxes/box", token: "-", header: origin})
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET with an Origin and no token: %d", resp.StatusCode)
	}
	resp, _ = do(t, base, testToken, request{method: "GET", path: "/v1/sandboxes/box"})
	if resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("an answer without an Origin carries CORS headers: %v", resp.Header)
	}
}
