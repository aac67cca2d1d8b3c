// Package client is the Go SDK for loam's REST API.
//
// A Client talks to one loam daemon. Every method takes a context first and
// returns API errors as *api.Error (wrapped with what the call was doing), so
// callers can write errors.Is(err, api.ErrNotFound) whatever the message:
//
//	c, err := client.FromEnv()
//	cp, err := c.CreateCheckpoint(ctx, "scratch", api.CreateCheckpoint{Comment: "before upgrade"})
//	_, err = c.RestoreCheckpoint(ctx, "scratch", cp.ID)
//	fork, err := c.Fork(ctx, "scratch", cp.ID, "scratch-2")
//
// The package imports only api/, the standard library and a WebSocket library,
// so programs outside loam's module can use it.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"loam.dev/loam/api"
)

// Environment variables and files FromEnv reads.
const (
	// EnvAPIURL is the base URL of the API, such as https://loam.example.com.
	EnvAPIURL = "LOAM_API_URL"
	// EnvToken is the API token sent as "Authorization: Bearer TOKEN".
	EnvToken = "LOAM_TOKEN"
	// EnvDataDir is the local daemon's data directory, where it writes the
	// api_url and token files.
	EnvDataDir = "LOAM_DATA_DIR"

	// DefaultDataDir is the local daemon's data directory when EnvDataDir is unset.
	DefaultDataDir = "/var/lib/loam"
	// DefaultURL is the local daemon's address when neither EnvAPIURL nor
	// the api_url file says otherwise.
	DefaultURL = "http://127.0.0.1:7070"
)

// maxErrorBody bounds how much of an error response is read: error bodies are
// small, and a misbehaving proxy should not make the client buffer a page.
const maxErrorBody = 1 << 20

// Client is a connection to one loam daemon. It is safe for concurrent use.
type Client struct {
	base  string // without a trailing slash
	token string
	http  *http.Client
}

// Option configures a Client made by New or FromEnv.
type Option func(*Client)

// WithHTTPClient makes the Client send its requests, exec WebSockets
// included, through hc. Leave hc's Timeout at zero if you exec or take
// checkpoints: those calls can last long; bound them with a context instead.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.http = hc }
}

// New returns a Client for the API at baseURL (such as
// "http://127.0.0.1:7070"; a path prefix is kept) that authenticates with token.
func New(baseURL, token string, opts ...Option) *Client {
	c := &Client{
		base:  strings.TrimRight(baseURL, "/"),
		token: token,
		// No Timeout: exec sessions, image pulls and checkpoints outlast any
		// fixed timeout; callers bound calls with their context.
		http: &http.Client{},
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// FromEnv returns a Client configured from the environment: the URL from
// LOAM_API_URL and the token from LOAM_TOKEN. When they are unset it falls
// back to the local daemon, which writes its address to
// $LOAM_DATA_DIR/api_url and its token to $LOAM_DATA_DIR/token
// (LOAM_DATA_DIR defaults to /var/lib/loam); without an api_url file the URL
// is http://127.0.0.1:7070. It fails when no token can be found.
func FromEnv(opts ...Option) (*Client, error) {
	dataDir := os.Getenv(EnvDataDir)
	if dataDir == "" {
		dataDir = DefaultDataDir
	}

	baseURL := os.Getenv(EnvAPIURL)
	if baseURL == "" {
		b, err := os.ReadFile(filepath.Join(dataDir, "api_url"))
		switch {
		case err == nil && strings.TrimSpace(string(b)) != "":
			baseURL = strings.TrimSpace(string(b))
		case err == nil || errors.Is(err, os.ErrNotExist):
			baseURL = DefaultURL
		default:
			return nil, fmt.Errorf("finding the loam API (set %s): %w", EnvAPIURL, err)
		}
	}

	token := os.Getenv(EnvToken)
	if token == "" {
		path := filepath.Join(dataDir, "token")
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrPermission) {
			// Inside a sandbox the token is root's; the agent lends the
			// API to the sandbox's user on a socket beside it.
			sock := filepath.Join(dataDir, APISocketName)
			if st, serr := os.Stat(sock); serr == nil && st.Mode()&fs.ModeSocket != 0 {
				return New("http://loam", "", append([]Option{WithHTTPClient(unixHTTP(sock))}, opts...)...), nil
			}
		}
		if err != nil {
			return nil, fmt.Errorf("reading the loam token (set %s, or make %s readable): %w", EnvToken, path, err)
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return nil, fmt.Errorf("reading the loam token: %s is empty (set %s)", path, EnvToken)
		}
	}
	return New(baseURL, token, opts...), nil
}

// URL is the base URL the Client sends its requests to.
func (c *Client) URL() string { return c.base }

// Token is the API token the Client sends; empty for a Client that reaches
// the API through a sandbox's API socket, which needs none. A program that
// serves on the daemon's behalf (loam mcp --listen) checks its own callers
// against it.
func (c *Client) Token() string { return c.token }

// Health checks that the daemon answers: nil when it does. It needs no
// token, so it tells a daemon that is down from a token that is wrong.
func (c *Client) Health(ctx context.Context) error {
	if err := c.do(ctx, http.MethodGet, "/healthz", nil, nil, nil); err != nil {
		return fmt.Errorf("checking the health of loam at %s: %w", c.base, err)
	}
	return nil
}

// OpenAPI returns the daemon's API document (api/openapi.yaml, OpenAPI
// 3.1, YAML), as the daemon serves it at GET /v1/openapi.yaml.
func (c *Client) OpenAPI(ctx context.Context) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/openapi.yaml", nil)
	if err != nil {
		return nil, fmt.Errorf("getting the API document: %w", err)
	}
	c.authorize(req.Header)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, c.transportError(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("getting the API document: %w", decodeError(resp))
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("getting the API document: %w", err)
	}
	return b, nil
}

