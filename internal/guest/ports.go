package guest

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/agentconn"
	"loam.dev/loam/internal/sandbox"
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

var portsNeed = sandbox.Need{Protocol: portsVersion, What: "ports"}

// CheckPorts checks that a sandbox's ports can be watched or streamed to
// now, before the caller upgrades the connection, so that refusals are
// plain HTTP errors.
func (g *Guest) CheckPorts(ctx context.Context, ref string) error {
	c, err := g.core.Relay(ctx, ref, portsNeed)
	if err == nil {
		c.End()
	}
	return err
}

// ListPorts lists the TCP ports that something in a running sandbox listens
// on, by port, leaving out the agent's own.
func (g *Guest) ListPorts(ctx context.Context, ref string) ([]api.Port, error) {
	c, err := g.core.Relay(ctx, ref, portsNeed)
	if err != nil {
		return nil, err
	}
	defer c.End()
	pl, err := c.Agent.Ports(c.Ctx)
	if err != nil {
		return nil, g.agentFailed(c, "listing ports", err, nil)
	}
	return checkPorts(pl.Ports, g.core.AgentPort())
}

// checkPorts keeps of an agent's listing what can be true: ports in range,
// not the agent's own (agentPort), on addresses that are addresses.
func checkPorts(ps []api.Port, agentPort int) ([]api.Port, error) {
	if len(ps) > maxPorts {
		return nil, api.Errorf(api.CodeInternal, "the sandbox's agent listed %d ports", len(ps))
	}
	out := make([]api.Port, 0, len(ps))
	for _, p := range ps {
		if p.Port < 1 || p.Port > api.MaxPort || p.Port == agentPort || len(p.Addresses) == 0 || len(p.Addresses) > maxPortAddresses {
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
func (g *Guest) WatchPorts(ctx context.Context, ref string) (*sandbox.Stream, error) {
	c, err := g.core.Relay(ctx, ref, portsNeed)
	if err != nil {
		return nil, err
	}
	defer c.End()
	ag, err := c.Agent.DialPortWatch(c.Ctx)
	if err != nil {
		return nil, g.agentFailed(c, "opening a port watch", err, nil)
	}
	return c.Stream(ag, portEvent), nil
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
func (g *Guest) DialPort(ctx context.Context, ref string, port int) (*sandbox.Stream, error) {
	if port < 1 || port > api.MaxPort {
		return nil, api.Errorf(api.CodeInvalid, "port %d: give a TCP port, 1 to %d", port, api.MaxPort)
	}
	if port == g.core.AgentPort() {
		return nil, api.Errorf(api.CodeForbidden, "port %d is loam's agent, which serves only loam", port)
	}
	c, err := g.core.Relay(ctx, ref, portsNeed)
	if err != nil {
		return nil, err
	}
	defer c.End()
	ag, err := c.Agent.DialPort(c.Ctx, port)
	if err != nil {
		return nil, g.agentFailed(c, "opening a port stream", err, func(ae *agent.Error) error {
			return portRefusal(c.Sandbox.Name, port, ae)
		})
	}
	return c.Stream(ag, dropText), nil
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

// agentFailed is the API's error for a call c to a sandbox's agent
// (doing) that failed (agentconn.Map): what known says of the agent's
// answer, or the agent's own answer quoted as an internal error; not
// reaching it is unavailable. The cause is logged.
func (g *Guest) agentFailed(c *sandbox.Call, doing string, err error, known func(*agent.Error) error) error {
	g.log.Warn(doing, "sandbox", c.Sandbox.ID, "err", err)
	return agentconn.Map(c.Ctx, err, known, func() error {
		return api.Errorf(api.CodeUnavailable, "the agent of sandbox %s does not answer", c.Sandbox.Name)
	})
}
