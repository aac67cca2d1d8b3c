package server

import (
	"context"
	"net/http"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/sandbox"
)

// The fake's sessions: box has one, s-000000000001, running; no other
// sandbox has any.

const fakeSession = "s-000000000001"

func (f *fakeSandboxes) session(ctx context.Context, sandbox, id string) (*api.Session, error) {
	sb, err := f.Get(ctx, sandbox)
	if err != nil {
		return nil, err
	}
	if sb.Name != "box" || id != fakeSession {
		return nil, api.Errorf(api.CodeNotFound, "sandbox %s has no session %q", sb.Name, id)
	}
	return &api.Session{ID: fakeSession, PID: 7, Cmd: []string{"sleep", "1000"}, Detachable: true,
		State: api.SessionRunning, StartedAt: time.Unix(0, 0).UTC()}, nil
}

func (f *fakeSandboxes) CreateSession(ctx context.Context, sandbox string, req api.ExecRequest) (*api.Session, error) {
	return f.session(ctx, sandbox, fakeSession)
}

func (f *fakeSandboxes) ListSessions(ctx context.Context, sandbox string) ([]api.Session, error) {
	s, err := f.session(ctx, sandbox, fakeSession)
	if err != nil {
		return nil, err
	}
	return []api.Session{*s}, nil
}

func (f *fakeSandboxes) GetSession(ctx context.Context, sandbox, id string) (*api.Session, error) {
	return f.session(ctx, sandbox, id)
}

func (f *fakeSandboxes) WaitSession(ctx context.Context, sandbox, id string) (*api.Session, error) {
	return f.session(ctx, sandbox, id)
}

func (f *fakeSandboxes) SignalSession(ctx context.Context, sandbox, id string, req api.SignalSession) error {
	_, err := f.session(ctx, sandbox, id)
	return err
}

func (f *fakeSandboxes) DeleteSession(ctx context.Context, sandbox, id string) error {
	_, err := f.session(ctx, sandbox, id)
	return err
}

func (f *fakeSandboxes) AttachSession(ctx context.Context, sandbox, id string, p api.AttachParams) (*sandbox.Stream, error) {
	if _, err := f.session(ctx, sandbox, id); err != nil {
		return nil, err
	}
	return nil, api.Errorf(api.CodeConflict, "session %s is not detachable", id)
}

func TestSessionErrors(t *testing.T) {
	base := serve(t, New(newFake(), testToken, discardLog(), fakeServices(newFake())...))
	get := func(path string) request { return request{method: "GET", path: path} }
	const sess = "/v1/sandboxes/box/sessions/" + fakeSession
	checkErrors(t, base, []errorCase{
		{name: "no sandbox", req: get("/v1/sandboxes/nope/sessions"), status: 404, code: api.CodeNotFound, msg: "nope"},
		{name: "no session", req: get("/v1/sandboxes/box/sessions/s-nope"), status: 404, code: api.CodeNotFound, msg: "s-nope"},
		{name: "create without cmd", req: request{method: "POST", path: "/v1/sandboxes/box/sessions", body: `{}`}, status: 400, code: api.CodeInvalid, msg: "cmd"},
		{name: "create with an unknown field", req: request{method: "POST", path: "/v1/sandboxes/box/sessions", body: `{"cmd":["x"],"detach":true}`}, status: 400, code: api.CodeInvalid, msg: "detach"},
		{name: "signal without a body", req: request{method: "POST", path: sess + "/signal"}, status: 400, code: api.CodeInvalid},
		{name: "PUT session", req: request{method: "PUT", path: sess}, status: 405, code: api.CodeMethodNotAllowed, allow: "DELETE, GET, HEAD"},
		{name: "GET wait", req: get(sess + "/wait"), status: 405, code: api.CodeMethodNotAllowed, allow: "POST"},
		{name: "bad offset", req: get(sess + "/attach?offset=-1"), status: 400, code: api.CodeInvalid, msg: "offset"},
		{name: "bad stderr offset", req: get(sess + "/attach?stderr_offset=x"), status: 400, code: api.CodeInvalid, msg: "stderr_offset"},
		{name: "bad follow", req: get(sess + "/attach?follow=maybe"), status: 400, code: api.CodeInvalid, msg: "follow"},
		{name: "attach refused before the upgrade", req: get(sess + "/attach"), status: 409, code: api.CodeConflict, msg: "not detachable"},
	})
}

func TestSessionSuccess(t *testing.T) {
	base := serve(t, New(newFake(), testToken, discardLog(), fakeServices(newFake())...))
	const sess = "/v1/sandboxes/box/sessions/" + fakeSession
	for _, tc := range []struct {
		req    request
		status int
	}{
		{request{method: "POST", path: "/v1/sandboxes/box/sessions", body: `{"cmd":["sleep","1000"],"buffer_size":4096}`}, http.StatusCreated},
		{request{method: "GET", path: "/v1/sandboxes/box/sessions"}, http.StatusOK},
		{request{method: "GET", path: sess}, http.StatusOK},
		{request{method: "POST", path: sess + "/wait"}, http.StatusOK},
		{request{method: "POST", path: sess + "/signal", body: `{"signal":"TERM"}`}, http.StatusNoContent},
		{request{method: "DELETE", path: sess}, http.StatusNoContent},
	} {
		resp, body := do(t, base, testToken, tc.req)
		if resp.StatusCode != tc.status {
			t.Errorf("%s %s: %d %q, want %d", tc.req.method, tc.req.path, resp.StatusCode, body, tc.status)
		}
	}
}
