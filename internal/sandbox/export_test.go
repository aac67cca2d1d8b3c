package sandbox

// AgentControl is agentControl, for the external tests.
var AgentControl = agentControl

// SourceLocks is how many sandboxes have a lock on their checkpoints.
func (m *Manager) SourceLocks() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.sources) + len(m.agentVersions)
}
