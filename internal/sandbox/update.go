package sandbox

import (
	"context"
	"fmt"

	"loam.dev/loam/api"
)

// Update changes the settings of a sandbox that may change while it lives
// (see api.UpdateSandbox), in any state but while another operation holds
// it. Each takes effect at once without waking or touching the sandbox:
// the idle timer, the URL front door and label filters all read the
// stored record. An update that gives nothing is an error.
func (m *Manager) Update(ctx context.Context, ref string, req api.UpdateSandbox) (*api.Sandbox, error) {
	if req.Labels == nil && req.Idle == nil && req.HTTPPort == nil && req.Public == nil && req.Recover == nil {
		return nil, api.Errorf(api.CodeInvalid, "nothing to update: give labels, idle, http_port, public or recover")
	}
	var checks []error
	if req.Recover != nil {
		checks = append(checks, checkRecover(*req.Recover))
	}
	if req.Labels != nil {
		checks = append(checks, checkLabels(*req.Labels))
	}
	if req.Idle != nil {
		checks = append(checks, checkIdle(*req.Idle, m.cfg.IdleMin))
	}
	if req.HTTPPort != nil {
		p := *req.HTTPPort
		if p == 0 {
			checks = append(checks, api.Errorf(api.CodeInvalid, "http_port: 0 is not a port (1-65535)"))
		}
		checks = append(checks, checkPort(p))
		if p == m.cfg.AgentPort {
			checks = append(checks, api.Errorf(api.CodeInvalid, "http_port: %d is the agent's port", p))
		}
	}
	for _, err := range checks {
		if err != nil {
			return nil, err
		}
	}
	sb, end, err := m.claim(ctx, ref, opUpdate)
	if err != nil {
		return nil, err
	}
	defer end()
	if req.Labels != nil {
		sb.Labels = orEmpty(*req.Labels)
	}
	if req.Idle != nil {
		sb.Idle = *req.Idle
	}
	if req.HTTPPort != nil {
		sb.HTTPPort = *req.HTTPPort
	}
	if req.Public != nil {
		sb.Public = *req.Public
	}
	if req.Recover != nil {
		sb.Recover = *req.Recover
	}
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		return nil, fmt.Errorf("updating %s: %w", sb.ID, err)
	}
	m.log.Info("sandbox updated", "sandbox", sb.ID, "name", sb.Name, "public", sb.Public, "idle", sb.Idle, "http_port", sb.HTTPPort)
	return m.view(sb), nil
}
