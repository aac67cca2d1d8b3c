package guest

import (
	"context"
	"maps"
	"net/http"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/agentconn"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/store"
)

// sessionsProtocol is the first agent protocol with exec sessions.
const sessionsProtocol = 3

// Exec sessions (api/session.go) live in the sandbox's agent, which owns
// their processes and output: these relays only route calls to it, check
// that the agent is new enough, and turn the agent's answers, which are
// the sandbox's word, into the API's own. A memory checkpoint ends attach
// sockets and waits like every stream, and leaves detachable sessions
// running; they come back with the memory of a restore or a fork.

var sessionsNeed = sandbox.Need{Protocol: sessionsProtocol, What: "sessions"}

// checkSessionID refuses an id that is not one before it goes into a path.
func checkSessionID(sb *store.Sandbox, id string) error {
	if !api.ValidSessionID(id) {
		return noSession(sb, id)
	}
	return nil
}

func noSession(sb *store.Sandbox, id string) error {
	return api.Errorf(api.CodeNotFound, "sandbox %s has no session %q", sb.Name, id)
}

// sessionError is err, from a call c made to the agent about session id
// ("" for none), as the API shows it (agentconn.Map). The agent's status
// picks among the answers loam expects of it, each in loam's words
// (conflict names what a 409 means for the call); an agent's refusal of a
// command it could not start keeps its text, as on exec (see
// agentconn.Control); anything else the agent says is its own failure,
// and a call that got no answer is unavailable.
func (g *Guest) sessionError(ctx context.Context, sb *store.Sandbox, id string, err error, conflict string) error {
	return agentconn.Map(ctx, err, func(ae *agent.Error) error {
		switch {
		case ae.Status == http.StatusNotFound && id != "":
			return noSession(sb, id)
		case ae.Status == http.StatusConflict && conflict != "":
			return api.Errorf(api.CodeConflict, "session %s of %s %s", id, sb.Name, conflict)
		}
		return mayChoose(ae)
	}, g.noAnswer(sb.ID, "session", id, err))
}

// checkAnswer checks a session an agent answered with: it is the sandbox's
// word, passed on to clients only when it is well formed.
func checkAnswer(sb *store.Sandbox, s *api.Session) error {
	if !api.ValidSessionID(s.ID) || (s.State != api.SessionRunning && s.State != api.SessionExited) ||
		(s.State == api.SessionExited) != (s.ExitCode != nil) {
		return api.Errorf(api.CodeInternal, "the sandbox's agent failed: it answered with a malformed session (sandbox %s)", sb.Name)
	}
	return nil
}

// sessionRequest is req with the sandbox's environment under its own, as
// Exec gives it.
func sessionRequest(sb *store.Sandbox, req api.ExecRequest) api.ExecRequest {
	env := maps.Clone(sb.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, req.Env)
	env["LOAM_SANDBOX"] = sb.Name
	env["LOAM_SANDBOX_ID"] = sb.ID
	req.Env = env
	return req
}

// checkBuffer refuses a buffer size nothing would act on or that is out of
// range.
func checkBuffer(req api.ExecRequest) error {
	switch {
	case req.BufferSize != 0 && !req.Detachable:
		return api.Errorf(api.CodeInvalid, "buffer_size: only a detachable session keeps its output")
	case req.BufferSize < 0 || req.BufferSize > api.MaxSessionBuffer:
		return api.Errorf(api.CodeInvalid, "buffer_size: between 0 (the default, %d) and %d bytes", api.DefaultSessionBuffer, api.MaxSessionBuffer)
	}
	return nil
}

// requireDetachable refuses a detachable exec on an agent older than
// sessions, and a buffer size with nothing to act on it.
func requireDetachable(c *sandbox.Call, req api.ExecRequest) error {
	if err := checkBuffer(req); err != nil {
		return err
	}
	if req.Detachable {
		if err := c.RequireAgent(sessionsProtocol, "a detachable exec"); err != nil {
			return err
		}
	}
	return nil
}

// sessionCall begins a call about session id ("" for none) of sandbox ref.
func (g *Guest) sessionCall(ctx context.Context, ref, id string) (*sandbox.Call, error) {
	c, err := g.core.Relay(ctx, ref, sessionsNeed)
	if err != nil {
		return nil, err
	}
	if id != "" {
		if err := checkSessionID(c.Sandbox, id); err != nil {
			c.End()
			return nil, err
		}
	}
	return c, nil
}

// CreateSession starts a detachable session with no socket attached.
func (g *Guest) CreateSession(ctx context.Context, ref string, req api.ExecRequest) (*api.Session, error) {
	req.Detachable = true
	if err := checkBuffer(req); err != nil {
		return nil, err
	}
	c, err := g.sessionCall(ctx, ref, "")
	if err != nil {
		return nil, err
	}
	defer c.End()
	s, err := c.Agent.CreateSession(c.Ctx, sessionRequest(c.Sandbox, req))
	if err != nil {
		return nil, g.sessionError(c.Ctx, c.Sandbox, "", err, "")
	}
	if err := checkAnswer(c.Sandbox, s); err != nil {
		return nil, err
	}
	return s, nil
}

