package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
)

func TestAuth(t *testing.T) {
	c := newTestAgent(t)
	tests := []struct {
		name, method, path, auth string
		status                   int
	}{
		{"health without token", "GET", "/healthz", "", 401},
		{"health with a wrong token", "GET", "/healthz", "Bearer wrong", 401},
		{"health with a token that is a prefix", "GET", "/healthz", "Bearer test", 401},
		{"health with the token as basic", "GET", "/healthz", "Basic " + testToken, 401},
		{"health with an empty bearer", "GET", "/healthz", "Bearer ", 401},
		{"exec without token", "GET", "/exec", "", 401},
		{"token rotation without token", "POST", "/token", "", 401},
		{"sync without token", "POST", "/sync", "", 401},
		{"sync with the token", "POST", "/sync", "Bearer " + testToken, 204},
		{"unknown path without token", "GET", "/nope", "", 401},
		{"health with the token", "GET", "/healthz", "Bearer " + testToken, 200},
		{"health with the token, scheme in lower case", "GET", "/healthz", "bearer " + testToken, 200},
		{"health with the token, scheme in upper case", "GET", "/healthz", "BEARER " + testToken, 200},
		{"unknown path with the token", "GET", "/nope", "Bearer " + testToken, 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := strings.NewReader(`{"token":"stolen"}`)
			req, err := http.NewRequest(tt.method, c.BaseURL+tt.path, body)
			if err != nil {
				t.Fatal(err)
			}
			if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.status)
			}
			if tt.status == 401 {
				var e api.ErrorBody
				if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.Error == nil || e.Error.Code != api.CodeUnauthorized {
					t.Errorf("body %+v, %v: want an unauthorized error", e, err)
				}
			}
		})
	}
	// No unauthorized request changed the token.
	if _, err := c.Health(context.Background()); err != nil {
		t.Errorf("the token changed: %v", err)
	}
}

func TestAuthWithoutToken(t *testing.T) {
	srv := httptest.NewServer(NewHandler(Config{Logger: testLogger()}))
	t.Cleanup(srv.Close)
	for _, token := range []string{"", "x"} {
		c := &Client{BaseURL: srv.URL, Token: token}
		if _, err := c.Health(context.Background()); !IsUnauthorized(err) {
			t.Errorf("an agent without a token answered token %q with %v, want unauthorized", token, err)
		}
	}
}

func TestHealth(t *testing.T) {
	c := newTestAgent(t)
	h, err := c.Health(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !h.OK || h.PID != os.Getpid() || h.UptimeMS < 0 {
		t.Errorf("health %+v, want ok with pid %d", h, os.Getpid())
	}
}

// TestSync: the agent answers a sync, and says it can (protocol 5).
func TestSync(t *testing.T) {
	ctx := context.Background()
	c := newTestAgent(t)
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	h, err := c.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h.Version < 5 {
		t.Errorf("protocol version %d, want 5 or newer (POST /sync)", h.Version)
	}
}

func TestRotateToken(t *testing.T) {
	ctx := context.Background()
	c := newTestAgent(t)

	// A socket opened before the rotation keeps working after it.
	before := startExec(t, c, api.ExecRequest{User: "root", Cmd: []string{"cat"}, Stdin: true})
	before.waitStarted()

	if err := c.RotateToken(ctx, "new-token"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Health(ctx); !IsUnauthorized(err) {
		t.Errorf("health with the old token: %v, want unauthorized", err)
	}
	if _, err := c.DialExec(ctx); !IsUnauthorized(err) {
		t.Errorf("exec with the old token: %v, want unauthorized", err)
	}
	if err := c.RotateToken(ctx, "mine"); !IsUnauthorized(err) {
		t.Errorf("rotating with the old token: %v, want unauthorized", err)
	}

	c2 := &Client{BaseURL: c.BaseURL, Token: "new-token"}
	if _, err := c2.Health(ctx); err != nil {
		t.Errorf("health with the new token: %v", err)
	}
	if s := execute(t, c2, api.ExecRequest{User: "root", Cmd: []string{"true"}}, ""); s.code() != 0 {
		t.Errorf("exec with the new token: exit code %d", s.code())
	}
	var refused *Error
	if err := c2.RotateToken(ctx, ""); !errors.As(err, &refused) || refused.Status != http.StatusBadRequest {
		t.Errorf("rotating to an empty token: %v, want invalid", err)
	}

	before.sendStdin("still here")
	before.sendControl(api.ExecControl{Type: api.ExecEOF})
	before.wait()
	if before.stdout.String() != "still here" {
		t.Errorf("socket opened before the rotation: stdout %q", before.stdout.String())
	}
}

func TestRun(t *testing.T) {
	// A free port: taken, then let go for Run.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := &Client{BaseURL: "http://" + addr, Token: testToken}

	// WaitReady starts before the agent, as the daemon's does.
	readyCtx, cancelReady := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancelReady()
	ready := make(chan error, 1)
	go func() {
		h, err := c.WaitReady(readyCtx)
		if err == nil && h.Version != ProtocolVersion {
			err = fmt.Errorf("the agent reports protocol %d, want %d", h.Version, ProtocolVersion)
		}
		ready <- err
	}()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, Config{Listen: addr, Token: testToken, Logger: testLogger()}) }()

	if err := <-ready; err != nil {
		t.Fatalf("WaitReady: %v", err)
	}
	if h, err := c.Health(ctx); err != nil || h.PID != os.Getpid() {
		t.Errorf("health %+v, %v", h, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run returned %v after ctx was done", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after ctx was done")
	}
	if _, err := c.Health(context.Background()); err == nil {
		t.Error("the agent still answers after Run returned")
	}
}