// do sends one request and decodes a 2xx JSON response into out (when out
// is not nil). A non-2xx response becomes an *api.Error.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, in, out any) error {
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encoding the request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return fmt.Errorf("making the request: %w", err)
	}
	c.authorize(req.Header)
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}

	resp, err := c.http.Do(req)
	if err != nil {
		return c.transportError(err)
	}
	defer resp.Body.Close()

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return decodeError(resp)
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		// Drain so the connection can be reused.
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decoding the response to %s %s: %w", method, path, err)
	}
	return nil
}

func (c *Client) authorize(h http.Header) {
	h.Set("Authorization", "Bearer "+c.token)
	h.Set("User-Agent", "loam-go")
}

// transportError says which daemon could not be reached. It drops the
// *url.Error layer, whose text repeats the whole URL, but keeps its cause so
// context errors and net errors still match errors.Is and errors.As.
func (c *Client) transportError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		// Nothing listens there: say so in the words of the fix.
		return fmt.Errorf("reaching loam at %s: no loam serve is running at that address (%w); start it, or set %s to where it runs", c.base, err, EnvAPIURL)
	}
	return fmt.Errorf("reaching loam at %s: %w", c.base, err)
}

// decodeError turns a non-2xx response into an *api.Error: the body's own
// error when it is one, else an error of the class the status implies.
func decodeError(resp *http.Response) *api.Error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var eb api.ErrorBody
	if json.Unmarshal(b, &eb) == nil && eb.Error != nil && eb.Error.Code != "" {
		return eb.Error
	}
	msg := http.StatusText(resp.StatusCode)
	if msg == "" {
		msg = fmt.Sprintf("HTTP status %d", resp.StatusCode)
	}
	return &api.Error{Code: api.CodeForStatus(resp.StatusCode), Message: msg}
}

// segment escapes one path segment, refusing an empty one: an empty name
// would silently address the collection instead of a member.
func segment(what, ref string) (string, error) {
	if ref == "" {
		return "", api.Errorf(api.CodeInvalid, "no %s given", what)
	}
	return url.PathEscape(ref), nil
}

// APISocketName is the name, in a sandbox's data dir (/var/lib/loam), of
// the socket on which the sandbox's agent serves the sandbox's own API to
// root and the sandbox's user, who cannot read its token.
const APISocketName = api.InsideSocketName

// unixHTTP is an HTTP client whose every connection goes to the unix
// socket at path.
func unixHTTP(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}
}
