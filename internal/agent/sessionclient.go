package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// Bounds on what the daemon reads of an agent's session answers: an agent
// is inside a sandbox, and its answers are hostile input.
const (
	maxSessionAnswer     = 1 << 20
	maxSessionListAnswer = 16 << 20
)

// CreateSession starts a detachable session (protocol 3).
func (c *Client) CreateSession(ctx context.Context, req api.ExecRequest) (*api.Session, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encoding the session request: %w", err)
	}
	var s api.Session
	if err := c.call(ctx, http.MethodPost, "/sessions", body, maxSessionAnswer, &s); err != nil {
		return nil, fmt.Errorf("starting a session at %s: %w", c.BaseURL, err)
	}
	return &s, nil
}

// ListSessions lists the agent's sessions.
func (c *Client) ListSessions(ctx context.Context) ([]api.Session, error) {
	var l api.SessionList
	if err := c.call(ctx, http.MethodGet, "/sessions", nil, maxSessionListAnswer, &l); err != nil {
		return nil, fmt.Errorf("listing sessions at %s: %w", c.BaseURL, err)
	}
	return l.Sessions, nil
}

// GetSession returns one session.
func (c *Client) GetSession(ctx context.Context, id string) (*api.Session, error) {
	var s api.Session
	if err := c.call(ctx, http.MethodGet, "/sessions/"+url.PathEscape(id), nil, maxSessionAnswer, &s); err != nil {
		return nil, fmt.Errorf("getting session %s at %s: %w", id, c.BaseURL, err)
	}
	return &s, nil
}

// WaitSession waits until a session has exited, or ctx is done.
func (c *Client) WaitSession(ctx context.Context, id string) (*api.Session, error) {
	var s api.Session
	if err := c.call(ctx, http.MethodPost, "/sessions/"+url.PathEscape(id)+"/wait", nil, maxSessionAnswer, &s); err != nil {
		return nil, fmt.Errorf("waiting for session %s at %s: %w", id, c.BaseURL, err)
	}
	return &s, nil
}

// SignalSession sends a signal to a session's process group.
func (c *Client) SignalSession(ctx context.Context, id, signal string) error {
	body, err := json.Marshal(api.SignalSession{Signal: signal})
	if err != nil {
		return err
	}
	if err := c.call(ctx, http.MethodPost, "/sessions/"+url.PathEscape(id)+"/signal", body, 0, nil); err != nil {
		return fmt.Errorf("signalling session %s at %s: %w", id, c.BaseURL, err)
	}
	return nil
}

// DeleteSession kills a session's whole process tree and forgets it.
func (c *Client) DeleteSession(ctx context.Context, id string) error {
	if err := c.call(ctx, http.MethodDelete, "/sessions/"+url.PathEscape(id), nil, 0, nil); err != nil {
		return fmt.Errorf("deleting session %s at %s: %w", id, c.BaseURL, err)
	}
	return nil
}

// DialAttach opens an attach socket to a detachable session (see
// api/session.go).
func (c *Client) DialAttach(ctx context.Context, id string, p api.AttachParams) (*websocket.Conn, error) {
	return c.dial(ctx, withQuery("/sessions/"+url.PathEscape(id)+"/attach", p.Query()), "attaching to session "+id)
}

// call sends a request and decodes at most limit bytes of its answer into
// out, when out is not nil.
func (c *Client) call(ctx context.Context, method, path string, body []byte, limit int64, out any) error {
	resp, err := c.do(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, limit)).Decode(out); err != nil {
		return fmt.Errorf("reading the agent's answer: %w", err)
	}
	return nil
}
