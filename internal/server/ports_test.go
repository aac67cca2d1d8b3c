package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/sandbox"
)

// fakePort is the one port something listens on in the fake's "box".
const fakePort = 8000

func (f *fakeSandboxes) CheckPorts(ctx context.Context, ref string) error {
	_, _, err := f.CheckExec(ctx, ref)
	return err
}

func (f *fakeSandboxes) ListPorts(ctx context.Context, ref string) ([]api.Port, error) {
	if err := f.CheckPorts(ctx, ref); err != nil {
		return nil, err
	}
	return []api.Port{{Port: fakePort, Addresses: []string{"0.0.0.0"}}}, nil
}

// WatchPorts sends "open" for fakePort and waits for the client to go.
func (f *fakeSandboxes) WatchPorts(ctx context.Context, ref string) (*sandbox.Stream, error) {
	return fakeAgentSocket(ctx, func(ctx context.Context, c *websocket.Conn) {
		_ = c.Write(ctx, websocket.MessageText, []byte(`{"type":"open","port":8000}`))
		_, _, _ = c.Read(ctx)
	})
}

// DialPort echoes what the client sends, on fakePort only.
func (f *fakeSandboxes) DialPort(ctx context.Context, ref string, port int) (*sandbox.Stream, error) {
	if port != fakePort {
		return nil, api.Errorf(api.CodeNotFound, "nothing listens on TCP port %d in sandbox %s", port, ref)
	}
	return fakeAgentSocket(ctx, func(ctx context.Context, c *websocket.Conn) {
		for {
			typ, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			if c.Write(ctx, typ, b) != nil {
				return
			}
		}
	})
}

// fakeAgentSocket is a Stream over a socket to a one-socket "agent" that
// serves it with serve.
func fakeAgentSocket(ctx context.Context, serve func(context.Context, *websocket.Conn)) (*sandbox.Stream, error) {
	var agent *httptest.Server
	agent = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { go agent.Close() }()
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		serve(r.Context(), c)
	}))
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(agent.URL, "http"), nil)
	if err != nil {
		agent.Close()
		return nil, err
	}
	return sandbox.NewStream(conn), nil
}

func TestPortErrors(t *testing.T) {
	base := serve(t, New(newFake(), testToken, discardLog(), fakeServices(newFake())...))
	get := func(path string) request { return request{method: "GET", path: path} }
	upgrade := map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
	checkErrors(t, base, []errorCase{
		{name: "ports of a missing sandbox", req: get("/v1/sandboxes/nope/ports"), status: 404, code: api.CodeNotFound, msg: "nope"},
		{name: "ports of a sleeping sandbox", req: get("/v1/sandboxes/sleepy/ports"), status: 409, code: api.CodeConflict},
		{name: "POST ports", req: request{method: "POST", path: "/v1/sandboxes/box/ports"}, status: 405, code: api.CodeMethodNotAllowed, allow: "GET, HEAD"},
		{name: "ports without token", req: request{method: "GET", path: "/v1/sandboxes/box/ports", token: "-"}, status: 401, code: api.CodeUnauthorized},
		{name: "watch without upgrade", req: get("/v1/sandboxes/box/ports/watch"), status: 426, code: api.CodeUpgradeRequired, msg: "WebSocket", header: "Upgrade: websocket"},
		{name: "watch on a missing sandbox", req: get("/v1/sandboxes/nope/ports/watch"), status: 404, code: api.CodeNotFound},
		{name: "stream without upgrade", req: get("/v1/sandboxes/box/ports/8000/stream"), status: 426, code: api.CodeUpgradeRequired, header: "Upgrade: websocket"},
		{name: "stream on a sleeping sandbox", req: get("/v1/sandboxes/sleepy/ports/8000/stream"), status: 409, code: api.CodeConflict},
		{name: "stream to a word", req: request{method: "GET", path: "/v1/sandboxes/box/ports/http/stream", header: upgrade}, status: 400, code: api.CodeInvalid, msg: "port"},
		{name: "stream to port 0", req: request{method: "GET", path: "/v1/sandboxes/box/ports/0/stream", header: upgrade}, status: 400, code: api.CodeInvalid},
		{name: "stream to port 65536", req: request{method: "GET", path: "/v1/sandboxes/box/ports/65536/stream", header: upgrade}, status: 400, code: api.CodeInvalid},
		{name: "stream to a closed port", req: request{method: "GET", path: "/v1/sandboxes/box/ports/9/stream", header: upgrade}, status: 404, code: api.CodeNotFound, msg: "nothing listens"},
		{name: "unknown below ports", req: get("/v1/sandboxes/box/ports/8000"), status: 404, code: api.CodeNotFound},
	})
}

// TestPortStream checks that a port stream carries binary messages both
// ways and a watch passes the agent's events on.
func TestPortStream(t *testing.T) {
	base := serve(t, New(newFake(), testToken, discardLog(), fakeServices(newFake())...))
	hdr := http.Header{"Authorization": {"Bearer " + testToken}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws := "ws" + strings.TrimPrefix(base, "http") + "/v1/sandboxes/box/ports"

	c, _, err := websocket.Dial(ctx, ws+"/8000/stream", &websocket.DialOptions{HTTPHeader: hdr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageBinary, []byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	if typ, b, err := c.Read(ctx); err != nil || typ != websocket.MessageBinary || string(b) != "GET / HTTP/1.0\r\n\r\n" {
		t.Fatalf("read %v %q %v, want the bytes sent back", typ, b, err)
	}
	c.Close(websocket.StatusNormalClosure, "")

	w, _, err := websocket.Dial(ctx, ws+"/watch", &websocket.DialOptions{HTTPHeader: hdr})
	if err != nil {
		t.Fatal(err)
	}
	defer w.CloseNow()
	if _, b, err := w.Read(ctx); err != nil || string(b) != `{"type":"open","port":8000}` {
		t.Fatalf("watch read %q %v", b, err)
	}
}
