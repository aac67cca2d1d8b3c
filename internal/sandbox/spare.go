package sandbox

import (
	"context"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/internal/network"
)

// An exec opens a WebSocket to the sandbox's agent: a TCP connection and an
// HTTP upgrade through gVisor's network stack, the largest part of an
// exec's round trip that the daemon controls (2-6 ms of 10-20). So after
// each exec the daemon opens the next one's socket ahead, a spare, which
// the agent holds waiting for its request; the next exec to that sandbox
// takes it and only sends its request.
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

// takeSpare returns the spare exec socket to sandbox id, opened with token,
// or nil when there is none that can be used.
func (m *Manager) takeSpare(id, token string) *websocket.Conn {
	m.mu.Lock()
	s := m.spares[id]
	delete(m.spares, id)
	m.mu.Unlock()
	if s == nil {
		return nil
	}
	if s.token != token || time.Since(s.opened) > spareMaxAge {
		s.conn.CloseNow()
		return nil
	}
	return s.conn
}

// openSpare opens a spare exec socket to sandbox id's agent at ep, unless
// it has one or one is being opened. It returns at once; the socket is
// kept only if no dropAgentConns or dropSpare came in the meantime.
func (m *Manager) openSpare(id string, ep network.Endpoint, token string) {
	m.mu.Lock()
	if m.spares[id] != nil || m.sparesOpening[id] {
		m.mu.Unlock()
		return
	}
	m.sparesOpening[id] = true
	epoch := m.spareEpoch
	m.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), spareDialTimeout)
		defer cancel()
		conn, err := m.agentClient(ep, token).DialExec(ctx)
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(m.sparesOpening, id)
		if err != nil {
			return
		}
		if epoch != m.spareEpoch || m.spares[id] != nil {
			conn.CloseNow()
			return
		}
		m.spares[id] = &spareExec{conn: conn, token: token, opened: time.Now()}
	}()
}

// dropSpares closes every spare exec socket and turns away those being
// opened (see dropAgentConns).
func (m *Manager) dropSpares() {
	m.mu.Lock()
	spares := m.spares
	m.spares = map[string]*spareExec{}
	m.spareEpoch++
	m.mu.Unlock()
	for _, s := range spares {
		s.conn.CloseNow()
	}
}

// dropSpare closes sandbox id's spare exec socket and turns away those
// being opened (see closeStreams).
func (m *Manager) dropSpare(id string) {
	m.mu.Lock()
	s := m.spares[id]
	delete(m.spares, id)
	m.spareEpoch++
	m.mu.Unlock()
	if s != nil {
		s.conn.CloseNow()
	}
}
