package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/sandbox"
)

// DefaultWriteTimeout bounds how long the daemon waits for a client to take
// one write of a stream (a WebSocket message, a chunk of a download), and
// one read of an upload. A client that stalls longer is cut off: its
// socket is closed, and the work behind it is held up no longer. Meanwhile
// the daemon holds at most one message for it; the rest waits in the
// sandbox (whose agent bounds its own buffers) or in the kernel's.
const DefaultWriteTimeout = 30 * time.Second

// ProxyStream copies messages between a client's socket and a sandbox's stream
// until either side ends, then closes both: normally when the agent or the
// client closed normally, with 1011 and the reason when the sandbox ended
// the stream (a memory checkpoint, a restore) or the link to it broke. A
// client that takes no message for DefaultWriteTimeout is cut off.
func ProxyStream(ctx context.Context, client *websocket.Conn, st *sandbox.Stream) {
	proxyStream(ctx, client, st, DefaultWriteTimeout)
}

// proxyStream is ProxyStream cutting off a client that takes no message
// for writeTimeout.
func proxyStream(ctx context.Context, client *websocket.Conn, st *sandbox.Stream, writeTimeout time.Duration) {
	defer st.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	agent := st.Agent()
	errc := make(chan error, 2)
	// Client -> agent: stdin and control. When the client goes away,
	// closing the agent's socket hangs the command up.
	// No write timeout towards the agent: a command that does not read its
	// stdin holds the client back, as a pipe would.
	go func() { errc <- pump(ctx, client, agent, nil, 0) }()
	// Agent -> client: output, then "exit", then a normal close.
	go func() { errc <- pump(ctx, agent, client, st.FromAgent, writeTimeout) }()
	// Both pumps end before the stream does: the request's log line then
	// knows whether either cut the client off (write notes it), and no
	// pump outlives the request.
	ended := 0
	defer func() {
		cancel()
		for ; ended < 2; ended++ {
			<-errc
		}
	}()
	var err error
	select {
	case err = <-errc:
		ended++
		if websocket.CloseStatus(err) != websocket.StatusNormalClosure && ctx.Err() == nil {
			st.Broke() // the sandbox may have died: learn why
		}
	case <-st.Ended():
	}
	switch {
	case st.Reason() != "":
		// Release the Manager first: it waits for the stream to be let
		// go before it pauses the sandbox, and a client that does not
		// read would hold it for the whole close handshake.
		st.Close()
		client.Close(websocket.StatusInternalError, st.Reason())
	case websocket.CloseStatus(err) == websocket.StatusNormalClosure:
		// The agent finished (exit sent) or the client hung up cleanly.
		client.Close(websocket.StatusNormalClosure, "")
		agent.Close(websocket.StatusNormalClosure, "")
	case ctx.Err() != nil:
	case errors.Is(err, context.DeadlineExceeded):
		// The client stopped reading: its socket is closed already (a
		// write cut short leaves no frame to close with).
		client.CloseNow()
	default:
		client.Close(websocket.StatusInternalError, "the stream to the sandbox broke")
	}
}

// pump copies messages from one socket to another until either fails. A
// close received from src is passed on to dst with its status. filter, when
// not nil, rewrites each text message, or drops it by returning nil. A
// write to dst that takes longer than timeout (when not 0) fails it.
func pump(ctx context.Context, src, dst *websocket.Conn, filter func([]byte) []byte, timeout time.Duration) error {
	for {
		typ, data, err := src.Read(ctx)
		if err != nil {
			if st := websocket.CloseStatus(err); st != -1 {
				dst.Close(st, "")
			}
			return err
		}
		if typ == websocket.MessageText && filter != nil {
			if data = filter(data); data == nil {
				continue // dropped
			}
		}
		if err := write(ctx, dst, typ, data, timeout); err != nil {
			return err
		}
	}
}

// write writes one message to c, failing with context.DeadlineExceeded if
// it takes longer than timeout (when not 0).
func write(ctx context.Context, c *websocket.Conn, typ websocket.MessageType, data []byte, timeout time.Duration) error {
	if timeout <= 0 {
		return c.Write(ctx, typ, data)
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := c.Write(wctx, typ, data)
	if err != nil && wctx.Err() != nil && ctx.Err() == nil {
		err = fmt.Errorf("the client took no message for %v: %w", timeout, context.DeadlineExceeded)
		noteCut(ctx, err.Error())
		return err
	}
	return err
}

// idleWriter writes a response with a deadline renewed at every write: a
// client that takes nothing for timeout is cut off, however long the whole
// transfer takes.
type idleWriter struct {
	ctx     context.Context // the request's, for its log line
	w       io.Writer
	rc      *http.ResponseController
	timeout time.Duration
}

func newIdleWriter(w http.ResponseWriter, r *http.Request, timeout time.Duration) *idleWriter {
	return &idleWriter{ctx: r.Context(), w: w, rc: http.NewResponseController(w), timeout: timeout}
}

func (w *idleWriter) Write(p []byte) (int, error) {
	// Not every ResponseWriter has deadlines (a test's recorder): then
	// the write is only unbounded, as before.
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	n, err := w.w.Write(p)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		noteCut(w.ctx, fmt.Sprintf("the client took nothing for %v", w.timeout))
	}
	return n, err
}

// done lifts the deadline: the connection may serve further requests,
// whose writes must not meet this one's.
func (w *idleWriter) done() { _ = w.rc.SetWriteDeadline(time.Time{}) }

// idleReader reads a request's body with a deadline renewed at every read:
// an uploader that sends nothing for timeout (gone without a word) fails
// the upload, which then leaves nothing behind, instead of holding it open.
type idleReader struct {
	r       io.Reader
	rc      *http.ResponseController
	timeout time.Duration
	// err is the first failed read but EOF: the client's fault. Guarded:
	// an HTTP client may still read a request body after its call
	// returned.
	mu  sync.Mutex
	err error
}

func newIdleReader(w http.ResponseWriter, r *http.Request, timeout time.Duration) *idleReader {
	return &idleReader{r: r.Body, rc: http.NewResponseController(w), timeout: timeout}
}

func (r *idleReader) Read(p []byte) (int, error) {
	_ = r.rc.SetReadDeadline(time.Now().Add(r.timeout))
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		r.mu.Lock()
		if r.err == nil {
			r.err = err
		}
		r.mu.Unlock()
	}
	return n, err
}

// clientError is what an upload that failed with err says when its client
// broke it off (gone, or silent for the timeout): the client's doing, not
// the daemon's, whatever the sandbox answered to the body cut short. Any
// other failure is err as it is.
func (r *idleReader) clientError(err error) error {
	r.mu.Lock()
	rerr := r.err
	r.mu.Unlock()
	if err == nil || rerr == nil {
		return err
	}
	if errors.Is(rerr, os.ErrDeadlineExceeded) {
		return api.Errorf(api.CodeInvalid, "the upload was abandoned: the client sent nothing for %v; nothing of it was kept", r.timeout)
	}
	return api.Errorf(api.CodeInvalid, "the upload was cut short: %s; nothing of it was kept", rerr)
}

// done lifts the deadline, as idleWriter.done does.
func (r *idleReader) done() { _ = r.rc.SetReadDeadline(time.Time{}) }
