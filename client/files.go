package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// FileOptions tunes a files call. Every path is a path of the sandbox,
// absolute, resolved inside it: no path or symlink reaches the host. A nil
// *FileOptions is the zero value.
type FileOptions struct {
	// User is the sandbox user the call acts as: "loam" when empty, or
	// "root", or another user of the image. Files are created as that user
	// and only what that user may touch is touched.
	User string
	// Depth is how many levels of a directory's entries ListFiles gives;
	// 1 when 0.
	Depth int
	// Recursive lets RemoveFile remove a directory with all it holds, and
	// makes Watch watch every directory below the path too.
	Recursive bool
	// Mode is the permission bits WriteFile gives the file (0 keeps the
	// mode of the file replaced, or 0644) and Mkdir the directories (0755
	// when 0).
	Mode fs.FileMode
	// Offset and Length make ReadFile read only part of the file: Length
	// bytes from byte Offset (to the end when Length is 0). A part past
	// the end of the file reads what there is of it, maybe nothing.
	Offset, Length int64
}

func (o *FileOptions) query(path string) url.Values {
	q := url.Values{"path": {path}}
	if o == nil {
		return q
	}
	if o.User != "" {
		q.Set("user", o.User)
	}
	if o.Recursive {
		q.Set("recursive", "true")
	}
	// The daemon checks them: a negative one gets its invalid error.
	if o.Offset != 0 {
		q.Set("offset", strconv.FormatInt(o.Offset, 10))
	}
	if o.Length != 0 {
		q.Set("length", strconv.FormatInt(o.Length, 10))
	}
	return q
}

func (o *FileOptions) user() string {
	if o == nil {
		return ""
	}
	return o.User
}

// octal is the permission bits of a mode as the API takes them; "" for 0.
func octal(m fs.FileMode) string {
	if m == 0 {
		return ""
	}
	p := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		p |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		p |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		p |= 0o1000
	}
	return fmt.Sprintf("%04o", p)
}

func filesPath(sandbox, rest string) (string, error) {
	seg, err := segment("sandbox", sandbox)
	if err != nil {
		return "", err
	}
	return "/v1/sandboxes/" + seg + "/files" + rest, nil
}

