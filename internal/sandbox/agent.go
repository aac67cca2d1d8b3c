package sandbox

import (
	"context"
	"fmt"
	"net/netip"

	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/network"
	"loam.dev/loam/internal/store"
)

// SetInside gives the manager the in-sandbox API; call it before Recover.
func (m *Manager) SetInside(in Insiders) { m.inside = in }

// connect waits for a sandbox's agent, which answers to the token it holds
// (old: the sandbox's own after a boot, the checkpoint's after a restore or
// a fork), hands it the sandbox's own token if that differs, and tells it
// who it is: the sandbox's id and name and where its in-sandbox API is.
func (m *Manager) connect(ctx context.Context, sb *store.Sandbox, ep network.Endpoint, old string) error {
	m.dropAgent(sb.ID)
	tmp := *sb
	tmp.AgentToken = old
	ac := m.agentClient(&tmp, ep)
	defer m.dropAgent(sb.ID)
	ctx, cancel := context.WithTimeout(ctx, m.cfg.BootTimeout)
	defer cancel()
	if err := ac.WaitReady(ctx); err != nil {
		return fmt.Errorf("waiting for the agent of %s: %w", sb.ID, err)
	}
	if old != sb.AgentToken {
		if err := ac.RotateToken(ctx, sb.AgentToken); err != nil {
			return fmt.Errorf("handing the agent of %s its token: %w", sb.ID, err)
		}
		ac.Token = sb.AgentToken
	}
	if m.inside == nil {
		return nil
	}
	addr := netip.AddrPortFrom(ep.HostIP, uint16(m.cfg.InsidePort))
	if err := m.inside.Open(sb.ID, addr, ep.SandboxIP); err != nil {
		return fmt.Errorf("serving the in-sandbox API of %s on %s: %w", sb.ID, addr, err)
	}
	id := agent.Identity{
		SandboxID: sb.ID, SandboxName: sb.Name,
		APIURL: "http://" + addr.String(), APIToken: m.inside.Token(sb.ID),
	}
	if err := ac.SetIdentity(ctx, id); err != nil {
		return fmt.Errorf("telling the agent of %s who it is: %w", sb.ID, err)
	}
	return nil
}
