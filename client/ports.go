package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net"
	"net/http"
	"strconv"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// portReadLimit bounds one message from a port stream or watch; the daemon
// sends at most api.MaxPortMessage at a time.
const portReadLimit = 1 << 20

// ListPorts lists the TCP ports that something in a running sandbox listens
// on, by port. The sandbox's agent's own port is never among them.
func (c *Client) ListPorts(ctx context.Context, sandbox string) ([]api.Port, error) {
	seg, err := segment("sandbox", sandbox)
	if err != nil {
		return nil, err
	}
	var pl api.PortList
	if err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+seg+"/ports", nil, nil, &pl); err != nil {
		return nil, fmt.Errorf("listing the ports of %s: %w", sandbox, err)
	}
	if pl.Ports == nil {
		pl.Ports = []api.Port{}
	}
	return pl.Ports, nil
}

// WatchPorts watches the TCP ports of a running sandbox: it yields an
// api.PortOpen event for every port listening when the watch starts, then
// one event for every port that opens or closes. The daemon looks a few
// times a second, so a port open for less than that may be missed.
//
// The watch lasts until the caller stops ranging or ctx ends (then it
// yields nothing more), or until the daemon ends it: then it yields one
// error and stops. A memory checkpoint or a restore of the sandbox ends the
// watch with an error that wraps ErrStreamEnded and an *api.Error of code
// unavailable; a watch that could not start yields the *api.Error why.
func (c *Client) WatchPorts(ctx context.Context, sandbox string) iter.Seq2[api.PortEvent, error] {
	return func(yield func(api.PortEvent, error) bool) {
		conn, err := c.dialPorts(ctx, sandbox, "/ports/watch")
		if err != nil {
			yield(api.PortEvent{}, fmt.Errorf("watching the ports of %s: %w", sandbox, err))
			return
		}
		defer conn.CloseNow()
		for {
			typ, b, err := conn.Read(ctx)
			if err != nil {
				if ctx.Err() == nil {
					yield(api.PortEvent{}, fmt.Errorf("watching the ports of %s: %w", sandbox, portStreamError(err)))
				}
				return
			}
			var ev api.PortEvent
			if typ != websocket.MessageText || json.Unmarshal(b, &ev) != nil {
				continue // not an event this client knows
			}
			if !yield(ev, nil) {
				conn.Close(websocket.StatusNormalClosure, "")
				return
			}
		}
	}
}

// DialPort connects to TCP port port inside a running sandbox, through the
// daemon, and returns the connection. Nothing needs to be published: the
// connection is made from inside the sandbox, so ports that listen only on
// loopback are reachable too. It fails with an *api.Error of code not_found
// when nothing listens on the port.
//
// Reads return io.EOF once the program has closed the connection; closing
// the returned conn closes the program's side (there is no half close). A
// memory checkpoint or a restore of the sandbox ends the connection: Read
// and Write then fail with an error that wraps ErrStreamEnded and an
// *api.Error of code unavailable. ctx bounds the dialing only.
func (c *Client) DialPort(ctx context.Context, sandbox string, port int) (net.Conn, error) {
	conn, err := c.dialPorts(ctx, sandbox, "/ports/"+strconv.Itoa(port)+"/stream")
	if err != nil {
		return nil, fmt.Errorf("connecting to port %d of %s: %w", port, sandbox, err)
	}
	return &portConn{Conn: websocket.NetConn(context.Background(), conn, websocket.MessageBinary)}, nil
}

// dialPorts opens one of a sandbox's port WebSockets (path below the
// sandbox).
func (c *Client) dialPorts(ctx context.Context, sandbox, path string) (*websocket.Conn, error) {
	seg, err := segment("sandbox", sandbox)
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	c.authorize(h)
	conn, resp, err := websocket.Dial(ctx, wsURL(c.base)+"/v1/sandboxes/"+seg+path, &websocket.DialOptions{
		HTTPClient: c.http,
		HTTPHeader: h,
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols && resp.Body != nil {
			return nil, decodeError(resp)
		}
		return nil, c.transportError(err)
	}
	conn.SetReadLimit(portReadLimit)
	return conn, nil
}

// portStreamError explains why a port socket ended: the daemon's 1011
// (the sandbox was checkpointed or restored) as unavailable.
func portStreamError(err error) error {
	var ce websocket.CloseError
	if errors.As(err, &ce) && ce.Code == websocket.StatusInternalError {
		msg := ce.Reason
		if msg == "" {
			msg = "the sandbox was checkpointed or restored"
		}
		return fmt.Errorf("%w: %w", errPortStreamEnded, &api.Error{Code: api.CodeUnavailable, Message: msg})
	}
	return fmt.Errorf("%w: %w", errPortStreamEnded, err)
}

// errPortStreamEnded is ErrStreamEnded in the words of a port socket.
var errPortStreamEnded error = streamEnded("the port stream ended")

// streamEnded is an end of a stream that errors.Is takes for ErrStreamEnded.
type streamEnded string

func (e streamEnded) Error() string        { return string(e) }
func (e streamEnded) Is(target error) bool { return target == ErrStreamEnded }

// portConn is a port stream as a net.Conn: Writes are split into messages
// of at most api.MaxPortMessage, and the daemon's ending of the stream is
// explained.
type portConn struct {
	net.Conn
}

func (p *portConn) Read(b []byte) (int, error) {
	n, err := p.Conn.Read(b)
	return n, closedError(err)
}

func (p *portConn) Write(b []byte) (int, error) {
	var n int
	for len(b) > 0 {
		m, err := p.Conn.Write(b[:min(len(b), api.MaxPortMessage)])
		n += m
		if err != nil {
			return n, closedError(err)
		}
		b = b[m:]
	}
	return n, nil
}

// closedError explains an error of a port stream's conn when the daemon
// closed the stream (with a status other than 1000, which reads as io.EOF);
// other errors (a deadline, the caller's own Close) are returned as they are.
func closedError(err error) error {
	var ce websocket.CloseError
	if err == nil || errors.Is(err, io.EOF) || !errors.As(err, &ce) {
		return err
	}
	return portStreamError(err)
}
