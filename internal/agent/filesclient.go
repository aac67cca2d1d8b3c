package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// maxFileAnswer bounds a JSON answer of the files protocol: a listing of
// api.MaxFileEntries entries fits well within it.
const maxFileAnswer = 16 << 20

// FileQuery names the file a files call is about and who makes it.
type FileQuery struct {
	Path string
	// User is the sandbox user the agent acts as; its default when empty.
	User string
	// Range is the part of the file ReadFile reads; the whole file when
	// nil.
	Range *api.ReadRange
}

func (q FileQuery) values() url.Values {
	v := url.Values{"path": {q.Path}}
	if q.User != "" {
		v.Set("user", q.User)
	}
	if q.Range != nil {
		q.Range.Values(v)
	}
	return v
}

// Stat describes a file and, for a directory, its entries depth levels deep.
func (c *Client) Stat(ctx context.Context, q FileQuery, depth int) (api.FileInfo, error) {
	v := q.values()
	v.Set("depth", strconv.Itoa(depth))
	var info api.FileInfo
	err := c.fileCall(ctx, http.MethodGet, "/files", v, nil, -1, &info)
	return info, err
}

// ReadFile opens a file's content for reading; the caller closes it. size
// is its length, which the body has unless the transfer is cut.
func (c *Client) ReadFile(ctx context.Context, q FileQuery) (body io.ReadCloser, size int64, err error) {
	resp, err := c.send(ctx, http.MethodGet, "/files/content", q.values(), nil, -1)
	if err != nil {
		return nil, 0, fmt.Errorf("reading %s from the agent at %s: %w", q.Path, c.BaseURL, err)
	}
	return resp.Body, resp.ContentLength, nil
}

// WriteFile writes body (size bytes, or -1 when unknown) to a file
// atomically; mode is octal ("0644"), or empty to keep the file's.
func (c *Client) WriteFile(ctx context.Context, q FileQuery, mode string, body io.Reader, size int64) (api.FileInfo, error) {
	v := q.values()
	if mode != "" {
		v.Set("mode", mode)
	}
	var info api.FileInfo
	err := c.fileCall(ctx, http.MethodPut, "/files/content", v, body, size, &info)
	return info, err
}

// Mkdir makes a directory and its parents.
func (c *Client) Mkdir(ctx context.Context, req api.MkdirRequest) (api.FileInfo, error) {
	var info api.FileInfo
	err := c.jsonCall(ctx, "/files/mkdir", req, &info)
	return info, err
}

// Move renames a file within the sandbox.
func (c *Client) Move(ctx context.Context, req api.MoveRequest) (api.FileInfo, error) {
	var info api.FileInfo
	err := c.jsonCall(ctx, "/files/move", req, &info)
	return info, err
}

// Remove removes a file, or a directory with all it holds when recursive.
func (c *Client) Remove(ctx context.Context, q FileQuery, recursive bool) error {
	v := q.values()
	if recursive {
		v.Set("recursive", "true")
	}
	return c.fileCall(ctx, http.MethodDelete, "/files", v, nil, -1, nil)
}

// ReadArchive opens a tar of a directory for reading; the caller closes it.
// A body that ends in an error is a transfer the agent cut short.
func (c *Client) ReadArchive(ctx context.Context, q FileQuery) (io.ReadCloser, error) {
	resp, err := c.send(ctx, http.MethodGet, "/files/archive", q.values(), nil, -1)
	if err != nil {
		return nil, fmt.Errorf("reading an archive of %s from the agent at %s: %w", q.Path, c.BaseURL, err)
	}
	return resp.Body, nil
}

// WriteArchive extracts a tar into a directory.
func (c *Client) WriteArchive(ctx context.Context, q FileQuery, tar io.Reader) error {
	return c.fileCall(ctx, http.MethodPut, "/files/archive", q.values(), tar, -1, nil)
}

// DialWatch opens a watch socket: api.WatchEvent text messages until the
// watched path goes (a normal close) or the socket is closed.
func (c *Client) DialWatch(ctx context.Context, q FileQuery, recursive bool) (*websocket.Conn, error) {
	v := q.values()
	if recursive {
		v.Set("recursive", "true")
	}
	conn, err := c.dial(ctx, withQuery("/files/watch", v), "opening a watch of "+q.Path)
	if err != nil {
		return nil, err
	}
	conn.SetReadLimit(64 << 10) // events are small
	return conn, nil
}

func (c *Client) jsonCall(ctx context.Context, path string, in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return c.fileCall(ctx, http.MethodPost, path, nil, bytes.NewReader(b), int64(len(b)), out)
}

// fileCall sends a files request and decodes its JSON answer into out
// (when not nil).
func (c *Client) fileCall(ctx context.Context, method, path string, q url.Values, body io.Reader, size int64, out any) error {
	resp, err := c.send(ctx, method, path, q, body, size)
	if err != nil {
		return fmt.Errorf("%s %s at the agent at %s: %w", method, path, c.BaseURL, err)
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxFileAnswer))
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxFileAnswer)).Decode(out); err != nil {
		return fmt.Errorf("reading the answer to %s %s from the agent at %s: %w", method, path, c.BaseURL, err)
	}
	return nil
}

// send sends a request whose body (nil for none) streams from body, of
// size bytes or -1 when unknown, and turns an answer that is not 2xx into
// an *Error.
func (c *Client) send(ctx context.Context, method, path string, q url.Values, body io.Reader, size int64) (*http.Response, error) {
	var counted *countingReader
	if body != nil && size != 0 {
		counted = &countingReader{r: body}
	}
	resp, err := c.sendAs(ctx, c.Token, method, path, q, counted, size)
	for _, tok := range c.retryTokens(ctx, err) {
		if counted != nil && counted.n > 0 {
			break // part of the body is gone: it cannot go again
		}
		if resp, err = c.sendAs(ctx, tok, method, path, q, counted, size); !IsUnauthorized(err) {
			break
		}
	}
	return resp, err
}

// countingReader counts what was read of a request's body.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *Client) sendAs(ctx context.Context, token, method, path string, q url.Values, body *countingReader, size int64) (*http.Response, error) {
	u := c.url(path)
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var r io.Reader = http.NoBody
	if body != nil {
		// Not the *countingReader itself in an io.Reader, so that the
		// request sees no body when there is none.
		r = io.NopCloser(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, r)
	if err != nil {
		return nil, err
	}
	req.Header = bearer(token)
	if body != nil {
		req.ContentLength = size
		// The body waits for the agent's 100 Continue, which it sends
		// once it took the token: a refusal leaves the body unread.
		req.Header.Set("Expect", "100-continue")
	} else if method != http.MethodGet && method != http.MethodHead {
		req.ContentLength = 0
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
