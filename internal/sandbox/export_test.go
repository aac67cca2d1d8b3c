package sandbox

// Lives is how many sandboxes have a live object (live.go), which holds
// the lock on their checkpoints and what is known of their agent.
func (m *Manager) Lives() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.lives)
}

// HeavyWaiters is how many heavy operations wait for a slot (caps.go).
func (m *Manager) HeavyWaiters() int { return int(m.heavy.waiting.Load()) }

// OpWaiters is how many calls wait for the end of the operation running
// on sandbox id (live.waitOp).
func (m *Manager) OpWaiters(id string) int {
	l := m.peek(id)
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiters
}

// DeathWatchers is how many watches on sandbox processes run (death.go).
func (m *Manager) DeathWatchers() int { return int(m.deaths.waiting.Load()) }

// HasSpare reports whether sandbox id has a spare exec socket.
func (m *Manager) HasSpare(id string) bool { return m.conns.Spares(id) > 0 }

// BreakSpares closes sandbox id's spare exec sockets on the daemon's side
// and leaves them in place, as sockets the agent stopped waiting on.
func (m *Manager) BreakSpares(id string) { m.conns.BreakSpares(id) }
