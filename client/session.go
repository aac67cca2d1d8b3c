package client

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// Exec sessions (api/session.go): a detachable session runs on without a
// client, keeps its output in buffers, and can be attached to, waited for,
// signalled and killed. Exec starts a session too, detachable when
// ExecOptions.Detachable is set.

// CreateSession starts a detachable session in sandbox with no client
// attached. req is as for exec; Detachable is implied.
func (c *Client) CreateSession(ctx context.Context, sandbox string, req api.ExecRequest) (*api.Session, error) {
	var s api.Session
	if err := c.sandboxCall(ctx, http.MethodPost, sandbox, "/sessions", req, &s); err != nil {
		return nil, fmt.Errorf("starting a session in %s: %w", sandbox, err)
	}
	return &s, nil
}

// ListSessions lists sandbox's sessions: the running ones and the newest
// api.MaxExitedSessions exited ones, oldest first.
func (c *Client) ListSessions(ctx context.Context, sandbox string) ([]api.Session, error) {
	var l api.SessionList
	if err := c.sandboxCall(ctx, http.MethodGet, sandbox, "/sessions", nil, &l); err != nil {
		return nil, fmt.Errorf("listing sessions of %s: %w", sandbox, err)
	}
	if l.Sessions == nil {
		l.Sessions = []api.Session{}
	}
	return l.Sessions, nil
}

// GetSession returns session id of sandbox.
func (c *Client) GetSession(ctx context.Context, sandbox, id string) (*api.Session, error) {
	var s api.Session
	if err := c.sessionCall(ctx, http.MethodGet, sandbox, id, "", nil, &s); err != nil {
		return nil, fmt.Errorf("getting session %s of %s: %w", id, sandbox, err)
	}
	return &s, nil
}

// WaitSession waits until session id has exited and returns it, with its
// exit code; or until ctx ends. A memory checkpoint or a restore of the
// sandbox ends the wait with an *api.Error of code unavailable: wait again.
func (c *Client) WaitSession(ctx context.Context, sandbox, id string) (*api.Session, error) {
	var s api.Session
	if err := c.sessionCall(ctx, http.MethodPost, sandbox, id, "/wait", nil, &s); err != nil {
		return nil, fmt.Errorf("waiting for session %s of %s: %w", id, sandbox, err)
	}
	return &s, nil
}

// SignalSession sends signal ("TERM", "INT", "9", …) to the whole process
// group of session id.
func (c *Client) SignalSession(ctx context.Context, sandbox, id, signal string) error {
	if err := c.sessionCall(ctx, http.MethodPost, sandbox, id, "/signal", api.SignalSession{Signal: signal}, nil); err != nil {
		return fmt.Errorf("signalling session %s of %s: %w", id, sandbox, err)
	}
	return nil
}

// DeleteSession kills the whole process tree of session id, children
// included, and forgets the session.
func (c *Client) DeleteSession(ctx context.Context, sandbox, id string) error {
	if err := c.sessionCall(ctx, http.MethodDelete, sandbox, id, "", nil, nil); err != nil {
		return fmt.Errorf("deleting session %s of %s: %w", id, sandbox, err)
	}
	return nil
}

func (c *Client) sessionCall(ctx context.Context, method, sandbox, id, rest string, in, out any) error {
	seg, err := segment("session", id)
	if err != nil {
		return err
	}
	return c.sandboxCall(ctx, method, sandbox, "/sessions/"+seg+rest, in, out)
}

// AttachOptions says where an attach starts and where its streams go.
type AttachOptions struct {
	// Offset is the byte offset of stdout (of the terminal, with a tty)
	// to replay from, and StderrOffset stderr's (Offset's when nil); nil
	// replays everything still buffered. A client that attaches again
	// gives the offsets it has reached (see OnOffset) to get what it has
	// not seen and nothing twice.
	Offset, StderrOffset *int64
	// Stdin, Stdout, Stderr, Resize and Signal are as for Exec. Stdin's
	// EOF closes the command's stdin, for every client.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Resize         <-chan WindowSize
	Signal         <-chan string
	// NoFollow ends the attach once what was buffered when it began is
	// written: Attach then returns the exit code if the session had
	// exited, else -1 and no error. It is how `loam logs` reads.
	NoFollow bool
	// OnOffset, when not nil, is called before the first bytes of each
	// stream, and after every gap: the next bytes of stream start at
	// offset, and dropped bytes before it, from where this client was,
	// are no longer buffered.
	OnOffset func(stream byte, offset, dropped int64)
}

// Attach attaches to detachable session id of sandbox: it replays the
// buffered output from opts' offsets, then streams live output until the
// command exits, and returns its exit code as Exec does. Cancelling ctx
// detaches: the session runs on. When the sandbox is checkpointed or
// restored, the error wraps ErrInterrupted: attach again.
func (c *Client) Attach(ctx context.Context, sandbox, id string, opts AttachOptions) (int, error) {
	code, err := c.attach(ctx, sandbox, id, opts)
	if err != nil {
		return -1, fmt.Errorf("attaching to session %s of %s: %w", id, sandbox, err)
	}
	return code, nil
}

func (c *Client) attach(ctx context.Context, sandbox, id string, opts AttachOptions) (int, error) {
	sseg, err := segment("sandbox", sandbox)
	if err != nil {
		return -1, err
	}
	iseg, err := segment("session", id)
	if err != nil {
		return -1, err
	}
	q := api.AttachParams{Offset: opts.Offset, StderrOffset: opts.StderrOffset, NoFollow: opts.NoFollow}.Query()
	u := wsURL(c.base) + "/v1/sandboxes/" + sseg + "/sessions/" + iseg + "/attach"
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	h := http.Header{}
	c.authorize(h)
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.http, HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols && resp.Body != nil {
			return -1, decodeError(resp)
		}
		return -1, c.transportError(err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(execReadLimit)
	code, err := readStream(ctx, conn, streamIO{
		stdin: opts.Stdin, stdout: opts.Stdout, stderr: opts.Stderr,
		resize: opts.Resize, signal: opts.Signal, offset: opts.OnOffset,
	})
	if err != nil && opts.NoFollow && ctx.Err() == nil && websocket.CloseStatus(err) == websocket.StatusNormalClosure {
		// All that was buffered is written; the session runs on.
		return -1, nil
	}
	return code, err
}
