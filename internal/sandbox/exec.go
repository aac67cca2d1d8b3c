package sandbox

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// addStream registers s as a stream of sandbox id, until s is closed.
func (m *Manager) addStream(id string, s *Stream) {
	l := m.live(id)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.streams == nil {
		l.streams = map[*Stream]bool{}
	}
	l.streams[s] = true
	s.release = func() { l.removeStream(s) }
	s.died = func() bool { return l.died() }
}

func (l *live) removeStream(s *Stream) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.streams, s)
	l.used = time.Now() // idle time starts when the stream ends
}

// closeStreams ends every stream of a sandbox with status 1011, cuts its
// files calls in flight, and closes its spare exec socket.
func (m *Manager) closeStreams(id, reason string) {
	m.dropSpare(id)
	m.endCalls(id, reason)
	l := m.peek(id)
	if l == nil {
		return
	}
	l.mu.Lock()
	ss := make([]*Stream, 0, len(l.streams))
	for s := range l.streams {
		ss = append(ss, s)
	}
	l.mu.Unlock()
	// Each end waits for its client's socket to be closed (a few seconds
	// for a client that does not read): end them all at once.
	var wg sync.WaitGroup
	for _, s := range ss {
		wg.Go(func() { s.end(reason) })
	}
	wg.Wait()
}

// CheckExec checks that a command can be run in the sandbox now, before the
// caller upgrades the connection, so that refusals are plain HTTP errors.
func (m *Manager) CheckExec(ctx context.Context, ref string) (*api.Sandbox, error) {
	sb, err := m.awake(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := requireState(sb.Name, sb.State, api.StateRunning); err != nil {
		return nil, err
	}
	return m.view(sb), nil
}

// Exec starts a command in a sandbox: it sends the request, with the
// sandbox's environment under the request's, to the sandbox's agent, and
// returns the agent's exec socket as a Stream for the caller to proxy to its
// client (the exec protocol of api/exec.go). It fails, before anything was
// sent to the client, when the command cannot be sent.
func (m *Manager) Exec(ctx context.Context, ref string, req api.ExecRequest) (*Stream, error) {
	for try := 1; ; try++ {
		start := time.Now()
		s, id, err := m.exec(ctx, ref, req)
		if err == nil || try == 3 || ctx.Err() != nil || id == "" || !m.heldSince(id, start) {
			return s, err
		}
		// A memory checkpoint began between the look at the sandbox and
		// the command reaching its agent: it dropped the socket, or the
		// agent took a new token. The command did not start; send it
		// again once the checkpoint is taken (awake waits for it).
	}
}

// exec is one try of Exec; id is the sandbox's once it was found.
func (m *Manager) exec(ctx context.Context, ref string, req api.ExecRequest) (_ *Stream, id string, err error) {
	sb, err := m.awake(ctx, ref)
	if sb != nil {
		id = sb.ID
	}
	if err == nil {
		err = requireState(sb.Name, sb.State, api.StateRunning)
	}
	if err == nil {
		err = m.requireDetachable(sb, req)
	}
	if err != nil {
		return nil, id, err
	}
	ep, err := m.Endpoint(sb)
	if err != nil {
		return nil, id, err
	}
	first, err := json.Marshal(sessionRequest(sb, req))
	if err != nil {
		return nil, id, err
	}

	token := m.agentToken(sb)
	// The next exec finds its socket open (spare.go).
	defer m.openSpare(sb.ID, ep, token)
	if ag := m.takeSpare(sb.ID, token); ag != nil {
		s := newStream(ag, agentControl)
		m.addStream(sb.ID, s)
		if err := sendRequest(ctx, ag, first); err == nil {
			return s, id, nil
		}
		// The agent closed it (it is not waiting any more): open another.
		s.Close()
	}
	ag, err := m.agentClient(ep, token).DialExec(ctx)
	if err != nil {
		m.log.Warn("dialing agent", "sandbox", sb.ID, "err", err)
		return nil, id, api.Errorf(api.CodeUnavailable, "the sandbox's agent does not answer")
	}
	s := newStream(ag, agentControl)
	m.addStream(sb.ID, s)
	if err := sendRequest(ctx, ag, first); err != nil {
		s.Close()
		m.log.Warn("sending exec request to agent", "sandbox", sb.ID, "err", err)
		return nil, id, api.Errorf(api.CodeUnavailable, "the sandbox's agent does not answer")
	}
	return s, id, nil
}

// agentMessageLimit bounds one message an agent sends on an exec, attach
// or logs socket. Agents send output in frames of at most 32 KiB and small
// control messages; the sandbox is not trusted, and whatever it sends is
// held in the daemon's memory one message at a time.
const agentMessageLimit = 1 << 20

// sendRequest sends an exec request (first) on a socket to an agent.
func sendRequest(ctx context.Context, ag *websocket.Conn, first []byte) error {
	ag.SetReadLimit(agentMessageLimit)
	return ag.Write(ctx, websocket.MessageText, first)
}

// agentErrorCodes are the error classes an agent may give a command it could
// not start: the request was wrong for this sandbox (no such user, no such
// directory) or the program is not there. Anything else an agent says is
// its own failure, not a verdict on the request.
var agentErrorCodes = map[api.Code]bool{api.CodeInvalid: true, api.CodeNotFound: true}

// maxAgentMessage bounds the error text of an agent passed on to a client.
const maxAgentMessage = 1024

// agentControl passes an agent's control message on to the client, unless
// it is an "error" the agent has no business choosing the class of: that
// becomes an internal error that quotes what the agent said. What goes on
// is the message as loam reads it, written anew, never the agent's bytes:
// a client that reads JSON another way (case-sensitive keys, the first of
// two equal keys, fields of the wrong type skipped) must see what was
// checked here. A text message that is no control message is dropped.
func agentControl(data []byte) []byte {
	var c api.ExecControl
	if json.Unmarshal(data, &c) != nil {
		return nil
	}
	if c.Type != api.ExecError || c.Error != nil && agentErrorCodes[c.Error.Code] && len(c.Error.Message) <= maxAgentMessage {
		out, _ := json.Marshal(c)
		return out
	}
	said := ""
	if c.Error != nil {
		said = string(c.Error.Code) + ": " + c.Error.Message
	}
	if len(said) > maxAgentMessage {
		said = said[:maxAgentMessage] + "…"
	}
	c.Error = api.Errorf(api.CodeInternal, "the sandbox's agent failed: %q", said)
	out, _ := json.Marshal(c)
	return out
}
