package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// execReadLimit bounds one message from the exec socket. The daemon sends
// output in chunks far below this; the limit only stops a broken peer from
// making the client buffer without end. The library's default (32 KiB) is too
// small for a busy command's output frames.
const execReadLimit = 64 << 20

// stdinChunk is how much stdin goes into one frame: small enough that a
// frame (with its stream byte) fits the 32 KiB read limit WebSocket servers
// commonly keep by default.
const stdinChunk = 16 << 10

// ErrStreamEnded is wrapped by the error Exec and Attach return when the
// socket closed before the command exited. The command is gone (it got
// SIGHUP) unless it was a detachable session. When the daemon closed the
// socket with status 1011 (the sandbox was checkpointed or restored, or it
// died), the error also wraps ErrInterrupted and an *api.Error of code
// unavailable whose message says which.
var ErrStreamEnded = errors.New("exec stream ended before the command exited")

// ErrInterrupted is wrapped by the error Exec and Attach return when the
// daemon ended the stream with status 1011: the sandbox was checkpointed
// (memory) or restored, or its sandbox process died (the wrapped
// *api.Error says which). A detachable session runs on through a
// checkpoint, and through a memory restore comes back as it was then:
// attach to it again, from the offsets already received, to lose nothing.
var ErrInterrupted = errors.New("the daemon ended the stream (status 1011)")

// ErrNotStarted is wrapped by the error Exec returns when the sandbox was
// reached but the command could not be started; the error also wraps the
// *api.Error saying why (code not_found for a program that doesn't exist).
var ErrNotStarted = errors.New("command not started")

// WindowSize is the size of a terminal, in character cells.
type WindowSize struct {
	Rows int
	Cols int
}

// ExecOptions describes a command for Exec and where its streams go.
type ExecOptions struct {
	// Cmd is the program and its arguments; a program without a slash is
	// looked up in the sandbox's PATH.
	Cmd []string
	// Env adds to (and overrides) the sandbox's environment.
	Env map[string]string
	// Dir is the working directory; the user's home when empty.
	Dir string
	// User is "loam" when empty, or "root", or another user of the image.
	User string
	// TTY gives the command a terminal of Rows by Cols; its output then all
	// comes on Stdout.
	TTY  bool
	Rows int
	Cols int
	// Stdin, when not nil, is copied to the command's stdin, which is closed
	// at Stdin's EOF. When nil the command's stdin is empty. Exec does not
	// wait for a Read on Stdin to return: a reader that blocks (a terminal)
	// keeps one goroutine until it does.
	Stdin io.Reader
	// Stdout and Stderr receive the command's output; nil discards it.
	Stdout io.Writer
	Stderr io.Writer
	// Resize, when not nil, carries new terminal sizes (for TTY) to the command.
	Resize <-chan WindowSize
	// Signal, when not nil, carries signal names such as "INT" or "TERM" to
	// send to the command.
	Signal <-chan string
	// Detachable makes the command a session that runs on if the stream
	// ends before it exits (ctx cancelled, the connection lost, a
	// checkpoint); attach to it again with Attach. BufferSize is the size
	// of each of its output buffers (api.DefaultSessionBuffer when 0).
	Detachable bool
	BufferSize int
	// Started, when not nil, is called once the command has started, with
	// its pid and its session's id.
	Started func(pid int, session string)
}

// Exec runs a command in sandbox, streaming its stdin, stdout and stderr, and
// returns its exit status (128+N for a command killed by signal N). The
// error is nil whenever the command ran, whatever its status; the exit code
// is -1 when the error is not nil. Cancelling ctx closes the stream, which
// hangs the command up.
func (c *Client) Exec(ctx context.Context, sandbox string, opts ExecOptions) (int, error) {
	code, err := c.exec(ctx, sandbox, opts)
	if err != nil {
		what := "a command"
		if len(opts.Cmd) > 0 {
			what = opts.Cmd[0]
		}
		return -1, fmt.Errorf("running %s in %s: %w", what, sandbox, err)
	}
	return code, nil
}

// Output runs cmd in sandbox with an empty stdin and returns what it wrote
// and its exit status.
func (c *Client) Output(ctx context.Context, sandbox string, cmd ...string) (stdout, stderr []byte, exitCode int, err error) {
	var o, e bytes.Buffer
	exitCode, err = c.Exec(ctx, sandbox, ExecOptions{Cmd: cmd, Stdout: &o, Stderr: &e})
	return o.Bytes(), e.Bytes(), exitCode, err
}

