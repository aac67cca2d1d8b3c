package server

import (
	"context"
	"net/http"
	"strconv"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/sandbox"
)

// Sessions is what the server needs of the sandbox manager for exec
// sessions (api/session.go).
type Sessions interface {
	CreateSession(ctx context.Context, sandbox string, req api.ExecRequest) (*api.Session, error)
	ListSessions(ctx context.Context, sandbox string) ([]api.Session, error)
	GetSession(ctx context.Context, sandbox, id string) (*api.Session, error)
	// WaitSession returns the session once it has exited, or fails when
	// ctx ends first.
	WaitSession(ctx context.Context, sandbox, id string) (*api.Session, error)
	SignalSession(ctx context.Context, sandbox, id string, req api.SignalSession) error
	DeleteSession(ctx context.Context, sandbox, id string) error
	// AttachSession opens an attach socket to the session's agent.
	AttachSession(ctx context.Context, sandbox, id string, p api.AttachParams) (*sandbox.Stream, error)
}

// registerSessions adds the session routes with v1.
func (gr *guestRoutes) registerSessions(v1 addRoute) {
	v1("POST /v1/sandboxes/{sandbox}/sessions", api.ScopeWrite, "session.create", gr.createSession)
	v1("GET /v1/sandboxes/{sandbox}/sessions", api.ScopeRead, "", gr.listSessions)
	v1("GET /v1/sandboxes/{sandbox}/sessions/{session}", api.ScopeRead, "", gr.getSession)
	v1("DELETE /v1/sandboxes/{sandbox}/sessions/{session}", api.ScopeWrite, "session.delete", gr.deleteSession)
	v1("GET /v1/sandboxes/{sandbox}/sessions/{session}/attach", api.ScopeWrite, "", gr.attachSession)
	v1("POST /v1/sandboxes/{sandbox}/sessions/{session}/wait", api.ScopeWrite, "", gr.waitSession)
	v1("POST /v1/sandboxes/{sandbox}/sessions/{session}/signal", api.ScopeWrite, "session.signal", gr.signalSession)
}

func (gr *guestRoutes) createSession(w http.ResponseWriter, r *http.Request) error {
	var req api.ExecRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return api.Errorf(api.CodeInvalid, "cmd: give the command to run")
	}
	ss, err := gr.guest.CreateSession(r.Context(), r.PathValue("sandbox"), req)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusCreated, ss)
	return nil
}

func (gr *guestRoutes) listSessions(w http.ResponseWriter, r *http.Request) error {
	ss, err := gr.guest.ListSessions(r.Context(), r.PathValue("sandbox"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, api.SessionList{Sessions: ss})
	return nil
}

func (gr *guestRoutes) getSession(w http.ResponseWriter, r *http.Request) error {
	ss, err := gr.guest.GetSession(r.Context(), r.PathValue("sandbox"), r.PathValue("session"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, ss)
	return nil
}

func (gr *guestRoutes) waitSession(w http.ResponseWriter, r *http.Request) error {
	ss, err := gr.guest.WaitSession(r.Context(), r.PathValue("sandbox"), r.PathValue("session"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, ss)
	return nil
}

func (gr *guestRoutes) signalSession(w http.ResponseWriter, r *http.Request) error {
	var req api.SignalSession
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if err := gr.guest.SignalSession(r.Context(), r.PathValue("sandbox"), r.PathValue("session"), req); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (gr *guestRoutes) deleteSession(w http.ResponseWriter, r *http.Request) error {
	if err := gr.guest.DeleteSession(r.Context(), r.PathValue("sandbox"), r.PathValue("session")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// offsetParam reads an optional byte offset from the query.
func offsetParam(r *http.Request, name string) (*int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return nil, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return nil, api.Errorf(api.CodeInvalid, "%s: %q is not a byte offset (0 or more)", name, v)
	}
	return &n, nil
}

// attachSession upgrades to an attach socket (see api/session.go). As with
// exec, what can be refused before the upgrade is an HTTP error: the
// sandbox, the session, then the handshake.
func (gr *guestRoutes) attachSession(w http.ResponseWriter, r *http.Request) error {
	p, err := attachParams(r)
	if err != nil {
		return err
	}
	st, err := gr.guest.AttachSession(r.Context(), r.PathValue("sandbox"), r.PathValue("session"), p)
	if err != nil {
		return err
	}
	return gr.acceptStream(w, r, st)
}

// attachParams reads where an attach socket (or a service's logs) starts:
// offset and stderr_offset (stderr's defaults to offset), and follow.
func attachParams(r *http.Request) (api.AttachParams, error) {
	stdout, err := offsetParam(r, "offset")
	if err != nil {
		return api.AttachParams{}, err
	}
	stderr, err := offsetParam(r, "stderr_offset")
	if err != nil {
		return api.AttachParams{}, err
	}
	if stderr == nil {
		stderr = stdout
	}
	p := api.AttachParams{Offset: stdout, StderrOffset: stderr}
	switch f := r.URL.Query().Get("follow"); f {
	case "", "true":
	case "false":
		p.NoFollow = true
	default:
		return p, api.Errorf(api.CodeInvalid, "follow: %q is neither true nor false", f)
	}
	return p, nil
}

// acceptStream upgrades the client's request and proxies st to it. A
// refused handshake is an HTTP error, in the API's shape.
func (gr *guestRoutes) acceptStream(w http.ResponseWriter, r *http.Request, st *sandbox.Stream) error {
	hw := &handshakeWriter{ResponseWriter: w}
	c, err := websocket.Accept(hw, r, acceptOptions)
	if err != nil {
		st.Close()
		return hw.refusal()
	}
	defer c.CloseNow()
	// What the client sends is held here one message at a time, so the
	// limit is what each socket may cost the daemon; the agent takes no
	// more anyway.
	c.SetReadLimit(api.MaxExecMessage)
	proxyStream(r.Context(), c, st, gr.writeTimeout)
	return nil
}
