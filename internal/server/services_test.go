package server

import (
	"context"
	"net/http"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/sandbox"
)

// The fake's services: box has one, web, running; no other sandbox has any.

func (f *fakeSandboxes) service(ctx context.Context, sandbox, name string) (*api.ServiceStatus, error) {
	sb, err := f.Get(ctx, sandbox)
	if err != nil {
		return nil, err
	}
	if sb.Name != "box" || name != "web" {
		return nil, api.Errorf(api.CodeNotFound, "sandbox %s has no service %q", sb.Name, name)
	}
	return &api.ServiceStatus{Service: api.Service{Name: "web", Cmd: []string{"sleep", "1000"}},
		State: api.ServiceRunning, PID: 7}, nil
}

func (f *fakeSandboxes) PutService(ctx context.Context, sandbox string, def api.Service) (*api.ServiceStatus, bool, error) {
	if _, err := f.Get(ctx, sandbox); err != nil {
		return nil, false, err
	}
	return &api.ServiceStatus{Service: def, State: api.ServiceRunning, PID: 8}, def.Name != "web", nil
}

func (f *fakeSandboxes) ListServices(ctx context.Context, sandbox string) ([]api.ServiceStatus, error) {
	s, err := f.service(ctx, sandbox, "web")
	if err != nil {
		return nil, err
	}
	return []api.ServiceStatus{*s}, nil
}

func (f *fakeSandboxes) GetService(ctx context.Context, sandbox, name string) (*api.ServiceStatus, error) {
	return f.service(ctx, sandbox, name)
}

func (f *fakeSandboxes) ServiceAction(ctx context.Context, sandbox, name, action string) (*api.ServiceStatus, error) {
	return f.service(ctx, sandbox, name)
}

func (f *fakeSandboxes) DeleteService(ctx context.Context, sandbox, name string) error {
	_, err := f.service(ctx, sandbox, name)
	return err
}

func (f *fakeSandboxes) ServiceLogs(ctx context.Context, sandbox, name string, p api.AttachParams) (*sandbox.Stream, error) {
	if _, err := f.service(ctx, sandbox, name); err != nil {
		return nil, err
	}
	return nil, api.Errorf(api.CodeUnavailable, "the sandbox's agent does not answer")
}

func TestServiceErrors(t *testing.T) {
	base := serve(t, New(newFake(), testToken, discardLog(), fakeServices(newFake())...))
	get := func(path string) request { return request{method: "GET", path: path} }
	const web = "/v1/sandboxes/box/services/web"
	checkErrors(t, base, []errorCase{
		{name: "no sandbox", req: get("/v1/sandboxes/nope/services"), status: 404, code: api.CodeNotFound, msg: "nope"},
		{name: "no service", req: get("/v1/sandboxes/box/services/db"), status: 404, code: api.CodeNotFound, msg: "db"},
		{name: "put without cmd", req: request{method: "PUT", path: web, body: `{}`}, status: 400, code: api.CodeInvalid, msg: "cmd"},
		{name: "put with another name", req: request{method: "PUT", path: web, body: `{"name":"db","cmd":["x"]}`}, status: 400, code: api.CodeInvalid, msg: "db"},
		{name: "put with a bad name", req: request{method: "PUT", path: "/v1/sandboxes/box/services/Web_1", body: `{"cmd":["x"]}`}, status: 400, code: api.CodeInvalid, msg: "name"},
		{name: "put with a bad restart", req: request{method: "PUT", path: web, body: `{"cmd":["x"],"restart":"sometimes"}`}, status: 400, code: api.CodeInvalid, msg: "restart"},
		{name: "put with an unknown field", req: request{method: "PUT", path: web, body: `{"cmd":["x"],"restarts":"never"}`}, status: 400, code: api.CodeInvalid, msg: "restarts"},
		{name: "put without a body", req: request{method: "PUT", path: web}, status: 400, code: api.CodeInvalid},
		{name: "POST service", req: request{method: "POST", path: web}, status: 405, code: api.CodeMethodNotAllowed, allow: "DELETE, GET, HEAD, PUT"},
		{name: "GET start", req: get(web + "/start"), status: 405, code: api.CodeMethodNotAllowed, allow: "POST"},
		{name: "unknown action", req: request{method: "POST", path: web + "/pause"}, status: 404, code: api.CodeNotFound},
		{name: "bad offset", req: get(web + "/logs?offset=-1"), status: 400, code: api.CodeInvalid, msg: "offset"},
		{name: "bad follow", req: get(web + "/logs?follow=maybe"), status: 400, code: api.CodeInvalid, msg: "follow"},
		{name: "logs refused before the upgrade", req: get(web + "/logs"), status: 503, code: api.CodeUnavailable},
	})
}

func TestServiceSuccess(t *testing.T) {
	base := serve(t, New(newFake(), testToken, discardLog(), fakeServices(newFake())...))
	const web = "/v1/sandboxes/box/services/web"
	for _, tc := range []struct {
		req    request
		status int
	}{
		{request{method: "PUT", path: "/v1/sandboxes/box/services/db", body: `{"cmd":["postgres"],"restart":"on-failure"}`}, http.StatusCreated},
		{request{method: "PUT", path: web, body: `{"name":"web","cmd":["sleep","1000"]}`}, http.StatusOK},
		{request{method: "GET", path: "/v1/sandboxes/box/services"}, http.StatusOK},
		{request{method: "GET", path: web}, http.StatusOK},
		{request{method: "POST", path: web + "/start"}, http.StatusOK},
		{request{method: "POST", path: web + "/stop"}, http.StatusOK},
		{request{method: "POST", path: web + "/restart"}, http.StatusOK},
		{request{method: "DELETE", path: web}, http.StatusNoContent},
	} {
		resp, body := do(t, base, testToken, tc.req)
		if resp.StatusCode != tc.status {
			t.Errorf("%s %s: %d %q, want %d", tc.req.method, tc.req.path, resp.StatusCode, body, tc.status)
		}
	}
}
