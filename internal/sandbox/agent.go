package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/agentconn"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/network"
	"loam.dev/loam/internal/store"
)

// agentLink is the core's link to its sandboxes' agents: the tokens an
// agent answers to (derived from the daemon's secret, never stored), the
// connect after every boot, restore, wake or restart of the daemon (wait
// for it, hand it its own token, tell it who it is), the token's rotation
// after a memory checkpoint, the protocol version it speaks, the clients
// and spare exec sockets the core holds to it (dropped when its machine
// changes), and the services a create asks it to start. It is a
// unit of its own because every way a sandbox comes up ends in it, and its
// rules (which tokens a crash may leave an agent with, what a sandbox taken
// back may ignore) hold for all of them alike. The connections themselves
// are agentconn's; what a connect sets in motion in the rest of the core
// (the in-sandbox API, the secrets, the watch on the sandbox process) it
// asks of the Manager.
//
// Every call it makes to an agent runs inside the operation that holds the
// sandbox, and goes through within (relay.go), which checks that it does:
// its methods that call the agent take that operation.
type agentLink struct {
	m *Manager
}

// connect waits for a sandbox's agent, which answers to one of holds (the
// token it was started with after a boot, the checkpoint's after a restore
// or a fork; a recovery tries the ones a crash may have left it with),
// hands it the sandbox's own token if it holds another, and tells it who it
// is: the sandbox's id and name and where its in-sandbox API is. op is
// the operation that holds the sandbox and connects it (see within).
func (a *agentLink) connect(ctx context.Context, sb *store.Sandbox, op operation, ep network.Endpoint, holds ...string) error {
	return a.dial(ctx, sb, op, ep, false, holds)
}

// takeBack is connect for a sandbox whose agent comes back with this
// sandbox's own memory: its container ran on through a restart of the
// daemon (a graceful one, a crash and an upgrade alike: an upgrade is a
// restart with a new binary, and the agent that runs on is the old one
// until the sandbox boots again), or it wakes from its own sleep image.
// Its agent knows who it is, and none of that has changed (the in-sandbox
// API's token is derived from the daemon's secret), so an agent that
// answers the identity with an error (an older one, on a full disk,
// answers 500) keeps the one it has, and the sandbox is taken back all the
// same: a sandbox's disk full is the sandbox's state, not a reason to lose
// it. A restore or a fork is not this: its memory may name another.
func (a *agentLink) takeBack(ctx context.Context, sb *store.Sandbox, op operation, ep network.Endpoint, holds ...string) error {
	return a.dial(ctx, sb, op, ep, true, holds)
}

// dial is connect (takingBack false) and takeBack (true). Every call it
// makes goes through within, for op.
func (a *agentLink) dial(ctx context.Context, sb *store.Sandbox, op operation, ep network.Endpoint, takingBack bool, holds []string) error {
	m := a.m
	// Connections made before a restore lead to a sandbox that is gone.
	m.agents.dropAgentConns()
	ctx, cancel := context.WithTimeout(ctx, m.cfg.BootTimeout)
	defer cancel()
	var c *Call
	var health agent.Health
	for i, tok := range holds {
		var err error
		if c, err = a.within(ctx, sb, op, ep, tok); err != nil {
			return fmt.Errorf("waiting for the agent of %s: %w", sb.ID, err)
		}
		defer c.End()
		health, err = c.Agent.WaitReady(c.Ctx)
		if err == nil {
			break
		}
		if !agent.IsUnauthorized(err) || i == len(holds)-1 {
			return fmt.Errorf("waiting for the agent of %s: %w", sb.ID, err)
		}
	}
	if c == nil {
		return fmt.Errorf("waiting for the agent of %s: no token to present", sb.ID)
	}
	a.setVersion(sb.ID, health.Version)
	if own := a.token(sb); c.token != own {
		if err := c.Agent.RotateToken(c.Ctx, own); err != nil {
			return fmt.Errorf("handing the agent of %s its token: %w", sb.ID, err)
		}
		// The agent answers to its own token alone from here on.
		var err error
		if c, err = a.within(ctx, sb, op, ep, own); err != nil {
			return fmt.Errorf("handing the agent of %s its token: %w", sb.ID, err)
		}
		defer c.End()
	}
	if sb.LegacyAgentToken != "" {
		// The agent holds a derived token now; the stored one is of no use.
		sb.LegacyAgentToken = ""
		if err := m.store.UpdateSandbox(ctx, sb); err != nil {
			return fmt.Errorf("forgetting the stored agent token of %s: %w", sb.ID, err)
		}
	}
	if err := a.identify(c.Ctx, sb, ep, c.Agent); err != nil {
		var ae *agent.Error
		if !takingBack || !errors.As(err, &ae) {
			return err
		}
		m.log.Warn("the agent of a sandbox taken back refused its identity; it keeps the one the last daemon gave it", "sandbox", sb.ID, "err", err)
	}
	// Started, restored or taken back: a sandbox process to watch.
	m.deaths.watch(ctx, sb.ID)
	return nil
}

