package agentconn

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/internal/agent"
)

// Conns are the daemon's connections to every sandbox's agent: one HTTP
// transport that carries every request, and the exec sockets opened ahead.
//
// An exec opens a WebSocket to the sandbox's agent: a TCP connection and
// an HTTP upgrade through gVisor's network stack, the largest part of an
// exec's round trip that the daemon controls (2-6 ms of 10-20). So each
// exec has sockets opened ahead for the next ones, spares (see
// SpareTarget), which the agent holds waiting for their request; the next
// exec to that sandbox takes one and only sends its request.
//
// A spare is only good while nothing has happened to the sandbox's memory
// or its agent's token since it was opened: Drop and DropAll (every memory
// checkpoint, restore, sleep and connect calls them) close them and turn
// away those being opened, a spare opened with another token than the one
// asked for is never used, and one older than SpareMaxAge (the agent gives
// up waiting for a request after 30 s) neither.
//
// The dials are Conns' own goroutines: Close ends them and waits.
type Conns struct {
	http *http.Client
	port int

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu     sync.Mutex
	closed bool
	byID   map[string]*spares
	bg     sync.WaitGroup
}

// spares are one sandbox's spare exec sockets: opening is how many are
// being opened; a dial begun before the last drop (dropped) is turned
// away.
type spares struct {
	ready   []spare
	opening int
	dropped time.Time
}

type spare struct {
	conn   *websocket.Conn
	token  string
	opened time.Time
}

// SpareMaxAge is how old a spare may be and still be used: well inside
// the agent's wait for a request (requestTimeout in package agent).
const SpareMaxAge = 20 * time.Second

// spareDialTimeout bounds the opening of a spare.
const spareDialTimeout = 5 * time.Second

// SpareTarget is how many spares each sandbox keeps: an exec that follows
// another at once finds one even when the socket opened for it during the
// last exec is not ready yet (gVisor serves that exec first).
const SpareTarget = 2

// errClosed is the cause the dials are cut with by Close.
var errClosed = errors.New("the connections to agents are closing")

// NewConns makes the connections to agents that listen on port.
func NewConns(port int) *Conns {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Conns{
		http: &http.Client{Transport: &http.Transport{
			// Never a proxy from the environment: agent traffic stays local.
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     30 * time.Second,
			// See agent.Client's send: uploads wait for the agent to
			// take their token before their body goes.
			ExpectContinueTimeout: 2 * time.Second,
		}},
		port:   port,
		ctx:    ctx,
		cancel: cancel,
		byID:   map[string]*spares{},
	}
}

// Client is a client of the agent at addr that presents token.
func (c *Conns) Client(addr netip.Addr, token string) *agent.Client {
	return &agent.Client{
		BaseURL: "http://" + net.JoinHostPort(addr.String(), strconv.Itoa(c.port)),
		Token:   token,
		HTTP:    c.http,
	}
}

// TakeSpare returns a spare exec socket to sandbox id opened with token,
// or nil when there is none that can be used.
func (c *Conns) TakeSpare(id, token string) *websocket.Conn {
	for {
		c.mu.Lock()
		ss := c.byID[id]
		if ss == nil || len(ss.ready) == 0 {
			c.mu.Unlock()
			return nil
		}
		s := ss.ready[0]
		ss.ready = ss.ready[1:]
		c.mu.Unlock()
		if s.token == token && time.Since(s.opened) <= SpareMaxAge {
			return s.conn
		}
		s.conn.CloseNow()
	}
}

// OpenSpares opens spare exec sockets to sandbox id's agent at addr, up to
// SpareTarget with those it has and those being opened. It returns at
// once; a socket is kept only if no Drop, DropAll or Forget of the sandbox
// came in the meantime.
func (c *Conns) OpenSpares(id string, addr netip.Addr, token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	ss := c.byID[id]
	if ss == nil {
		ss = &spares{}
		c.byID[id] = ss
	}
	n := SpareTarget - len(ss.ready) - ss.opening
	if n <= 0 {
		return
	}
	ss.opening += n
	start := time.Now()
	for range n {
		c.bg.Go(func() {
			ctx, cancel := context.WithTimeout(c.ctx, spareDialTimeout)
			defer cancel()
			conn, err := c.Client(addr, token).DialExec(ctx)
			c.mu.Lock()
			ss.opening--
			keep := err == nil && !c.closed && c.byID[id] == ss && ss.dropped.Before(start) && len(ss.ready) < SpareTarget
			if keep {
				ss.ready = append(ss.ready, spare{conn: conn, token: token, opened: time.Now()})
			}
			c.mu.Unlock()
			if err == nil && !keep {
				// Dropped, forgotten (deleted) or closing meanwhile:
				// nobody would take or close it.
				conn.CloseNow()
			}
		})
	}
}

// Drop closes sandbox id's spare exec sockets and turns away those being
// opened.
func (c *Conns) Drop(id string) {
	c.mu.Lock()
	ss := c.byID[id]
	var ready []spare
	if ss != nil {
		ready = ss.ready
		ss.ready = nil
		ss.dropped = time.Now()
	}
	c.mu.Unlock()
	closeAll(ready)
}

// DropAll closes the idle connections and spare exec sockets to every
// agent, and turns away those being opened, so that none is open into a
// sandbox whose memory is about to be written or replaced (its agent
// would wake up holding a dead one). Every sandbox's go, since the pool
// is shared: the next calls dial afresh, which costs little.
func (c *Conns) DropAll() {
	c.http.CloseIdleConnections()
	c.mu.Lock()
	var ready []spare
	now := time.Now()
	for _, ss := range c.byID {
		ready = append(ready, ss.ready...)
		ss.ready = nil
		ss.dropped = now
	}
	c.mu.Unlock()
	closeAll(ready)
}

// Forget closes sandbox id's spare exec sockets and forgets it (it is
// deleted); a socket being opened is closed when it opens.
func (c *Conns) Forget(id string) {
	c.mu.Lock()
	ss := c.byID[id]
	delete(c.byID, id)
	var ready []spare
	if ss != nil {
		ready = ss.ready
		ss.ready = nil
	}
	c.mu.Unlock()
	closeAll(ready)
}

// Spares is how many spare exec sockets sandbox id has ready.
func (c *Conns) Spares(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ss := c.byID[id]; ss != nil {
		return len(ss.ready)
	}
	return 0
}

// BreakSpares closes sandbox id's spare exec sockets on the daemon's side
// and leaves them in place, as sockets the agent stopped waiting on: for
// tests of what an exec does with one.
func (c *Conns) BreakSpares(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ss := c.byID[id]; ss != nil {
		for _, s := range ss.ready {
			s.conn.CloseNow()
		}
	}
}

// Close ends the dials in progress and waits for them, closes every spare
// and the idle connections. Nothing is opened after.
func (c *Conns) Close() error {
	c.mu.Lock()
	c.closed = true
	var ready []spare
	for id, ss := range c.byID {
		ready = append(ready, ss.ready...)
		delete(c.byID, id)
	}
	c.mu.Unlock()
	c.cancel(errClosed)
	closeAll(ready)
	c.bg.Wait()
	// Their goroutines go with them.
	c.http.CloseIdleConnections()
	return nil
}

func closeAll(ss []spare) {
	for _, s := range ss {
		s.conn.CloseNow()
	}
}