func (c *Client) exec(ctx context.Context, sandbox string, opts ExecOptions) (int, error) {
	if len(opts.Cmd) == 0 {
		return -1, api.Errorf(api.CodeInvalid, "no command given")
	}
	seg, err := segment("sandbox", sandbox)
	if err != nil {
		return -1, err
	}
	h := http.Header{}
	c.authorize(h)
	conn, resp, err := websocket.Dial(ctx, wsURL(c.base)+"/v1/sandboxes/"+seg+"/exec", &websocket.DialOptions{
		HTTPClient: c.http,
		HTTPHeader: h,
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols && resp.Body != nil {
			return -1, decodeError(resp)
		}
		return -1, c.transportError(err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(execReadLimit)

	req, err := json.Marshal(api.ExecRequest{
		Cmd:   opts.Cmd,
		Env:   opts.Env,
		Dir:   opts.Dir,
		User:  opts.User,
		TTY:   opts.TTY,
		Rows:  opts.Rows,
		Cols:  opts.Cols,
		Stdin: opts.Stdin != nil,

		Detachable: opts.Detachable,
		BufferSize: opts.BufferSize,
	})
	if err != nil {
		return -1, fmt.Errorf("encoding the exec request: %w", err)
	}
	if err := conn.Write(ctx, websocket.MessageText, req); err != nil {
		return -1, streamError(ctx, err)
	}

	return readStream(ctx, conn, streamIO{
		stdin: opts.Stdin, stdout: opts.Stdout, stderr: opts.Stderr,
		resize: opts.Resize, signal: opts.Signal, started: opts.Started,
	})
}

// streamIO is where the messages of an exec or attach socket go.
type streamIO struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	resize         <-chan WindowSize
	signal         <-chan string
	started        func(pid int, session string)
	offset         func(stream byte, offset, dropped int64)
}

// readStream serves an exec or attach socket after the request: it sends
// stdin, resizes and signals, and writes output, until "exit".
func readStream(ctx context.Context, conn *websocket.Conn, sio streamIO) (int, error) {
	// The senders stop when this returns; the reader below decides when.
	sendCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if sio.stdin != nil {
		go sendStdin(sendCtx, conn, sio.stdin)
	}
	if sio.resize != nil || sio.signal != nil {
		go sendControls(sendCtx, conn, sio.resize, sio.signal)
	}

	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			return -1, streamError(ctx, err)
		}
		if typ == websocket.MessageBinary {
			if len(data) == 0 {
				continue
			}
			w := sio.stdout
			if data[0] == api.StreamStderr {
				w = sio.stderr
			} else if data[0] != api.StreamStdout {
				continue // a stream this client doesn't know: skip it
			}
			if w != nil {
				if _, err := w.Write(data[1:]); err != nil {
					return -1, fmt.Errorf("writing the command's output: %w", err)
				}
			}
			continue
		}

		var ctl api.ExecControl
		if err := json.Unmarshal(data, &ctl); err != nil {
			return -1, fmt.Errorf("decoding an exec message: %w", err)
		}
		switch ctl.Type {
		case api.ExecExit:
			if ctl.ExitCode == nil {
				return -1, fmt.Errorf("decoding an exec message: exit without exit_code")
			}
			// The daemon closes the socket after "exit"; answer its close
			// so neither side waits.
			_ = conn.Close(websocket.StatusNormalClosure, "")
			return *ctl.ExitCode, nil
		case api.ExecError:
			apiErr := ctl.Error
			if apiErr == nil {
				apiErr = &api.Error{Code: api.CodeInternal, Message: "the command could not be started"}
			}
			return -1, fmt.Errorf("%w: %w", ErrNotStarted, apiErr)
		case api.ExecStarted:
			if sio.started != nil {
				sio.started(ctl.PID, ctl.Session)
			}
		case api.ExecOffset:
			if sio.offset != nil {
				sio.offset(ctl.Stream, ctl.Offset, ctl.Dropped)
			}
		}
		// Message types newer than this client need nothing.
	}
}

// streamError explains why the socket ended before "exit".
func streamError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	var ce websocket.CloseError
	if errors.As(err, &ce) && ce.Code == websocket.StatusInternalError {
		msg := ce.Reason
		if msg == "" {
			msg = "the sandbox was checkpointed or restored"
		}
		return fmt.Errorf("%w: %w: %w", ErrStreamEnded, ErrInterrupted, &api.Error{Code: api.CodeUnavailable, Message: msg})
	}
	return fmt.Errorf("%w: %w", ErrStreamEnded, err)
}

// sendStdin copies r to stdin frames, then says "eof". A read error ends
// stdin just as EOF does: the command should not wait for input that will
// never come.
func sendStdin(ctx context.Context, conn *websocket.Conn, r io.Reader) {
	buf := make([]byte, 1+stdinChunk)
	buf[0] = api.StreamStdin
	for {
		n, err := r.Read(buf[1:])
		if n > 0 {
			if conn.Write(ctx, websocket.MessageBinary, buf[:1+n]) != nil {
				return
			}
		}
		if err != nil {
			break
		}
	}
	_ = writeControl(ctx, conn, api.ExecControl{Type: api.ExecEOF})
}

// sendControls sends resizes and signals until ctx ends or both channels close.
func sendControls(ctx context.Context, conn *websocket.Conn, resize <-chan WindowSize, signal <-chan string) {
	for resize != nil || signal != nil {
		var ctl api.ExecControl
		select {
		case <-ctx.Done():
			return
		case ws, ok := <-resize:
			if !ok {
				resize = nil
				continue
			}
			ctl = api.ExecControl{Type: api.ExecResize, Rows: ws.Rows, Cols: ws.Cols}
		case sig, ok := <-signal:
			if !ok {
				signal = nil
				continue
			}
			ctl = api.ExecControl{Type: api.ExecSignal, Signal: sig}
		}
		if writeControl(ctx, conn, ctl) != nil {
			return
		}
	}
}

func writeControl(ctx context.Context, conn *websocket.Conn, ctl api.ExecControl) error {
	b, err := json.Marshal(ctl)
	if err != nil {
		return err
	}
	return conn.Write(ctx, websocket.MessageText, b)
}

// wsURL turns the API's http(s) base URL into the ws(s) one.
func wsURL(base string) string {
	switch {
	case strings.HasPrefix(base, "https://"):
		return "wss://" + strings.TrimPrefix(base, "https://")
	case strings.HasPrefix(base, "http://"):
		return "ws://" + strings.TrimPrefix(base, "http://")
	}
	return base
}
