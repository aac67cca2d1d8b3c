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
	return m.spares[id] != nil
}

// BreakSpare closes sandbox id's spare exec socket on the daemon's side and
// leaves it in place, as a socket the agent stopped waiting on.
func (m *Manager) BreakSpare(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.spares[id]; s != nil {
		s.conn.CloseNow()
	}
}