// StatFile describes one file of a sandbox as lstat does (a symlink is
// itself), without a directory's entries.
func (c *Client) StatFile(ctx context.Context, sandbox, path string, opts *FileOptions) (*api.FileInfo, error) {
	p, err := filesPath(sandbox, "")
	if err != nil {
		return nil, err
	}
	q := opts.query(path)
	q.Set("depth", "0")
	var info api.FileInfo
	if err := c.do(ctx, http.MethodGet, p, q, nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// ListFiles describes a file of a sandbox and, for a directory, its entries
// (opts.Depth levels deep, sorted by name).
func (c *Client) ListFiles(ctx context.Context, sandbox, path string, opts *FileOptions) (*api.FileInfo, error) {
	p, err := filesPath(sandbox, "")
	if err != nil {
		return nil, err
	}
	q := opts.query(path)
	if opts != nil && opts.Depth > 0 {
		q.Set("depth", strconv.Itoa(opts.Depth))
	}
	var info api.FileInfo
	if err := c.do(ctx, http.MethodGet, p, q, nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// ErrShortRead is wrapped by the error a file or archive read from
// ReadFile or ReadArchive ends with when the transfer was cut before its
// end: the sandbox was checkpointed or restored meanwhile, or the link
// broke. Read again.
var ErrShortRead = errors.New("the transfer ended early")

// ReadFile streams the content of a file of a sandbox; the caller closes
// it. A read that ends early ends with an error wrapping ErrShortRead,
// never with a plain EOF.
func (c *Client) ReadFile(ctx context.Context, sandbox, path string, opts *FileOptions) (io.ReadCloser, error) {
	resp, err := c.stream(ctx, http.MethodGet, sandbox, "/content", opts.query(path), nil, -1)
	if err != nil {
		return nil, err
	}
	return &download{body: resp.Body, left: resp.ContentLength, path: path}, nil
}

// download is a body that knows how long it must be.
type download struct {
	body io.ReadCloser
	left int64 // bytes still due; -1 when unknown
	path string
}

func (d *download) Read(p []byte) (int, error) {
	n, err := d.body.Read(p)
	if d.left >= 0 {
		d.left -= int64(n)
	}
	switch {
	case err == io.EOF && d.left > 0:
		err = fmt.Errorf("reading %s: %w (%d bytes missing)", d.path, ErrShortRead, d.left)
	case err != nil && err != io.EOF:
		err = fmt.Errorf("reading %s: %w: %w", d.path, ErrShortRead, err)
	}
	return n, err
}

func (d *download) Close() error { return d.body.Close() }

// WriteFile writes r's bytes to a file of a sandbox, streamed: the file is
// replaced atomically once all of them are written (a reader of the file
// sees the old content or the new, whole), and missing parent directories
// are made.
func (c *Client) WriteFile(ctx context.Context, sandbox, path string, r io.Reader, opts *FileOptions) (*api.FileInfo, error) {
	q := opts.query(path)
	if opts != nil && opts.Mode != 0 {
		q.Set("mode", octal(opts.Mode))
	}
	size := int64(-1)
	if st, ok := r.(interface{ Stat() (fs.FileInfo, error) }); ok {
		if fi, err := st.Stat(); err == nil && fi.Mode().IsRegular() {
			size = fi.Size()
		}
	}
	resp, err := c.stream(ctx, http.MethodPut, sandbox, "/content", q, r, size)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var info api.FileInfo
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		return nil, fmt.Errorf("decoding the answer to writing %s: %w", path, err)
	}
	return &info, nil
}

// Mkdir makes a directory of a sandbox and its missing parents; one that
// exists is no error.
func (c *Client) Mkdir(ctx context.Context, sandbox, path string, opts *FileOptions) (*api.FileInfo, error) {
	p, err := filesPath(sandbox, "/mkdir")
	if err != nil {
		return nil, err
	}
	req := api.MkdirRequest{Path: path, User: opts.user()}
	if opts != nil {
		req.Mode = octal(opts.Mode)
	}
	var info api.FileInfo
	if err := c.do(ctx, http.MethodPost, p, nil, req, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// MoveFile renames a file of a sandbox, replacing a file at to.
func (c *Client) MoveFile(ctx context.Context, sandbox, from, to string, opts *FileOptions) (*api.FileInfo, error) {
	p, err := filesPath(sandbox, "/move")
	if err != nil {
		return nil, err
	}
	var info api.FileInfo
	if err := c.do(ctx, http.MethodPost, p, nil, api.MoveRequest{From: from, To: to, User: opts.user()}, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// RemoveFile removes a file of a sandbox, or an empty directory, or with
// opts.Recursive a directory and all it holds.
func (c *Client) RemoveFile(ctx context.Context, sandbox, path string, opts *FileOptions) error {
	p, err := filesPath(sandbox, "")
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodDelete, p, opts.query(path), nil, nil)
}

// ReadArchive streams a tar of a directory of a sandbox (symlinks as
// symlinks); the caller closes it. A transfer cut short ends in an error.
func (c *Client) ReadArchive(ctx context.Context, sandbox, dir string, opts *FileOptions) (io.ReadCloser, error) {
	resp, err := c.stream(ctx, http.MethodGet, sandbox, "/archive", opts.query(dir), nil, -1)
	if err != nil {
		return nil, err
	}
	return &download{body: resp.Body, left: -1, path: dir}, nil
}

// WriteArchive extracts the tar read from r into a directory of a sandbox
// (made if missing). Entries that would land outside it, by their name or
// through a symlink, are refused.
func (c *Client) WriteArchive(ctx context.Context, sandbox, dir string, r io.Reader, opts *FileOptions) error {
	resp, err := c.stream(ctx, http.MethodPut, sandbox, "/archive", opts.query(dir), r, -1)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// stream sends a files request whose body, if any, streams from body (size
// bytes, or -1 when unknown), and returns a 2xx answer for the caller to
// read and close; any other becomes an *api.Error.
func (c *Client) stream(ctx context.Context, method, sandbox, rest string, q url.Values, body io.Reader, size int64) (*http.Response, error) {
	p, err := filesPath(sandbox, rest)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+p+"?"+q.Encode(), body)
	if err != nil {
		return nil, fmt.Errorf("making the request: %w", err)
	}
	if body != nil {
		if size >= 0 {
			req.ContentLength = size
		}
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	c.authorize(req.Header)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, c.transportError(err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// ErrWatchEnded is wrapped by the error Watcher.Next returns when the
// daemon ended the watch: with an *api.Error of code unavailable when the
// sandbox was checkpointed (memory) or restored, which needs a new watch.
var ErrWatchEnded = errors.New("watch ended")

// Watcher is a watch of a file or directory of a sandbox (see Watch).
type Watcher struct {
	conn *websocket.Conn
}

// Watch watches a file or directory of a sandbox, and with opts.Recursive
// every directory below it. Events come from the sandbox's kernel
// (inotify), in order, from Next.
func (c *Client) Watch(ctx context.Context, sandbox, path string, opts *FileOptions) (*Watcher, error) {
	p, err := filesPath(sandbox, "/watch")
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	c.authorize(h)
	conn, resp, err := websocket.Dial(ctx, wsURL(c.base)+p+"?"+opts.query(path).Encode(), &websocket.DialOptions{
		HTTPClient: c.http,
		HTTPHeader: h,
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols && resp.Body != nil {
			return nil, decodeError(resp)
		}
		return nil, c.transportError(err)
	}
	return &Watcher{conn: conn}, nil
}

// Next waits for the next event. It returns an error wrapping io.EOF when
// the watched path went away (the watch is over), and one wrapping
// ErrWatchEnded when the daemon ended the watch.
func (w *Watcher) Next(ctx context.Context) (api.WatchEvent, error) {
	var ev api.WatchEvent
	typ, b, err := w.conn.Read(ctx)
	if err != nil {
		var ce websocket.CloseError
		switch {
		case errors.As(err, &ce) && ce.Code == websocket.StatusNormalClosure:
			return ev, fmt.Errorf("watch over (%s): %w", ce.Reason, io.EOF)
		case errors.As(err, &ce) && ce.Code == websocket.StatusInternalError:
			msg := ce.Reason
			if msg == "" {
				msg = "the sandbox was checkpointed or restored"
			}
			return ev, fmt.Errorf("%w: %w", ErrWatchEnded, &api.Error{Code: api.CodeUnavailable, Message: msg})
		}
		return ev, fmt.Errorf("%w: %w", ErrWatchEnded, err)
	}
	if typ != websocket.MessageText || json.Unmarshal(b, &ev) != nil {
		return ev, fmt.Errorf("watch: the daemon sent %q, not an event", b)
	}
	return ev, nil
}

// Close ends the watch.
func (w *Watcher) Close() error {
	return w.conn.Close(websocket.StatusNormalClosure, "")
}
