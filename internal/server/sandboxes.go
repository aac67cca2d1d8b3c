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
)

// Sandboxes is what the server needs of the sandbox manager.
type Sandboxes interface {
	Templates(ctx context.Context) []api.Template
	Create(ctx context.Context, req api.CreateSandbox) (*api.Sandbox, error)
	List(ctx context.Context, labels map[string]string) ([]api.Sandbox, error)
	Get(ctx context.Context, ref string) (*api.Sandbox, error)
	Delete(ctx context.Context, ref string) error
	CheckExec(ctx context.Context, ref string) (*api.Sandbox, error)
	Exec(ctx context.Context, ref string, req api.ExecRequest, client *websocket.Conn) error
	Checkpoints
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, api.TemplateList{Templates: s.sandboxes.Templates(r.Context())})
	return nil
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
	writeJSON(w, http.StatusCreated, sb)
	return nil
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	labels := map[string]string{}
	for _, l := range r.URL.Query()["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return api.Errorf(api.CodeInvalid, "label: %q is not key=value", l)
		}
		labels[k] = v
	}
	sbs, err := s.sandboxes.List(r.Context(), labels)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, api.SandboxList{Sandboxes: sbs})
	return nil
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandboxes.Get(r.Context(), r.PathValue("sandbox"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sb)
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
// known before the upgrade are plain HTTP errors.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("sandbox")
	if _, err := s.sandboxes.CheckExec(r.Context(), ref); err != nil {
		return err
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return nil // Accept has answered already.
	}
	defer c.CloseNow()
	c.SetReadLimit(32 << 20)
	ctx := r.Context()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	typ, first, err := c.Read(rctx)
	cancel()
	if err != nil {
		return nil
	}
	var req api.ExecRequest
	dec := json.NewDecoder(bytes.NewReader(first))
	dec.DisallowUnknownFields()
	if typ != websocket.MessageText {
		err = api.Errorf(api.CodeInvalid, "exec: the first message must be a JSON text message")
	} else if derr := dec.Decode(&req); derr != nil {
		err = decodeError(derr)
	} else if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		err = api.Errorf(api.CodeInvalid, "cmd: give the command to run")
	}
	if err != nil {
		sendExecError(ctx, c, err)
		return nil
	}
	if err := s.sandboxes.Exec(ctx, ref, req, c); err != nil {
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code == api.CodeUnavailable {
			s.log.Error("exec failed", "request_id", RequestID(ctx), "sandbox", ref, "err", err)
		}
		sendExecError(ctx, c, err)
	}
	return nil
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
