package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/store"
)

// portsVersion is the first agent protocol version that knows ports.
const portsVersion = 3

// Bounds on what a listing passes on from an agent: more ports than a
// sandbox can listen on, or more addresses than a sandbox has for one
// port, is an agent that is lying.
const (
	maxPorts         = api.MaxPort
	maxPortAddresses = 64
)

// portsSandbox finds a running sandbox whose agent knows ports.
func (m *Manager) portsSandbox(ctx context.Context, ref string) (*store.Sandbox, *agent.Client, error) {
	sb, err := m.awake(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	if err := requireState(sb.Name, sb.State, api.StateRunning); err != nil {
		return nil, nil, err
	}
	if err := m.requireAgent(sb, portsVersion, "ports"); err != nil {
		return nil, nil, err
	}
	ep, err := m.Endpoint(sb)
	if err != nil {
		return nil, nil, err
	}
	return sb, m.callClient(sb, ep), nil
}

// CheckPorts checks that a sandbox's ports can be watched or streamed to
// now, before the caller upgrades the connection, so that refusals are
// plain HTTP errors.
func (m *Manager) CheckPorts(ctx context.Context, ref string) error {
	_, _, err := m.portsSandbox(ctx, ref)
	return err
}

// ListPorts lists the TCP ports that something in a running sandbox listens
// on, by port, leaving out the agent's own.
func (m *Manager) ListPorts(ctx context.Context, ref string) ([]api.Port, error) {
	sb, ac, err := m.portsSandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	pl, err := ac.Ports(ctx)
	if err != nil {
		return nil, m.agentFailed(sb, "listing ports", err)
	}
	return m.checkPorts(pl.Ports)
}

// checkPorts keeps of an agent's listing what can be true: ports in range,
// not the agent's own, on addresses that are addresses.
func (m *Manager) checkPorts(ps []api.Port) ([]api.Port, error) {
	if len(ps) > maxPorts {
		return nil, api.Errorf(api.CodeInternal, "the sandbox's agent listed %d ports", len(ps))
	}
	out := make([]api.Port, 0, len(ps))
	for _, p := range ps {
		if p.Port < 1 || p.Port > api.MaxPort || p.Port == m.cfg.AgentPort || len(p.Addresses) == 0 || len(p.Addresses) > maxPortAddresses {
			return nil, api.Errorf(api.CodeInternal, "the sandbox's agent listed a port that cannot be (%d)", p.Port)
		}
		loopback := true
		for _, a := range p.Addresses {
			ip, err := netip.ParseAddr(a)
			if err != nil {
				return nil, api.Errorf(api.CodeInternal, "the sandbox's agent listed port %d on a bad address", p.Port)
			}
			loopback = loopback && ip.IsLoopback()
		}
		p.Loopback = loopback
		out = append(out, p)
	}
	return out, nil
}

// WatchPorts opens a port watch on a running sandbox: a Stream whose text
// messages are api.PortEvent (see api/ports.go). A memory checkpoint or a
// restore ends it.
func (m *Manager) WatchPorts(ctx context.Context, ref string) (*Stream, error) {
	sb, ac, err := m.portsSandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	ag, err := ac.DialPortWatch(ctx)
	if err != nil {
		return nil, m.agentFailed(sb, "opening a port watch", err)
	}
	s := newStream(ag, portEvent)
	m.addStream(sb.ID, s)
	return s, nil
}

// portEvent passes on an agent's port event as loam writes one, or drops
// (nil) a message that is not one.
func portEvent(data []byte) []byte {
	var ev api.PortEvent
	if json.Unmarshal(data, &ev) != nil || (ev.Type != api.PortOpen && ev.Type != api.PortClose) || ev.Port < 1 || ev.Port > api.MaxPort {
		return nil
	}
	out, _ := json.Marshal(api.PortEvent{Type: ev.Type, Port: ev.Port})
	return out
}

// DialPort opens a port stream: one TCP connection, made inside a running
// sandbox, to port, carried by a Stream's binary messages both ways. It
// fails, before anything is sent to the client, when nothing listens on the
// port (not_found) or it does not take the connection (unavailable). The
// agent's own port is forbidden. A memory checkpoint or a restore ends it.
func (m *Manager) DialPort(ctx context.Context, ref string, port int) (*Stream, error) {
	if port < 1 || port > api.MaxPort {
		return nil, api.Errorf(api.CodeInvalid, "port %d: give a TCP port, 1 to %d", port, api.MaxPort)
	}
	if port == m.cfg.AgentPort {
		return nil, api.Errorf(api.CodeForbidden, "port %d is loam's agent, which serves only loam", port)
	}
	sb, ac, err := m.portsSandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	ag, err := ac.DialPort(ctx, port)
	if err != nil {
		if perr := portRefusal(sb.Name, port, err); perr != nil {
			return nil, perr
		}
		return nil, m.agentFailed(sb, "opening a port stream", err)
	}
	s := newStream(ag, dropText)
	m.addStream(sb.ID, s)
	return s, nil
}

// portRefusal is loam's own error for an agent's refusal of a port stream
// that says something about the port (err is an *agent.Error of status 404
// or 503), chosen by the status alone, never by what the agent wrote; nil
// for any other error, which is the agent's failure.
func portRefusal(sandbox string, port int, err error) error {
	var ae *agent.Error
	if !errors.As(err, &ae) {
		return nil
	}
	switch ae.Status {
	case http.StatusNotFound:
		return api.Errorf(api.CodeNotFound, "nothing listens on TCP port %d in sandbox %s", port, sandbox)
	case http.StatusServiceUnavailable:
		return api.Errorf(api.CodeUnavailable, "TCP port %d in sandbox %s does not accept connections", port, sandbox)
	}
	return nil
}

// dropText drops every text message: a port stream carries bytes only.
func dropText([]byte) []byte { return nil }

// agentFailed is the API's error for a call to a sandbox's agent (doing)
// that failed: the agent's own answer is quoted as an internal error (see
// publicError); not reaching it is unavailable. The cause is logged.
func (m *Manager) agentFailed(sb *store.Sandbox, doing string, err error) error {
	m.log.Warn(doing, "sandbox", sb.ID, "err", err)
	var ae *agent.Error
	if errors.As(err, &ae) {
		return publicError(err)
	}
	return api.Errorf(api.CodeUnavailable, "the agent of sandbox %s does not answer", sb.Name)
}
