package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/sandbox"
)

// Sandboxes is what the server needs of the sandbox manager.
type Sandboxes interface {
	Create(ctx context.Context, req api.CreateSandbox) (*api.Sandbox, error)
	List(ctx context.Context, labels map[string]string) ([]api.Sandbox, error)
	Get(ctx context.Context, ref string) (*api.Sandbox, error)
	Delete(ctx context.Context, ref string) error
	// Update changes the settings a sandbox may change while it lives.
	Update(ctx context.Context, ref string, req api.UpdateSandbox) (*api.Sandbox, error)
	CheckExec(ctx context.Context, ref string) (*api.Sandbox, error)
	Exec(ctx context.Context, ref string, req api.ExecRequest) (*sandbox.Stream, error)
	// AccessToken is a sandbox's URL and the token that opens it; only the
	// owner's API offers it, never the in-sandbox one.
	AccessToken(ctx context.Context, ref string) (*api.AccessToken, error)
	Sleep(ctx context.Context, ref string) (*api.Sandbox, error)
	Wake(ctx context.Context, ref string) (*api.Sandbox, error)
	Checkpoints
	Files
	Sessions
	Services
	Ports
	Network
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSandbox
	if err := decode(w, r, &req); err != nil {
		return err
	}
	sb, err := s.sandboxes.Create(r.Context(), req)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusCreated, sb)
	return nil
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	labels, err := labelFilter(r.URL.Query()["label"])
	if err != nil {
		return err
	}
	sbs, err := s.sandboxes.List(r.Context(), labels)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, api.SandboxList{Sandboxes: sbs})
	return nil
}

// labelFilter reads the label=key=value filters of a list. They follow the
// rules of labels themselves, so a filter that no sandbox could match is a
// mistake, and there can be no more of them than a sandbox can have labels:
// each one costs the store a condition.
func labelFilter(filters []string) (map[string]string, error) {
	if len(filters) > api.MaxLabels {
		return nil, api.Errorf(api.CodeInvalid, "label: %d filters; at most %d (a sandbox has at most %d labels)", len(filters), api.MaxLabels, api.MaxLabels)
	}
	labels := make(map[string]string, len(filters))
	for _, l := range filters {
		k, v, ok := strings.Cut(l, "=")
		switch {
		case !ok || k == "":
			return nil, api.Errorf(api.CodeInvalid, "label: %q is not key=value", l)
		case !api.ValidLabelKey(k):
			return nil, api.Errorf(api.CodeInvalid, "label: key %q: %s", k, api.LabelKeyRule)
		case !api.ValidLabelValue(v):
			return nil, api.Errorf(api.CodeInvalid, "label: the value of %s: %s", k, api.LabelValueRule)
		}
		if prev, ok := labels[k]; ok && prev != v {
			// A sandbox has one value per key: no sandbox would match.
			return nil, api.Errorf(api.CodeInvalid, "label: %s is given twice, as %q and %q", k, prev, v)
		}
		labels[k] = v
	}
	return labels, nil
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandboxes.Get(r.Context(), r.PathValue("sandbox"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, sb)
	return nil
}

func (s *Server) updateSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.UpdateSandbox
	if err := decode(w, r, &req); err != nil {
		return err
	}
	sb, err := s.sandboxes.Update(r.Context(), r.PathValue("sandbox"), req)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, sb)
	return nil
}

