package guest

import (
	"context"
	"encoding/json"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/agentconn"
	"loam.dev/loam/internal/sandbox"
)

// CheckExec checks that a command can be run in the sandbox now, before the
// caller upgrades the connection, so that refusals are plain HTTP errors.
// The sandbox stays active until release is called: between the check
// and Exec the client completes its handshake and sends its command,
// which on a loaded host can take longer than the sandbox's idle, and the
// sandbox it woke must not fall asleep meanwhile.
func (g *Guest) CheckExec(ctx context.Context, ref string) (_ *api.Sandbox, release func(), err error) {
	c, err := g.core.Relay(ctx, ref, sandbox.Need{})
	if err != nil {
		return nil, nil, err
	}
	defer c.End()
	return c.View(), c.Activate(), nil
}

// Exec starts a command in a sandbox: it sends the request, with the
// sandbox's environment under the request's, to the sandbox's agent, and
// returns the agent's exec socket as a Stream for the caller to proxy to its
// client (the exec protocol of api/exec.go). It fails, before anything was
// sent to the client, when the command cannot be sent.
func (g *Guest) Exec(ctx context.Context, ref string, req api.ExecRequest) (*sandbox.Stream, error) {
	for try := 1; ; try++ {
		s, held, err := g.exec(ctx, ref, req)
		if err == nil || try == 3 || ctx.Err() != nil || !held {
			return s, err
		}
		// A memory checkpoint began between the look at the sandbox and
		// the command reaching its agent: it dropped the socket, or the
		// agent took a new token. The command did not start; send it
		// again once the checkpoint is taken (Relay waits for it).
	}
}

// exec is one try of Exec; held reports whether calls were held since it
// began (see Call.Held).
func (g *Guest) exec(ctx context.Context, ref string, req api.ExecRequest) (_ *sandbox.Stream, held bool, err error) {
	c, err := g.core.Relay(ctx, ref, sandbox.Need{})
	if err != nil {
		return nil, false, err
	}
	defer c.End()
	defer func() {
		if err != nil {
			held = c.Held()
		}
	}()
	if err := requireDetachable(c, req); err != nil {
		return nil, false, err
	}
	sb := c.Sandbox
	first, err := json.Marshal(sessionRequest(sb, req))
	if err != nil {
		return nil, false, err
	}
	// The next exec finds its socket open (the core's spares).
	defer c.OpenSpares()
	if ag := c.TakeSpare(); ag != nil {
		s := c.Stream(ag, agentconn.Control)
		if err := sendRequest(ctx, ag, first); err == nil {
			return s, false, nil
		}
		// The agent closed it (it is not waiting any more): open another.
		s.Close()
	}
	noAnswer := func(doing string, err error) error {
		g.log.Warn(doing, "sandbox", sb.ID, "err", err)
		return api.Errorf(api.CodeUnavailable, "the sandbox's agent does not answer")
	}
	ag, err := c.DialExec(ctx)
	if err != nil {
		// Whatever the agent answered the upgrade with, no command started.
		return nil, false, noAnswer("dialing agent", err)
	}
	s := c.Stream(ag, agentconn.Control)
	if err := sendRequest(ctx, ag, first); err != nil {
		s.Close()
		return nil, false, noAnswer("sending exec request to agent", err)
	}
	return s, false, nil
}

// sendRequest sends an exec request (first) on a socket to an agent.
func sendRequest(ctx context.Context, ag *websocket.Conn, first []byte) error {
	ag.SetReadLimit(agentconn.MessageLimit)
	return ag.Write(ctx, websocket.MessageText, first)
}

// noAnswer is the API's error for a call whose agent gave no answer, in
// the words of sessions, services and exec; the cause is logged.
func (g *Guest) noAnswer(sandboxID, key, id string, err error) func() error {
	return func() error {
		g.log.Warn("calling agent", "sandbox", sandboxID, key, id, "err", err)
		return api.Errorf(api.CodeUnavailable, "the sandbox's agent does not answer")
	}
}

// mayChoose passes on an agent's refusal (4xx) of a command it could not
// start, with its text, when the class is one an agent may choose (see
// agentconn.MayChoose).
func mayChoose(ae *agent.Error) error {
	if ae.Status/100 == 4 && agentconn.MayChoose(api.Code(ae.Code)) {
		return api.Errorf(api.Code(ae.Code), "%s", ae.Message)
	}
	return nil
}
