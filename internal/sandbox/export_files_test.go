package sandbox

// SetAgentVersion makes the Manager believe sandbox id runs an agent of
// protocol v, as one restored from an old checkpoint would.
func (m *Manager) SetAgentVersion(id string, v int) { m.agents.setVersion(id, v) }
