package agent

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/coder/websocket"
)

// TestClientRefreshesToken: a request or a socket the agent refuses for
// its token goes once more with the token Refresh gives (a checkpoint
// moved the agent on), and only when that token differs.
func TestClientRefreshesToken(t *testing.T) {
	var seen atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		if r.Header.Get("Authorization") != "Bearer new" {
			http.Error(w, `{"error":{"code":"unauthorized","message":"missing or wrong agent token"}}`, http.StatusUnauthorized)
			return
		}
		if r.URL.Path == "/upload" {
			b, _ := io.ReadAll(r.Body)
			if string(b) != "hello" {
				http.Error(w, "body "+string(b), http.StatusBadRequest)
				return
			}
		}
		if r.URL.Path == "/exec" {
			c, err := websocket.Accept(w, r, nil)
			if err == nil {
				c.Close(websocket.StatusNormalClosure, "")
			}
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	ctx := context.Background()

	c := &Client{BaseURL: srv.URL, Token: "old"}
	if err := c.Sync(ctx); !IsUnauthorized(err) {
		t.Fatalf("without Refresh: %v, want the agent's refusal", err)
	}

	refreshed := 0
	c.Refresh = func(context.Context) []string { refreshed++; return []string{"new"} }
	seen.Store(0)
	if err := c.Sync(ctx); err != nil {
		t.Fatalf("with Refresh: %v", err)
	}
	if refreshed != 1 || seen.Load() != 2 {
		t.Errorf("refreshed %d times, %d requests; want 1 and 2", refreshed, seen.Load())
	}
	conn, err := c.DialExec(ctx)
	if err != nil {
		t.Fatalf("exec socket with Refresh: %v", err)
	}
	conn.CloseNow()

	// An upload: its body waits for the agent to take the token, so the
	// refused one goes again whole.
	seen.Store(0)
	resp, err := c.send(ctx, http.MethodPut, "/upload", nil, strings.NewReader("hello"), 5)
	if err != nil {
		t.Fatalf("upload with Refresh: %v", err)
	}
	resp.Body.Close()
	if seen.Load() != 2 {
		t.Errorf("upload: %d requests, want 2", seen.Load())
	}
	// Of unknown size (chunked) too.
	resp, err = c.send(ctx, http.MethodPut, "/upload", nil, io.MultiReader(strings.NewReader("hel"), strings.NewReader("lo")), -1)
	if err != nil {
		t.Fatalf("upload of unknown size with Refresh: %v", err)
	}
	resp.Body.Close()

	// The same token again: no second try.
	c.Refresh = func(context.Context) []string { return []string{"old"} }
	seen.Store(0)
	if err := c.Sync(ctx); !IsUnauthorized(err) || seen.Load() != 1 {
		t.Errorf("Refresh with the same token: %v after %d requests, want the refusal after 1", err, seen.Load())
	}
}
