package sandbox

import (
	"errors"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/store"
)

// TestPortsNeedAgent3: a sandbox running an agent older than protocol 3
// (restored from an old checkpoint) is told so.
func TestPortsNeedAgent3(t *testing.T) {
	m := &Manager{}
	m.agents = &agentLink{m: m}
	m.agents.setVersion("sb-old", 2)
	m.agents.setVersion("sb-new", agent.ProtocolVersion)
	err := m.agents.require(&store.Sandbox{Sandbox: api.Sandbox{ID: "sb-old", Name: "old"}}, 3, "ports")
	if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "ports needs a newer agent than sandbox old runs (protocol 2, needs 3)") {
		t.Fatalf("old agent: %v", err)
	}
	if err := m.agents.require(&store.Sandbox{Sandbox: api.Sandbox{ID: "sb-new", Name: "new"}}, 3, "ports"); err != nil {
		t.Fatalf("current agent: %v", err)
	}
}
