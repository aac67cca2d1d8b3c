package server

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/guest"
	"loam.dev/loam/internal/sandbox"
)

// The fake's files: "box" holds /etc/motd ("hello\n") and nothing else.

func (f *fakeSandboxes) fileSandbox(ctx context.Context, ref string) error {
	_, _, err := f.CheckExec(ctx, ref)
	return err
}

func (f *fakeSandboxes) StatFile(ctx context.Context, ref string, q guest.FileQuery, depth int) (*api.FileInfo, error) {
	if err := f.fileSandbox(ctx, ref); err != nil {
		return nil, err
	}
	if q.Path != "/etc/motd" {
		return nil, api.Errorf(api.CodeNotFound, "listing %s in sandbox %s: not found", q.Path, ref)
	}
	return &api.FileInfo{Path: q.Path, Type: api.FileTypeFile, Size: 6, Mode: "0644"}, nil
}

func (f *fakeSandboxes) ReadFile(ctx context.Context, ref string, q guest.FileQuery) (io.ReadCloser, int64, error) {
	if _, err := f.StatFile(ctx, ref, q, 0); err != nil {
		return nil, 0, err
	}
	return io.NopCloser(strings.NewReader("hello\n")), 6, nil
}

func (f *fakeSandboxes) WriteFile(ctx context.Context, ref string, q guest.FileQuery, mode string, body io.Reader, size int64) (*api.FileInfo, error) {
	if err := f.fileSandbox(ctx, ref); err != nil {
		return nil, err
	}
	n, err := io.Copy(io.Discard, body)
	if err != nil {
		return nil, err
	}
	return &api.FileInfo{Path: q.Path, Type: api.FileTypeFile, Size: n, Mode: "0644"}, nil
}

func (f *fakeSandboxes) Mkdir(ctx context.Context, ref string, req api.MkdirRequest) (*api.FileInfo, error) {
	return &api.FileInfo{Path: req.Path, Type: api.FileTypeDir, Mode: "0755"}, f.fileSandbox(ctx, ref)
}

func (f *fakeSandboxes) MoveFile(ctx context.Context, ref string, req api.MoveRequest) (*api.FileInfo, error) {
	return &api.FileInfo{Path: req.To, Type: api.FileTypeFile, Mode: "0644"}, f.fileSandbox(ctx, ref)
}

func (f *fakeSandboxes) RemoveFile(ctx context.Context, ref string, q guest.FileQuery, recursive bool) error {
	_, err := f.StatFile(ctx, ref, q, 0)
	return err
}

func (f *fakeSandboxes) ReadArchive(ctx context.Context, ref string, q guest.FileQuery) (io.ReadCloser, error) {
	return nil, api.Errorf(api.CodeNotFound, "no archives in the fake")
}

func (f *fakeSandboxes) WriteArchive(ctx context.Context, ref string, q guest.FileQuery, tar io.Reader) error {
	return api.Errorf(api.CodeNotFound, "no archives in the fake")
}

func (f *fakeSandboxes) Watch(ctx context.Context, ref string, q guest.FileQuery, recursive bool) (*sandbox.Stream, error) {
	if _, err := f.StatFile(ctx, ref, q, 0); err != nil {
		return nil, err
	}
	return nil, api.Errorf(api.CodeUnavailable, "no watches in the fake")
}

func TestFilesErrorShape(t *testing.T) {
	base := serve(t, New(newFake(), testToken, discardLog(), fakeServices(newFake())...))
	get := func(path string) request { return request{method: "GET", path: path} }
	checkErrors(t, base, []errorCase{
		{name: "no path", req: get("/v1/sandboxes/box/files"), status: 400, code: api.CodeInvalid, msg: "path: give a path"},
		{name: "relative path", req: get("/v1/sandboxes/box/files?path=etc"), status: 400, code: api.CodeInvalid, msg: "not an absolute path"},
		{name: "NUL", req: get("/v1/sandboxes/box/files/content?path=/a%00b"), status: 400, code: api.CodeInvalid, msg: "NUL"},
		{name: "long path", req: get("/v1/sandboxes/box/files?path=/" + strings.Repeat("a", api.MaxFilePath)), status: 400, code: api.CodeInvalid, msg: "bytes long"},
		{name: "bad depth", req: get("/v1/sandboxes/box/files?path=/etc&depth=99"), status: 400, code: api.CodeInvalid, msg: "depth"},
		{name: "bad recursive", req: request{method: "DELETE", path: "/v1/sandboxes/box/files?path=/etc&recursive=yes"}, status: 400, code: api.CodeInvalid, msg: "recursive"},
		{name: "bad user", req: get("/v1/sandboxes/box/files?path=/etc&user=a:b"), status: 400, code: api.CodeInvalid, msg: "user"},
		{name: "missing file", req: get("/v1/sandboxes/box/files/content?path=/nope"), status: 404, code: api.CodeNotFound, msg: "/nope"},
		{name: "missing sandbox", req: get("/v1/sandboxes/nope/files?path=/etc/motd"), status: 404, code: api.CodeNotFound},
		{name: "sleeping sandbox", req: get("/v1/sandboxes/sleepy/files?path=/etc/motd"), status: 409, code: api.CodeConflict},
		{name: "mkdir unknown field", req: request{method: "POST", path: "/v1/sandboxes/box/files/mkdir", body: `{"path":"/a","nope":1}`}, status: 400, code: api.CodeInvalid},
		{name: "POST content", req: request{method: "POST", path: "/v1/sandboxes/box/files/content?path=/a"}, status: 405, code: api.CodeMethodNotAllowed, allow: "GET, HEAD, PUT"},
		{name: "watch without upgrade", req: get("/v1/sandboxes/box/files/watch?path=/nope"), status: 404, code: api.CodeNotFound},
		{name: "no token", req: request{method: "GET", path: "/v1/sandboxes/box/files?path=/etc/motd", token: "-"}, status: 401, code: api.CodeUnauthorized},
	})
}

func TestFilesContent(t *testing.T) {
	base := serve(t, New(newFake(), testToken, discardLog(), fakeServices(newFake())...))
	resp, body := do(t, base, testToken, request{method: "GET", path: "/v1/sandboxes/box/files/content?path=/etc/motd"})
	if resp.StatusCode != http.StatusOK || string(body) != "hello\n" || resp.ContentLength != 6 {
		t.Errorf("GET content: %d %q (length %d)", resp.StatusCode, body, resp.ContentLength)
	}
	resp, body = do(t, base, testToken, request{method: "PUT", path: "/v1/sandboxes/box/files/content?path=/tmp/x", body: "12345"})
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"size":5`) {
		t.Errorf("PUT content: %d %q", resp.StatusCode, body)
	}
}