// identify tells the agent at ep, reached through ac (a Call's, from
// within), who it is: the sandbox's id and name, its env and secrets, and
// where its in-sandbox API is (served from here on). A warm pool's member
// that is claimed needs only this: its agent is up and holds its token.
func (a *agentLink) identify(ctx context.Context, sb *store.Sandbox, ep network.Endpoint, ac *agent.Client) error {
	m := a.m
	if m.inside == nil {
		return nil
	}
	addr := netip.AddrPortFrom(ep.HostIP, uint16(m.cfg.InsidePort))
	if err := m.inside.Open(sb.ID, addr, ep.SandboxIP); err != nil {
		return fmt.Errorf("serving the in-sandbox API of %s on %s: %w", sb.ID, addr, err)
	}
	secretEnv, secretFiles, err := m.secretValues(ctx, sb)
	if err != nil {
		return err
	}
	id := agent.Identity{
		SandboxID: sb.ID, SandboxName: sb.Name,
		APIURL: "http://" + addr.String(), APIToken: m.inside.Token(sb.ID),
		Env:       sb.Env,
		SecretEnv: secretEnv, SecretFiles: secretFiles,
	}
	if err := ac.SetIdentity(ctx, id); err != nil {
		if agent.IsNoSpace(err) {
			// The agent holds the identity in memory, which is all that
			// exec, services, secrets and the socket need; only files the
			// sandbox's programs may read are missing, as they would be
			// for any write on a full disk.
			m.log.Warn("the sandbox's disk is full: its agent took its identity but could not write all of it", "sandbox", sb.ID, "err", err)
			return nil
		}
		return fmt.Errorf("telling the agent of %s who it is: %w", sb.ID, err)
	}
	return nil
}

// recoveryTokens are the tokens a running sandbox's agent may hold after a
// crash of the daemon: its own; the one before, if the crash came between
// storing a new generation and handing it over (see rotate); the one
// an older loam stored.
func (a *agentLink) recoveryTokens(sb *store.Sandbox) []string {
	toks := []string{a.token(sb)}
	if sb.AgentGen > 0 {
		toks = append(toks, AgentToken(a.m.cfg.Secret, sb.ID, sb.AgentGen-1))
	}
	if sb.LegacyAgentToken != "" {
		toks = append(toks, sb.LegacyAgentToken)
	}
	return toks
}

// rotate moves a running sandbox's agent to the next generation of its
// token. It runs after every memory checkpoint, before the checkpoint is
// visible: the image holds the token the agent had, which every restore and
// fork of it wakes up with, and that must not be one the source answers to.
// The new generation is stored first, so that a crash in between leaves the
// agent with a token recovery tries (see recoveryTokens). op is the
// operation that holds the sandbox: the checkpoint, or the restore that
// keeps the state before it.
func (a *agentLink) rotate(ctx context.Context, sb *store.Sandbox, op operation) error {
	m := a.m
	ep, err := m.Endpoint(sb)
	if err != nil {
		return err
	}
	// Refused before the generation moves on, if op does not hold sb.
	c, err := a.within(ctx, sb, op, ep, a.token(sb))
	if err != nil {
		return fmt.Errorf("handing the agent of %s a new token: %w", sb.ID, err)
	}
	defer c.End()
	sb.AgentGen++
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		sb.AgentGen--
		return fmt.Errorf("numbering the agent token of %s: %w", sb.ID, err)
	}
	crash.Point("token.stored")
	ctx, cancel := context.WithTimeout(c.Ctx, m.cfg.BootTimeout)
	defer cancel()
	if err := c.Agent.RotateToken(ctx, a.token(sb)); err != nil {
		return fmt.Errorf("handing the agent of %s a new token: %w", sb.ID, err)
	}
	return nil
}

// publicError is err as the API shows it: an agent's answer in it is the
// sandbox's word, never an API error class (agentconn.Failed).
func publicError(err error) error { return agentconn.Failed(err) }

// setVersion records the protocol version of the agent sandbox id
// runs now: learned at every connect, since a restore or a fork may bring
// back an older agent with the checkpoint's memory.
func (a *agentLink) setVersion(id string, v int) {
	l := a.m.live(id)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.agentVersion = v
}

// require refuses, with a clear error, an operation (what) that needs
// an agent of protocol version min or newer when sandbox sb runs an older
// one.
func (a *agentLink) require(sb *store.Sandbox, min int, what string) error {
	v := 0
	if l := a.m.peek(sb.ID); l != nil {
		l.mu.Lock()
		v = l.agentVersion
		l.mu.Unlock()
	}
	if v == 0 || v >= min {
		// Unknown only between a daemon's start and the sandbox's first
		// connect, when nothing can reach it anyway.
		return nil
	}
	return api.Errorf(api.CodeConflict, "%s needs a newer agent than sandbox %s runs (protocol %d, needs %d): it was restored or forked from a checkpoint taken by an older loam; a fresh boot (a disk-only checkpoint restored, or a new sandbox) runs the current agent", what, sb.Name, v, min)
}
