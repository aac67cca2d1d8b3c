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
	for {
		m.mu.Lock()
		ss := m.spares[id]
		if len(ss) == 0 {
			m.mu.Unlock()
			return nil
		}
		s := ss[0]
		m.spares[id] = ss[1:]
		if len(m.spares[id]) == 0 {
			delete(m.spares, id)
		}
		m.mu.Unlock()
		if s.token == token && time.Since(s.opened) <= spareMaxAge {
			return s.conn
		}
		s.conn.CloseNow()
	}
}

// openSpare opens spare exec sockets to sandbox id's agent at ep, up to
// spareTarget with those it has and those being opened. It returns at once;
// a socket is kept only if no dropAgentConns or dropSpare came in the
// meantime.
func (m *Manager) openSpare(id string, ep network.Endpoint, token string) {
	m.mu.Lock()
	n := spareTarget - len(m.spares[id]) - m.sparesOpening[id]
	if n <= 0 {
		m.mu.Unlock()
		return
	}
	m.sparesOpening[id] += n
	epoch := m.spareEpoch
	m.mu.Unlock()
	for range n {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), spareDialTimeout)
			defer cancel()
			conn, err := m.agentClient(ep, token).DialExec(ctx)
			m.mu.Lock()
			defer m.mu.Unlock()
			if m.sparesOpening[id]--; m.sparesOpening[id] <= 0 {
				delete(m.sparesOpening, id)
			}
			if err != nil {
				return
			}
			if epoch != m.spareEpoch || len(m.spares[id]) >= spareTarget {
				conn.CloseNow()
				return
			}
			m.spares[id] = append(m.spares[id], &spareExec{conn: conn, token: token, opened: time.Now()})
		}()
	}
}

// dropSpares closes every spare exec socket and turns away those being
// opened (see dropAgentConns).
func (m *Manager) dropSpares() {
	m.mu.Lock()
	spares := m.spares
	m.spares = map[string][]*spareExec{}
	m.spareEpoch++
	m.mu.Unlock()
	for _, ss := range spares {
		for _, s := range ss {
			s.conn.CloseNow()
		}
	}
}

// dropSpare closes sandbox id's spare exec sockets and turns away those
// being opened (see closeStreams).
func (m *Manager) dropSpare(id string) {
	m.mu.Lock()
	ss := m.spares[id]
	delete(m.spares, id)
	m.spareEpoch++
	m.mu.Unlock()
	for _, s := range ss {
		s.conn.CloseNow()
	}
}
