package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// Client is the daemon's side of one sandbox's agent. Its methods are safe
// for concurrent use as long as its fields are not changed meanwhile. Errors
// the agent answered with are *Error, never *api.Error: an agent runs inside
// a sandbox, and what it says must not pass for the API's own verdict.
type Client struct {
	// BaseURL is the agent's address, http://IP:7071. A fork or a restore
	// may move the sandbox to another IP: make a new Client then.
	BaseURL string
	// Token is the agent's bearer token.
	Token string
	// HTTP is the client requests go through; a shared default when nil.
	// It must not have a Timeout: exec sockets live long. Use ctx.
	HTTP *http.Client
	// Refresh, when set, returns the tokens the agent may hold now, most
	// likely first. A request or a socket the agent refuses for its token
	// is tried again with each that differs from Token: a memory
	// checkpoint may have moved the agent to a new token between the
	// caller reading Token and the request arriving. A refused request
	// did nothing, so sending it again is safe (a streamed body is sent
	// again only if none of it was read: see send).
	Refresh func(ctx context.Context) []string
}

// retryTokens are the tokens to try again with after err.
func (c *Client) retryTokens(ctx context.Context, err error) []string {
	if c.Refresh == nil || !IsUnauthorized(err) {
		return nil
	}
	var toks []string
	for _, tok := range c.Refresh(ctx) {
		if tok != "" && tok != c.Token {
			toks = append(toks, tok)
		}
	}
	return toks
}

// defaultHTTP reaches agents directly: no proxy from the environment (the
// daemon's HTTP_PROXY must not see sandbox traffic), short dial timeouts.
var defaultHTTP = &http.Client{
	Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
		// Uploads ask to continue (see send): their body goes only once
		// the agent took the token, so a refused one can go again.
		ExpectContinueTimeout: 2 * time.Second,
	},
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return defaultHTTP
}

func (c *Client) url(path string) string {
	return strings.TrimSuffix(c.BaseURL, "/") + path
}

func bearer(token string) http.Header {
	return http.Header{"Authorization": {"Bearer " + token}}
}

// Health asks the agent whether it is up.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	resp, err := c.do(ctx, http.MethodGet, "/healthz", nil)
	if err != nil {
		return h, fmt.Errorf("checking agent health at %s: %w", c.BaseURL, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return h, fmt.Errorf("reading agent health from %s: %w", c.BaseURL, err)
	}
	return h, nil
}

// Polling of WaitReady: tight, because the daemon measures time to ready;
// each attempt is cut short so that a SYN lost while the sandbox's network
// comes up costs one attempt, not a TCP retransmission timeout.
const (
	readyInterval = 5 * time.Millisecond
	readyAttempt  = 500 * time.Millisecond
)

// WaitReady polls Health until the agent answers, ctx is done, or the agent
// refuses the token (which waiting will not change). It returns the
// agent's health, its protocol version among it.
func (c *Client) WaitReady(ctx context.Context) (Health, error) {
	tick := time.NewTicker(readyInterval)
	defer tick.Stop()
	for {
		actx, cancel := context.WithTimeout(ctx, readyAttempt)
		h, err := c.Health(actx)
		cancel()
		if err == nil {
			if h.Version == 0 {
				h.Version = 1 // the first agent reported none
			}
			return h, nil
		}
		if IsUnauthorized(err) {
			return Health{}, fmt.Errorf("waiting for agent: %w", err)
		}
		select {
		case <-ctx.Done():
			return Health{}, fmt.Errorf("waiting for agent at %s: %w (last attempt: %w)", c.BaseURL, context.Cause(ctx), err)
		case <-tick.C:
		}
	}
}

// DialExec opens an exec socket. The caller writes the api.ExecRequest as
// the first (text) message and then speaks the protocol of api/exec.go.
// The socket accepts messages of up to 1 MiB; the agent sends at most 32 KiB.
func (c *Client) DialExec(ctx context.Context) (*websocket.Conn, error) {
	return c.dial(ctx, "/exec", "opening exec socket")
}

// RotateToken replaces the agent's token with newToken; from then on the
// agent refuses the old one. The caller sets c.Token (or makes a new Client)
// afterwards. Exec sockets already open are not affected.
func (c *Client) RotateToken(ctx context.Context, newToken string) error {
	body, err := json.Marshal(tokenRequest{Token: newToken})
	if err != nil {
		return fmt.Errorf("rotating agent token: %w", err)
	}
	resp, err := c.do(ctx, http.MethodPost, "/token", body)
	if err != nil {
		return fmt.Errorf("rotating agent token at %s: %w", c.BaseURL, err)
	}
	resp.Body.Close()
	return nil
}

// Sync has the sandbox write what its kernel caches of its files back to
// them (see serveSync). Agents before protocol version 5 answer not_found.
func (c *Client) Sync(ctx context.Context) error {
	resp, err := c.do(ctx, http.MethodPost, "/sync", nil)
	if err != nil {
		return fmt.Errorf("syncing the sandbox's files at %s: %w", c.BaseURL, err)
	}
	resp.Body.Close()
	return nil
}

