package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"sync"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// stream is one open client stream on a sandbox (an exec socket; later port
// streams and file watches). A memory checkpoint or a restore ends every
// stream of the sandbox with status 1011.
type stream struct {
	once   sync.Once
	cancel context.CancelCauseFunc
	client *websocket.Conn
}

// end closes the client's socket with 1011 and stops the proxy.
func (s *stream) end(reason string) {
	s.once.Do(func() {
		s.client.Close(websocket.StatusInternalError, reason)
		s.cancel(errors.New(reason))
	})
}

func (m *Manager) addStream(id string, s *stream) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.streams[id] == nil {
		m.streams[id] = map[*stream]bool{}
	}
	m.streams[id][s] = true
}

func (m *Manager) removeStream(id string, s *stream) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.streams[id], s)
	if len(m.streams[id]) == 0 {
		delete(m.streams, id)
	}
}

// closeStreams ends every stream of a sandbox with status 1011.
func (m *Manager) closeStreams(id, reason string) {
	m.mu.Lock()
	ss := make([]*stream, 0, len(m.streams[id]))
	for s := range m.streams[id] {
		ss = append(ss, s)
	}
	m.mu.Unlock()
	// Each close waits for the client's reply (up to a few seconds for one
	// that does not read): close them all at once, not one after another.
	var wg sync.WaitGroup
	for _, s := range ss {
		wg.Go(func() { s.end(reason) })
	}
	wg.Wait()
}

// CheckExec checks that a command can be run in the sandbox now, before the
// caller upgrades the connection, so that refusals are plain HTTP errors.
func (m *Manager) CheckExec(ctx context.Context, ref string) (*api.Sandbox, error) {
	sb, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := requireState(sb.Name, sb.State, api.StateRunning); err != nil {
		return nil, err
	}
	return m.view(sb), nil
}

// Exec runs a command in a sandbox for a client's exec socket: it sends the
// request, with the sandbox's environment under the request's, to the
// sandbox's agent and copies messages both ways until the command exits or
// either side goes away. It returns an error only when the command could not
// be started and nothing was sent to the client yet: the caller tells the
// client why. The caller closes the client's socket.
func (m *Manager) Exec(ctx context.Context, ref string, req api.ExecRequest, client *websocket.Conn) error {
	sb, err := m.lookup(ctx, ref)
	if err == nil {
		err = requireState(sb.Name, sb.State, api.StateRunning)
	}
	if err != nil {
		return err
	}
	ep, err := m.Endpoint(sb)
	if err != nil {
		return err
	}
	env := maps.Clone(sb.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, req.Env)
	env["LOAM_SANDBOX"] = sb.Name
	env["LOAM_SANDBOX_ID"] = sb.ID
	req.Env = env

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	s := &stream{cancel: cancel, client: client}
	m.addStream(sb.ID, s)
	defer m.removeStream(sb.ID, s)

	ag, err := m.agentClient(ep, m.agentToken(sb)).DialExec(ctx)
	if err != nil {
		m.log.Warn("dialing agent", "sandbox", sb.ID, "err", err)
		return api.Errorf(api.CodeUnavailable, "the sandbox's agent does not answer")
	}
	ag.SetReadLimit(32 << 20)
	defer ag.CloseNow()
	first, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if err := ag.Write(ctx, websocket.MessageText, first); err != nil {
		m.log.Warn("sending exec request to agent", "sandbox", sb.ID, "err", err)
		return api.Errorf(api.CodeUnavailable, "the sandbox's agent does not answer")
	}

	errc := make(chan error, 2)
	// Client -> agent: stdin and control. When the client goes away, closing
	// the agent's socket hangs the command up.
	go func() { errc <- pump(ctx, client, ag, nil) }()
	// Agent -> client: output, then "exit", then a normal close.
	go func() { errc <- pump(ctx, ag, client, agentControl) }()
	err = <-errc
	switch st := websocket.CloseStatus(err); {
	case st == websocket.StatusNormalClosure:
		// The agent finished (exit sent) or the client hung up cleanly.
		client.Close(websocket.StatusNormalClosure, "")
		ag.Close(websocket.StatusNormalClosure, "")
	case ctx.Err() != nil:
	default:
		client.Close(websocket.StatusInternalError, "the stream to the sandbox broke")
	}
	return nil
}

// pump copies messages from one socket to another until either fails. A
// close received from src is passed on to dst with its status. filter, when
// not nil, rewrites each text message.
func pump(ctx context.Context, src, dst *websocket.Conn, filter func([]byte) []byte) error {
	for {
		typ, data, err := src.Read(ctx)
		if err != nil {
			if st := websocket.CloseStatus(err); st != -1 {
				dst.Close(st, "")
			}
			return err
		}
		if typ == websocket.MessageText && filter != nil {
			data = filter(data)
		}
		if err := dst.Write(ctx, typ, data); err != nil {
			return err
		}
	}
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
// becomes an internal error that quotes what the agent said.
func agentControl(data []byte) []byte {
	var c api.ExecControl
	if json.Unmarshal(data, &c) != nil || c.Type != api.ExecError {
		return data
	}
	if c.Error != nil && agentErrorCodes[c.Error.Code] && len(c.Error.Message) <= maxAgentMessage {
		return data
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
