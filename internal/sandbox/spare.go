package sandbox

import (
	"context"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/internal/network"
)

// An exec opens a WebSocket to the sandbox's agent: a TCP connection and an
// HTTP upgrade through gVisor's network stack, the largest part of an
// exec's round trip that the daemon controls (2-6 ms of 10-20). So each
// exec has the daemon open sockets ahead for the next ones, spares (see
// spareTarget), which the agent holds waiting for their request; the next
// exec to that sandbox takes one and only sends its request.
//
// A spare is only good while nothing has happened to the sandbox's memory
// or its agent's token since it was opened: dropAgentConns (every memory
// checkpoint, restore, sleep and connect calls it) closes them all and
// turns away those being opened, a spare opened with another token than the
// sandbox's own is never used, and one older than spareMaxAge (the agent
// gives up waiting for a request after 30 s) neither.
type spareExec struct {
	conn   *websocket.Conn
	token  string
	opened time.Time
}

// spareMaxAge is how old a spare may be and still be used: well inside the
// agent's wait for a request (requestTimeout in package agent).
const spareMaxAge = 20 * time.Second

// spareDialTimeout bounds the opening of a spare.
const spareDialTimeout = 5 * time.Second

// spareTarget is how many spares each sandbox keeps: an exec that follows
// another at once finds one even when the socket opened for it during the
// last exec is not ready yet (gVisor serves that exec first).
const spareTarget = 2

// takeSpare returns a spare exec socket to sandbox id opened with token,
// or nil when there is none that can be used.
func (m *Manager) takeSpare(id, token string) *websocket.Conn {
	l := m.peek(id)
	if l == nil {
		return nil
	}
	for {
		l.mu.Lock()
		if len(l.spares) == 0 {
			l.mu.Unlock()
			return nil
		}
		s := l.spares[0]
		l.spares = l.spares[1:]
		l.mu.Unlock()
		if s.token == token && time.Since(s.opened) <= spareMaxAge {
			return s.conn
		}
		s.conn.CloseNow()
	}
}

// openSpare opens spare exec sockets to sandbox id's agent at ep, up to
// spareTarget with those it has and those being opened. It returns at once;
// a socket is kept only if no dropAgentConns or dropSpare came in the
// meantime. The dials are the Manager's (Close waits for them).
func (m *Manager) openSpare(id string, ep network.Endpoint, token string) {
	l := m.live(id)
	l.mu.Lock()
	n := spareTarget - len(l.spares) - l.opening
	if n <= 0 || m.bgCtx.Err() != nil {
		l.mu.Unlock()
		return
	}
	l.opening += n
	start := time.Now()
	l.mu.Unlock()
	for range n {
		ok := m.goBG(func() {
			ctx, cancel := context.WithTimeout(m.bgCtx, spareDialTimeout)
			defer cancel()
			conn, err := m.agentClient(ep, token).DialExec(ctx)
			if err == nil && !l.keepSpare(&spareExec{conn: conn, token: token, opened: time.Now()}, start) {
				conn.CloseNow()
			}
			l.mu.Lock()
			l.opening--
			l.mu.Unlock()
			if err == nil && (m.peek(id) != l || m.bgCtx.Err() != nil) {
				// Forgotten (deleted) or closing meanwhile: nobody would
				// take or close it.
				l.dropSpares()
			}
		})
		if !ok {
			l.mu.Lock()
			l.opening--
			l.mu.Unlock()
		}
	}
}

// keepSpare keeps s, a spare whose dial began at start, unless a drop came
// since or the sandbox has its spares already.
func (l *live) keepSpare(s *spareExec, start time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.dropped.Before(start) || len(l.spares) >= spareTarget {
		return false
	}
	l.spares = append(l.spares, s)
	return true
}

// dropSpares closes every spare exec socket and turns away those being
// opened (see dropAgentConns).
func (m *Manager) dropSpares() {
	m.mu.Lock()
	ls := make([]*live, 0, len(m.lives))
	for _, l := range m.lives {
		ls = append(ls, l)
	}
	m.mu.Unlock()
	for _, l := range ls {
		l.dropSpares()
	}
}

// dropSpare closes sandbox id's spare exec sockets and turns away those
// being opened (see closeStreams).
func (m *Manager) dropSpare(id string) {
	if l := m.peek(id); l != nil {
		l.dropSpares()
	}
}

// dropSpares closes the sandbox's spare exec sockets and turns away those
// being opened.
func (l *live) dropSpares() {
	l.mu.Lock()
	ss := l.spares
	l.spares = nil
	l.dropped = time.Now()
	l.mu.Unlock()
	for _, s := range ss {
		s.conn.CloseNow()
	}
}