// do sends a request and turns a response that is not 2xx into an error.
func (c *Client) do(ctx context.Context, method, path string, body []byte) (*http.Response, error) {
	resp, err := c.doAs(ctx, c.Token, method, path, body)
	for _, tok := range c.retryTokens(ctx, err) {
		if resp, err = c.doAs(ctx, tok, method, path, body); !IsUnauthorized(err) {
			break
		}
	}
	return resp, err
}

func (c *Client) doAs(ctx context.Context, token, method, path string, body []byte) (*http.Response, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.url(path), r)
	if err != nil {
		return nil, err
	}
	req.Header = bearer(token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, responseError(resp)
	}
	return resp, nil
}

// Error is an error answer of an agent. It comes from inside a sandbox, so
// it is hostile input: its code and message are data to quote, and it never
// unwraps to an *api.Error, which the daemon's API would send on as its own.
type Error struct {
	// Status is the HTTP status of the answer.
	Status int
	// Code and Message are what the agent's error body said, if anything,
	// cut to maxErrorText bytes.
	Code, Message string
}

// maxErrorText bounds how much of an agent's error text is kept.
const maxErrorText = 256

func (e *Error) Error() string {
	if e.Code == "" && e.Message == "" {
		return fmt.Sprintf("the agent answered %d", e.Status)
	}
	return fmt.Sprintf("the agent answered %d: %q %q", e.Status, e.Code, e.Message)
}

// IsNoSpace reports whether err is an agent's answer that the sandbox's
// disk is full (insufficient_storage). It is the sandbox's word: use it
// only to decide what the sandbox loses by it, never to send on as loam's.
func IsNoSpace(err error) bool {
	var ae *Error
	return errors.As(err, &ae) && ae.Status == http.StatusInsufficientStorage
}

// IsUnauthorized reports whether err is an agent's refusal of the token.
func IsUnauthorized(err error) bool {
	var ae *Error
	return errors.As(err, &ae) && ae.Status == http.StatusUnauthorized
}

// responseError is the *Error of an error response.
func responseError(resp *http.Response) error {
	e := &Error{Status: resp.StatusCode}
	var body api.ErrorBody
	if json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&body) == nil && body.Error != nil {
		e.Code, e.Message = clip(string(body.Error.Code)), clip(body.Error.Message)
	}
	return e
}

// clip cuts s to maxErrorText bytes, on a rune boundary.
func clip(s string) string {
	if len(s) <= maxErrorText {
		return s
	}
	s = s[:maxErrorText]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// Ports lists the sandbox's listening TCP ports as the agent reports them:
// hostile input, for the caller to check.
func (c *Client) Ports(ctx context.Context) (api.PortList, error) {
	var pl api.PortList
	resp, err := c.do(ctx, http.MethodGet, "/ports", nil)
	if err != nil {
		return pl, fmt.Errorf("listing ports at %s: %w", c.BaseURL, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxPortList)).Decode(&pl); err != nil {
		return pl, fmt.Errorf("reading the ports listed at %s: %w", c.BaseURL, err)
	}
	return pl, nil
}

// maxPortList bounds the agent's answer to GET /ports: every port of a
// sandbox, each on a few addresses, fits it many times over.
const maxPortList = 4 << 20

// DialPortWatch opens a port watch: a socket of api.PortEvent text messages.
func (c *Client) DialPortWatch(ctx context.Context) (*websocket.Conn, error) {
	return c.dial(ctx, "/ports/watch", "opening a port watch")
}

// DialPort opens a port stream to TCP port port inside the sandbox. The
// agent refuses before the upgrade, with an *Error: 404 when nothing
// listens on the port, 503 when it does not accept, 403 for its own port.
func (c *Client) DialPort(ctx context.Context, port int) (*websocket.Conn, error) {
	return c.dial(ctx, "/ports/"+strconv.Itoa(port)+"/stream", "opening a stream to port "+strconv.Itoa(port))
}

// withQuery is path with q as its query, if q has any.
func withQuery(path string, q url.Values) string {
	if len(q) == 0 {
		return path
	}
	return path + "?" + q.Encode()
}

// dial opens a WebSocket at path (its query included); what says what for
// the error. An agent's refusal comes back as its *Error. The socket takes
// messages of up to 1 MiB.
func (c *Client) dial(ctx context.Context, path, what string) (*websocket.Conn, error) {
	conn, err := c.dialAs(ctx, c.Token, path)
	for _, tok := range c.retryTokens(ctx, err) {
		if conn, err = c.dialAs(ctx, tok, path); !IsUnauthorized(err) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%s at %s: %w", what, c.BaseURL, err)
	}
	conn.SetReadLimit(maxClientMessage)
	return conn, nil
}

func (c *Client) dialAs(ctx context.Context, token, path string) (*websocket.Conn, error) {
	conn, resp, err := websocket.Dial(ctx, c.url(path), &websocket.DialOptions{
		HTTPClient: c.httpClient(),
		HTTPHeader: bearer(token),
	})
	if err != nil && resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
		err = responseError(resp)
	}
	return conn, err
}