func (s *Server) accessToken(w http.ResponseWriter, r *http.Request) error {
	at, err := s.sandboxes.AccessToken(r.Context(), r.PathValue("sandbox"))
	if err != nil {
		return err
	}
	w.Header().Set("Cache-Control", "no-store")
	api.WriteJSON(w, http.StatusOK, at)
	return nil
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	if err := s.sandboxes.Delete(r.Context(), r.PathValue("sandbox")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// exec upgrades to the exec WebSocket (see api/exec.go). Refusals that can be
// known before the upgrade are HTTP errors: first those about the sandbox (a
// sandbox that does not exist is 404 however it is asked for), then those
// about the handshake (426 without the upgrade).
func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("sandbox")
	if _, err := s.sandboxes.CheckExec(r.Context(), ref); err != nil {
		return err
	}
	hw := &handshakeWriter{ResponseWriter: w}
	c, err := websocket.Accept(hw, r, acceptOptions)
	if err != nil {
		return hw.refusal()
	}
	defer c.CloseNow()
	// What the client sends is held here one message at a time, so the
	// limit is what each socket may cost the daemon; the agent takes no
	// more anyway.
	c.SetReadLimit(api.MaxExecMessage)
	ctx := r.Context()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	typ, first, err := c.Read(rctx)
	cancel()
	if err != nil {
		return nil
	}
	req, err := execRequest(typ, first)
	if err != nil {
		sendExecError(ctx, c, err)
		return nil
	}
	st, err := s.sandboxes.Exec(ctx, ref, req)
	if err != nil {
		var ae *api.Error
		if (!errors.As(err, &ae) || ae.Code == api.CodeUnavailable) && ctx.Err() == nil {
			s.log.Error("exec failed", "request_id", RequestID(ctx), "sandbox", ref, "err", err)
		}
		sendExecError(ctx, c, err)
		return nil
	}
	proxyStream(ctx, c, st, s.writeTimeout)
	return nil
}

// execRequest reads the first message of an exec socket: the request, or
// an invalid error that says what is wrong with it.
func execRequest(typ websocket.MessageType, first []byte) (api.ExecRequest, error) {
	var req api.ExecRequest
	if typ != websocket.MessageText {
		return req, api.Errorf(api.CodeInvalid, "exec: the first message must be a JSON text message")
	}
	if err := decodeJSON(bytes.NewReader(first), &req); err != nil {
		return req, decodeError(err, &req)
	}
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return req, api.Errorf(api.CodeInvalid, "cmd: give the command to run")
	}
	return req, nil
}

// sendExecError tells an exec client why its command cannot run, in an
// "error" message, and closes the socket normally.
func sendExecError(ctx context.Context, c *websocket.Conn, err error) {
	var ae *api.Error
	if !errors.As(err, &ae) {
		ae = api.Errorf(api.CodeInternal, "internal error (request id %s)", RequestID(ctx))
	}
	b, _ := json.Marshal(api.ExecControl{Type: api.ExecError, Error: ae})
	_ = c.Write(ctx, websocket.MessageText, b)
	c.Close(websocket.StatusNormalClosure, "")
}

// handshakeWriter holds back the error websocket.Accept answers a bad
// handshake with, in plain text, so that exec can answer with the API's
// JSON error instead. The upgrade itself goes through.
type handshakeWriter struct {
	http.ResponseWriter
	sent   bool // a status went through
	status int  // the error status held back; 0 if none
	msg    strings.Builder
}

func (w *handshakeWriter) WriteHeader(status int) {
	if status >= 400 && !w.sent {
		w.status = status
		return
	}
	w.sent = true
	w.ResponseWriter.WriteHeader(status)
}

func (w *handshakeWriter) Write(b []byte) (int, error) {
	if w.status != 0 {
		return w.msg.Write(b)
	}
	w.sent = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets Accept reach the connection to hijack it.
func (w *handshakeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// refusal is the error that was held back, as an *api.Error; nil when
// Accept failed after the answer was on its way.
func (w *handshakeWriter) refusal() error {
	msg := strings.TrimSpace(w.msg.String())
	switch {
	case w.status == 0:
		return nil
	case w.status == http.StatusUpgradeRequired:
		// Accept has set Upgrade: websocket (and Connection: Upgrade).
		return api.Errorf(api.CodeUpgradeRequired, "exec is a WebSocket endpoint: connect with a WebSocket client (%s)", msg)
	case w.status == http.StatusMethodNotAllowed:
		w.Header().Set("Allow", "GET")
	}
	return api.Errorf(api.CodeForStatus(w.status), "exec: %s", msg)
}

// sleepSandbox puts a sandbox to sleep now (POST …/sleep).
func (s *Server) sleepSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandboxes.Sleep(r.Context(), r.PathValue("sandbox"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, sb)
	return nil
}

// wakeSandbox wakes a sleeping sandbox (POST …/wake).
func (s *Server) wakeSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandboxes.Wake(r.Context(), r.PathValue("sandbox"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, sb)
	return nil
}