// ListSessions lists a sandbox's sessions: running ones and the newest
// exited ones, oldest first.
func (g *Guest) ListSessions(ctx context.Context, ref string) ([]api.Session, error) {
	c, err := g.sessionCall(ctx, ref, "")
	if err != nil {
		return nil, err
	}
	defer c.End()
	ss, err := c.Agent.ListSessions(c.Ctx)
	if err != nil {
		return nil, g.sessionError(c.Ctx, c.Sandbox, "", err, "")
	}
	if ss == nil {
		ss = []api.Session{}
	}
	for i := range ss {
		if err := checkAnswer(c.Sandbox, &ss[i]); err != nil {
			return nil, err
		}
	}
	return ss, nil
}

// GetSession returns one session of a sandbox.
func (g *Guest) GetSession(ctx context.Context, ref, id string) (*api.Session, error) {
	c, err := g.sessionCall(ctx, ref, id)
	if err != nil {
		return nil, err
	}
	defer c.End()
	s, err := c.Agent.GetSession(c.Ctx, id)
	if err != nil {
		return nil, g.sessionError(c.Ctx, c.Sandbox, id, err, "")
	}
	if err := checkAnswer(c.Sandbox, s); err != nil {
		return nil, err
	}
	return s, nil
}

// WaitSession waits until a session has exited and returns it, or until
// ctx is done. A memory checkpoint or a restore of the sandbox ends the
// wait as it ends streams, with an unavailable error: the caller waits
// again.
func (g *Guest) WaitSession(ctx context.Context, ref, id string) (*api.Session, error) {
	c, err := g.sessionCall(ctx, ref, id)
	if err != nil {
		return nil, err
	}
	defer c.End()
	sb := c.Sandbox
	// A stream with no socket: the core ends it as it ends the others.
	st := c.Stream(nil, nil)
	defer st.Close()
	ctx, cancel := context.WithCancel(c.Ctx)
	defer cancel()
	stop := context.AfterFunc(st.Context(), cancel)
	defer stop()
	s, err := c.Agent.WaitSession(ctx, id)
	if err != nil {
		st.Broke()
	}
	if r := st.Reason(); r != "" && err != nil {
		return nil, api.Errorf(api.CodeUnavailable, "waiting for session %s of %s: %s; wait again", id, sb.Name, r)
	}
	if err != nil {
		return nil, g.sessionError(ctx, sb, id, err, "")
	}
	if err := checkAnswer(sb, s); err != nil {
		return nil, err
	}
	return s, nil
}

// SignalSession sends a signal to a session's whole process group.
func (g *Guest) SignalSession(ctx context.Context, ref, id string, req api.SignalSession) error {
	if req.Signal == "" {
		return api.Errorf(api.CodeInvalid, `signal: give a signal name such as "TERM"`)
	}
	c, err := g.sessionCall(ctx, ref, id)
	if err != nil {
		return err
	}
	defer c.End()
	if err := c.Agent.SignalSession(c.Ctx, id, req.Signal); err != nil {
		return g.sessionError(c.Ctx, c.Sandbox, id, err, "has exited")
	}
	return nil
}

// DeleteSession kills a session's whole process tree, children included,
// and forgets it.
func (g *Guest) DeleteSession(ctx context.Context, ref, id string) error {
	c, err := g.sessionCall(ctx, ref, id)
	if err != nil {
		return err
	}
	defer c.End()
	if err := c.Agent.DeleteSession(c.Ctx, id); err != nil {
		return g.sessionError(c.Ctx, c.Sandbox, id, err, "")
	}
	return nil
}

// checkOffsets refuses a negative byte offset of an attach or a log.
func checkOffsets(p api.AttachParams) error {
	for _, off := range []*int64{p.Offset, p.StderrOffset} {
		if off != nil && *off < 0 {
			return api.Errorf(api.CodeInvalid, "offset: a byte offset is 0 or more")
		}
	}
	return nil
}

// AttachSession opens an attach socket to a detachable session (see
// api/session.go) and returns it as a Stream for the caller to proxy, as
// Exec does. It fails, before the caller has upgraded its client, when the
// session is not there or not detachable.
func (g *Guest) AttachSession(ctx context.Context, ref, id string, p api.AttachParams) (*sandbox.Stream, error) {
	c, err := g.sessionCall(ctx, ref, id)
	if err != nil {
		return nil, err
	}
	defer c.End()
	if err := checkOffsets(p); err != nil {
		return nil, err
	}
	conn, err := c.Agent.DialAttach(c.Ctx, id, p)
	if err != nil {
		return nil, g.sessionError(c.Ctx, c.Sandbox, id, err, "is not detachable: its output went only to the socket that started it")
	}
	conn.SetReadLimit(agentconn.MessageLimit)
	return c.Stream(conn, agentconn.Control), nil
}
