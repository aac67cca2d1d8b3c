package sandbox

import (
	"context"
	"errors"
	"maps"
	"net/http"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/store"
)

// sessionsProtocol is the first agent protocol with exec sessions.
const sessionsProtocol = 3

// Exec sessions (api/session.go) live in the sandbox's agent, which owns
// their processes and output: the Manager only routes calls to it, checks
// that the agent is new enough, and turns the agent's answers, which are
// the sandbox's word, into the API's own. A memory checkpoint ends attach
// sockets and waits like every stream, and leaves detachable sessions
// running; they come back with the memory of a restore or a fork.

// sessionAgent finds the agent of a running sandbox that has sessions.
func (m *Manager) sessionAgent(ctx context.Context, ref string) (*store.Sandbox, *agent.Client, error) {
	sb, err := m.awake(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	if err := requireState(sb.Name, sb.State, api.StateRunning); err != nil {
		return nil, nil, err
	}
	if err := m.requireAgent(sb, sessionsProtocol, "sessions"); err != nil {
		return nil, nil, err
	}
	ep, err := m.Endpoint(sb)
	if err != nil {
		return nil, nil, err
	}
	return sb, m.callClient(sb, ep), nil
}

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

// sessionError is err, from a call to the agent about session id ("" for
// none), as the API shows it. The agent's status picks among the answers
// loam expects of it, each in loam's words (conflict names what a 409 means
// for the call); an agent's refusal of a command it could not start keeps
// its text, as on exec (see agentControl); anything else the agent says is
// its own failure, and a call that got no answer is unavailable.
func (m *Manager) sessionError(sb *store.Sandbox, id string, err error, conflict string) error {
	var ae *agent.Error
	if !errors.As(err, &ae) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		m.log.Warn("calling agent", "sandbox", sb.ID, "session", id, "err", err)
		return api.Errorf(api.CodeUnavailable, "the sandbox's agent does not answer")
	}
	switch {
	case ae.Status == http.StatusNotFound && id != "":
		return noSession(sb, id)
	case ae.Status == http.StatusConflict && conflict != "":
		return api.Errorf(api.CodeConflict, "session %s of %s %s", id, sb.Name, conflict)
	case ae.Status/100 == 4 && agentErrorCodes[api.Code(ae.Code)]:
		return api.Errorf(api.Code(ae.Code), "%s", ae.Message)
	}
	return publicError(err)
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

// CreateSession starts a detachable session with no socket attached.
func (m *Manager) CreateSession(ctx context.Context, ref string, req api.ExecRequest) (*api.Session, error) {
	req.Detachable = true
	if err := checkBuffer(req); err != nil {
		return nil, err
	}
	sb, ac, err := m.sessionAgent(ctx, ref)
	if err != nil {
		return nil, err
	}
	s, err := ac.CreateSession(ctx, sessionRequest(sb, req))
	if err != nil {
		return nil, m.sessionError(sb, "", err, "")
	}
	if err := checkAnswer(sb, s); err != nil {
		return nil, err
	}
	return s, nil
}

// ListSessions lists a sandbox's sessions: running ones and the newest
// exited ones, oldest first.
func (m *Manager) ListSessions(ctx context.Context, ref string) ([]api.Session, error) {
	sb, ac, err := m.sessionAgent(ctx, ref)
	if err != nil {
		return nil, err
	}
	ss, err := ac.ListSessions(ctx)
	if err != nil {
		return nil, m.sessionError(sb, "", err, "")
	}
	if ss == nil {
		ss = []api.Session{}
	}
	for i := range ss {
		if err := checkAnswer(sb, &ss[i]); err != nil {
			return nil, err
		}
	}
	return ss, nil
}

// GetSession returns one session of a sandbox.
func (m *Manager) GetSession(ctx context.Context, ref, id string) (*api.Session, error) {
	sb, ac, err := m.sessionAgent(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := checkSessionID(sb, id); err != nil {
		return nil, err
	}
	s, err := ac.GetSession(ctx, id)
	if err != nil {
		return nil, m.sessionError(sb, id, err, "")
	}
	if err := checkAnswer(sb, s); err != nil {
		return nil, err
	}
	return s, nil
}

// WaitSession waits until a session has exited and returns it, or until
// ctx is done. A memory checkpoint or a restore of the sandbox ends the
// wait as it ends streams, with an unavailable error: the caller waits
// again.
func (m *Manager) WaitSession(ctx context.Context, ref, id string) (*api.Session, error) {
	sb, ac, err := m.sessionAgent(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := checkSessionID(sb, id); err != nil {
		return nil, err
	}
	// A stream with no socket: the Manager ends it as it ends the others.
	st := newStream(nil, nil)
	m.addStream(sb.ID, st)
	defer st.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(st.ctx, cancel)
	defer stop()
	s, err := ac.WaitSession(ctx, id)
	if err != nil {
		st.Broke()
	}
	if r := st.Reason(); r != "" && err != nil {
		return nil, api.Errorf(api.CodeUnavailable, "waiting for session %s of %s: %s; wait again", id, sb.Name, r)
	}
	if err != nil {
		return nil, m.sessionError(sb, id, err, "")
	}
	if err := checkAnswer(sb, s); err != nil {
		return nil, err
	}
	return s, nil
}

// SignalSession sends a signal to a session's whole process group.
func (m *Manager) SignalSession(ctx context.Context, ref, id string, req api.SignalSession) error {
	if req.Signal == "" {
		return api.Errorf(api.CodeInvalid, `signal: give a signal name such as "TERM"`)
	}
	sb, ac, err := m.sessionAgent(ctx, ref)
	if err != nil {
		return err
	}
	if err := checkSessionID(sb, id); err != nil {
		return err
	}
	if err := ac.SignalSession(ctx, id, req.Signal); err != nil {
		return m.sessionError(sb, id, err, "has exited")
	}
	return nil
}

// DeleteSession kills a session's whole process tree, children included,
// and forgets it.
func (m *Manager) DeleteSession(ctx context.Context, ref, id string) error {
	sb, ac, err := m.sessionAgent(ctx, ref)
	if err != nil {
		return err
	}
	if err := checkSessionID(sb, id); err != nil {
		return err
	}
	if err := ac.DeleteSession(ctx, id); err != nil {
		return m.sessionError(sb, id, err, "")
	}
	return nil
}

// AttachSession opens an attach socket to a detachable session (see
// api/session.go) and returns it as a Stream for the caller to proxy, as Exec does. It
// fails, before the caller has upgraded its client, when the session is
// not there or not detachable.
func (m *Manager) AttachSession(ctx context.Context, ref, id string, p api.AttachParams) (*Stream, error) {
	sb, ac, err := m.sessionAgent(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := checkSessionID(sb, id); err != nil {
		return nil, err
	}
	for _, off := range []*int64{p.Offset, p.StderrOffset} {
		if off != nil && *off < 0 {
			return nil, api.Errorf(api.CodeInvalid, "offset: a byte offset is 0 or more")
		}
	}
	conn, err := ac.DialAttach(ctx, id, p)
	if err != nil {
		return nil, m.sessionError(sb, id, err, "is not detachable: its output went only to the socket that started it")
	}
	conn.SetReadLimit(agentMessageLimit)
	st := newStream(conn, agentControl)
	m.addStream(sb.ID, st)
	return st, nil
}

// requireDetachable refuses a detachable exec on an agent older than
// sessions, and a buffer size with nothing to act on it.
func (m *Manager) requireDetachable(sb *store.Sandbox, req api.ExecRequest) error {
	if err := checkBuffer(req); err != nil {
		return err
	}
	if req.Detachable {
		if err := m.requireAgent(sb, sessionsProtocol, "a detachable exec"); err != nil {
			return err
		}
	}
	return nil
}
