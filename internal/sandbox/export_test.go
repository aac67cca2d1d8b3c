package sandbox

// AgentControl is agentControl, for the external tests.
var AgentControl = agentControl

// SourceLocks is how many sandboxes have a lock on their checkpoints.
func (m *Manager) SourceLocks() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.sources) + len(m.agentVersions)
}

// HasSpare reports whether sandbox id has a spare exec socket (spare.go).
func (m *Manager) HasSpare(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.spares[id]) > 0
}

// BreakSpares closes sandbox id's spare exec sockets on the daemon's side
// and leaves them in place, as sockets the agent stopped waiting on.
func (m *Manager) BreakSpares(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.spares[id] {
		s.conn.CloseNow()
	}
}
