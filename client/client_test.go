package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"loam.dev/loam/api"
)

// recorded is what the fake API saw of one request.
type recorded struct {
	method, uri, auth, contentType string
	body                           []byte
}

// fakeAPI answers every request with status and body and records the request.
func fakeAPI(t *testing.T, status int, body string) (*Client, *recorded) {
	t.Helper()
	rec := &recorded{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.method = r.Method
		rec.uri = r.RequestURI
		rec.auth = r.Header.Get("Authorization")
		rec.contentType = r.Header.Get("Content-Type")
		rec.body, _ = io.ReadAll(r.Body)
		if body != "" {
			w.Header().Set("Content-Type", "application/json")
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return New(srv.URL+"/", "tok"), rec
}

func TestErrorDecoding(t *testing.T) {
	tests := []struct {
		name     string
		status   int
		body     string
		sentinel error
		message  string
	}{
		{"api error", 404, `{"error":{"code":"not_found","message":"sandbox nope not found"}}`, api.ErrNotFound, "sandbox nope not found"},
		{"code wins over status", 409, `{"error":{"code":"limit","message":"too many checkpoints"}}`, api.ErrLimit, "too many checkpoints"},
		{"plain text", 503, "upstream down\n", api.ErrUnavailable, "Service Unavailable"},
		{"json without error", 400, `{"oops":1}`, api.ErrInvalid, "Bad Request"},
		{"empty body", 401, "", api.ErrUnauthorized, "Unauthorized"},
		{"forbidden", 403, "", api.ErrForbidden, "Forbidden"},
		{"method not allowed", 405, `{"error":{"code":"method_not_allowed","message":"PUT is not allowed on /v1/sandboxes"}}`, api.ErrMethodNotAllowed, "PUT is not allowed on /v1/sandboxes"},
		{"method not allowed without body", 405, "", api.ErrMethodNotAllowed, "Method Not Allowed"},
		{"upgrade required", 426, "", api.ErrUpgradeRequired, "Upgrade Required"},
		{"unknown status", 418, "", api.ErrInternal, "I'm a teapot"},
		{"bad gateway", 502, "<html>", api.ErrInternal, "Bad Gateway"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := fakeAPI(t, tt.status, tt.body)
			_, err := c.GetSandbox(context.Background(), "nope")
			if !errors.Is(err, tt.sentinel) {
				t.Fatalf("err = %v, want errors.Is %v", err, tt.sentinel)
			}
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Message != tt.message {
				t.Fatalf("err = %#v, want message %q", err, tt.message)
			}
		})
	}
}

func TestRequests(t *testing.T) {
	ctx := context.Background()
	sb := `{"id":"sb-1","name":"scratch","state":"running","resources":{},"env":{},"labels":{},"url":"","created_at":"2026-10-12T09:17:36Z"}`
	cp := `{"id":"v1","sandbox":"sb-1","comment":"c","memory":true,"auto":false,"created_at":"2026-10-12T09:17:36Z"}`
	yes := true
	tests := []struct {
		name     string
		status   int
		body     string
		call     func(c *Client) error
		method   string
		uri      string
		wantBody string
	}{
		{"create", 201, sb, func(c *Client) error {
			_, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "scratch", Labels: map[string]string{"a": "b"}})
			return err
		}, "POST", "/v1/sandboxes", `{"name":"scratch","labels":{"a":"b"}}`},
		{"list with labels", 200, `{"sandboxes":[` + sb + `]}`, func(c *Client) error {
			_, err := c.ListSandboxes(ctx, ListOptions{Labels: map[string]string{"team": "docs", "env": "a=b"}})
			return err
		}, "GET", "/v1/sandboxes?label=env%3Da%3Db&label=team%3Ddocs", ""},
		{"list", 200, `{"sandboxes":[]}`, func(c *Client) error {
			_, err := c.ListSandboxes(ctx, ListOptions{})
			return err
		}, "GET", "/v1/sandboxes", ""},
		{"get escapes", 200, sb, func(c *Client) error {
			_, err := c.GetSandbox(ctx, "a/b c?")
			return err
		}, "GET", "/v1/sandboxes/a%2Fb%20c%3F", ""},
		{"delete", 204, "", func(c *Client) error {
			return c.DeleteSandbox(ctx, "scratch")
		}, "DELETE", "/v1/sandboxes/scratch", ""},
		{"templates", 200, `{"templates":[{"name":"base","description":"d","default":true,"ready":true}]}`, func(c *Client) error {
			_, err := c.Templates(ctx)
			return err
		}, "GET", "/v1/templates", ""},
		{"create checkpoint", 201, cp, func(c *Client) error {
			_, err := c.CreateCheckpoint(ctx, "scratch", api.CreateCheckpoint{Comment: "c", Memory: &yes})
			return err
		}, "POST", "/v1/sandboxes/scratch/checkpoints", `{"comment":"c","memory":true}`},
		{"list checkpoints", 200, `{"checkpoints":[` + cp + `]}`, func(c *Client) error {
			_, err := c.ListCheckpoints(ctx, "scratch")
			return err
		}, "GET", "/v1/sandboxes/scratch/checkpoints", ""},
		{"get checkpoint escapes", 200, cp, func(c *Client) error {
			_, err := c.GetCheckpoint(ctx, "my box", "v/1")
			return err
		}, "GET", "/v1/sandboxes/my%20box/checkpoints/v%2F1", ""},
		{"delete checkpoint", 204, "", func(c *Client) error {
			return c.DeleteCheckpoint(ctx, "scratch", "auto-1")
		}, "DELETE", "/v1/sandboxes/scratch/checkpoints/auto-1", ""},
		{"restore", 200, sb, func(c *Client) error {
			_, err := c.RestoreCheckpoint(ctx, "scratch", "v1")
			return err
		}, "POST", "/v1/sandboxes/scratch/checkpoints/v1/restore", ""},
		{"fork", 201, sb, func(c *Client) error {
			_, err := c.Fork(ctx, "scratch", "v1", "scratch-2")
			return err
		}, "POST", "/v1/sandboxes", `{"name":"scratch-2","from":{"sandbox":"scratch","checkpoint":"v1"}}`},
		{"fork with", 201, sb, func(c *Client) error {
			_, err := c.ForkWith(ctx, "scratch", "v2", api.CreateSandbox{
				Name:   "scratch-disk",
				Labels: map[string]string{"owner": "docs"},
				From:   &api.ForkSource{Sandbox: "ignored", Checkpoint: "ignored"},
			})
			return err
		}, "POST", "/v1/sandboxes", `{"name":"scratch-disk","labels":{"owner":"docs"},"from":{"sandbox":"scratch","checkpoint":"v2"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, rec := fakeAPI(t, tt.status, tt.body)
			if err := tt.call(c); err != nil {
				t.Fatal(err)
			}
			if rec.method != tt.method || rec.uri != tt.uri {
				t.Errorf("request = %s %s, want %s %s", rec.method, rec.uri, tt.method, tt.uri)
			}
			if rec.auth != "Bearer tok" {
				t.Errorf("Authorization = %q", rec.auth)
			}
			if string(rec.body) != tt.wantBody {
				t.Errorf("body = %s, want %s", rec.body, tt.wantBody)
			}
			if tt.wantBody != "" && rec.contentType != "application/json" {
				t.Errorf("Content-Type = %q", rec.contentType)
			}
		})
	}
}

func TestDecodesResponses(t *testing.T) {
	c, _ := fakeAPI(t, 200, `{"checkpoints":[
		{"id":"v1","sandbox":"sb-2kjiso7vff5b","comment":"site up, state v1","memory":true,"auto":false,"created_at":"2026-10-12T09:17:36.094927Z"},
		{"id":"auto-1","sandbox":"sb-2kjiso7vff5b","comment":"before restoring v1","memory":true,"auto":true,"created_at":"2026-10-12T09:17:38Z"}]}`)
	cps, err := c.ListCheckpoints(context.Background(), "scratch")
	if err != nil {
		t.Fatal(err)
	}
	want := []api.Checkpoint{
		{ID: "v1", Sandbox: "sb-2kjiso7vff5b", Comment: "site up, state v1", Memory: true,
			CreatedAt: time.Date(2026, 10, 12, 9, 17, 36, 94927000, time.UTC)},
		{ID: "auto-1", Sandbox: "sb-2kjiso7vff5b", Comment: "before restoring v1", Memory: true, Auto: true,
			CreatedAt: time.Date(2026, 10, 12, 9, 17, 38, 0, time.UTC)},
	}
	if !reflect.DeepEqual(cps, want) {
		t.Errorf("got %+v\nwant %+v", cps, want)
	}
}

// TestEmptyListsAreNotNil checks that every list call gives an empty list,
// which marshals as [], when the daemon's answer has none.
func TestEmptyListsAreNotNil(t *testing.T) {
	c, _ := fakeAPI(t, 200, `{}`)
	ctx := context.Background()
	lists := map[string]func() (any, error){
		"ListSandboxes":   func() (any, error) { return c.ListSandboxes(ctx, ListOptions{}) },
		"Templates":       func() (any, error) { return c.Templates(ctx) },
		"ListCheckpoints": func() (any, error) { return c.ListCheckpoints(ctx, "scratch") },
		"ListSessions":    func() (any, error) { return c.ListSessions(ctx, "scratch") },
		"ListServices":    func() (any, error) { return c.ListServices(ctx, "scratch") },
		"ListPorts":       func() (any, error) { return c.ListPorts(ctx, "scratch") },
		"ListSecrets":     func() (any, error) { return c.ListSecrets(ctx) },
		"ListImages":      func() (any, error) { return c.ListImages(ctx) },
		"ListRegistries":  func() (any, error) { return c.ListRegistries(ctx) },
	}
	for name, list := range lists {
		t.Run(name, func(t *testing.T) {
			got, err := list()
			if err != nil {
				t.Fatal(err)
			}
			if b, _ := json.Marshal(got); string(b) != "[]" {
				t.Errorf("%s = %s, want []", name, b)
			}
		})
	}
}

func TestEmptyRefIsRefused(t *testing.T) {
	c, rec := fakeAPI(t, 200, `{}`)
	ctx := context.Background()
	calls := map[string]func() error{
		"get sandbox":    func() error { _, err := c.GetSandbox(ctx, ""); return err },
		"delete sandbox": func() error { return c.DeleteSandbox(ctx, "") },
		"get checkpoint": func() error { _, err := c.GetCheckpoint(ctx, "scratch", ""); return err },
		"fork":           func() error { _, err := c.Fork(ctx, "scratch", "", "x"); return err },
		"exec":           func() error { _, err := c.Exec(ctx, "", ExecOptions{Cmd: []string{"true"}}); return err },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if err := call(); !errors.Is(err, api.ErrInvalid) {
				t.Errorf("err = %v, want invalid", err)
			}
		})
	}
	if rec.method != "" {
		t.Errorf("a request was sent: %s %s", rec.method, rec.uri)
	}
}

func TestTransportError(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c, _ := fakeAPI(t, 200, `{}`)
	_, err := c.Templates(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
}

func TestFromEnv(t *testing.T) {
	dir := t.TempDir()
	writeFile := func(name, s string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	empty := t.TempDir()
	tests := []struct {
		name               string
		env                map[string]string
		files              map[string]string
		wantURL, wantToken string
		wantErr            bool
	}{
		{"env wins", map[string]string{"LOAM_API_URL": "https://loam.example.com/", "LOAM_TOKEN": "t1", "LOAM_DATA_DIR": dir},
			map[string]string{"api_url": "http://10.0.0.1:1", "token": "file"}, "https://loam.example.com", "t1", false},
		{"files", map[string]string{"LOAM_DATA_DIR": dir},
			map[string]string{"api_url": "http://127.0.0.1:9999\n", "token": "secret\n"}, "http://127.0.0.1:9999", "secret", false},
		{"default url", map[string]string{"LOAM_DATA_DIR": empty, "LOAM_TOKEN": "t2"},
			nil, "http://127.0.0.1:7070", "t2", false},
		{"url from env, token from file", map[string]string{"LOAM_DATA_DIR": dir, "LOAM_API_URL": "http://h:1"},
			map[string]string{"token": "secret"}, "http://h:1", "secret", false},
		{"no token", map[string]string{"LOAM_DATA_DIR": empty}, nil, "", "", true},
		{"empty token file", map[string]string{"LOAM_DATA_DIR": dir}, map[string]string{"token": "\n"}, "", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []string{EnvAPIURL, EnvToken, EnvDataDir} {
				t.Setenv(k, tt.env[k])
			}
			os.Remove(filepath.Join(dir, "api_url"))
			os.Remove(filepath.Join(dir, "token"))
			for name, s := range tt.files {
				writeFile(name, s)
			}
			c, err := FromEnv()
			if tt.wantErr {
				if err == nil {
					t.Fatalf("FromEnv = %+v, want an error", c)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.URL() != tt.wantURL || c.token != tt.wantToken {
				t.Errorf("FromEnv = %q, %q; want %q, %q", c.URL(), c.token, tt.wantURL, tt.wantToken)
			}
		})
	}
}

func TestWithHTTPClient(t *testing.T) {
	hc := &http.Client{}
	if c := New("http://x", "t", WithHTTPClient(hc)); c.http != hc {
		t.Error("WithHTTPClient was not applied")
	}
}