func TestRunRefusesNoToken(t *testing.T) {
	err := Run(context.Background(), Config{Listen: "127.0.0.1:0", Logger: testLogger()})
	if err == nil || !strings.Contains(err.Error(), "no token") {
		t.Errorf("Run without a token: %v", err)
	}
}

func TestWaitReady(t *testing.T) {
	t.Run("a wrong token ends the wait", func(t *testing.T) {
		c := newTestAgent(t)
		c.Token = "wrong"
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := c.WaitReady(ctx); !IsUnauthorized(err) {
			t.Errorf("WaitReady: %v, want unauthorized", err)
		}
	})
	t.Run("ctx ends the wait", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		c := &Client{BaseURL: "http://" + ln.Addr().String(), Token: testToken}
		ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if _, err := c.WaitReady(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("WaitReady: %v, want deadline exceeded", err)
		}
	})
}

func TestConfigFromEnv(t *testing.T) {
	t.Setenv(EnvToken, "secret")
	t.Setenv(EnvListen, "127.0.0.1:9999")
	t.Setenv("LOAM_AGENT_OTHER", "x")
	t.Setenv("SANDBOX_VAR", "1")
	cfg := ConfigFromEnv()
	if cfg.Token != "secret" || cfg.Listen != "127.0.0.1:9999" {
		t.Errorf("config %+v", cfg)
	}
	for _, k := range []string{EnvToken, EnvListen, "LOAM_AGENT_OTHER"} {
		if v, ok := os.LookupEnv(k); ok {
			t.Errorf("%s=%s is still in the agent's environment", k, v)
		}
	}
	if !slices.Contains(cfg.Env, "SANDBOX_VAR=1") {
		t.Errorf("Env lacks SANDBOX_VAR: %q", cfg.Env)
	}
	for _, kv := range cfg.Env {
		if strings.HasPrefix(kv, "LOAM_AGENT_") {
			t.Errorf("Env has %s", kv)
		}
	}

	t.Setenv(EnvListen, "")
	if cfg := ConfigFromEnv(); cfg.Listen != DefaultListen {
		t.Errorf("default listen %q, want %q", cfg.Listen, DefaultListen)
	}
}

// TestClientErrorsAreNotAPIErrors: whatever an agent answers, its error is
// the agent's, quoted, never an *api.Error the daemon's API would pass on as
// its own verdict (an agent that says 400 "invalid" must not make a restore
// a user's mistake).
func TestClientErrorsAreNotAPIErrors(t *testing.T) {
	long := strings.Repeat("x", 10000)
	for _, tt := range []struct {
		name   string
		status int
		body   string
		want   string
	}{
		{"api error body", 400, `{"error":{"code":"invalid","message":"agent says hi"}}`, `the agent answered 400: "invalid" "agent says hi"`},
		{"not found", 404, `{"error":{"code":"not_found","message":"sandbox \"x\" not found"}}`, `the agent answered 404: "not_found" "sandbox \"x\" not found"`},
		{"no body", 500, ``, `the agent answered 500`},
		{"garbage", 409, `<html>`, `the agent answered 409`},
		{"long", 400, `{"error":{"code":"invalid","message":"` + long + `"}}`, `the agent answered 400: "invalid" "` + long[:256] + `…"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			c := &Client{BaseURL: srv.URL, Token: "t"}
			err := c.RotateToken(t.Context(), "new")
			var ae *api.Error
			if errors.As(err, &ae) {
				t.Fatalf("RotateToken error %v unwraps to *api.Error %v", err, ae)
			}
			var agentErr *Error
			if !errors.As(err, &agentErr) || agentErr.Error() != tt.want {
				t.Errorf("RotateToken error = %v, want one ending in %s", err, tt.want)
			}
		})
	}
}
