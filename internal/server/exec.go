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

// exec upgrades to the exec WebSocket (see api/exec.go). Refusals that can be
// known before the upgrade are HTTP errors: first those about the sandbox (a
// sandbox that does not exist is 404 however it is asked for), then those
// about the handshake (426 without the upgrade).
func (gr *guestRoutes) exec(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("sandbox")
	_, release, err := gr.guest.CheckExec(r.Context(), ref)
	if err != nil {
		return err
	}
	// Active until the exec has its stream (and for as long as it runs):
	// a sandbox this check woke does not fall asleep while the client
	// sends its command.
	defer release()
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
	st, err := gr.guest.Exec(ctx, ref, req)
	if err != nil {
		var ae *api.Error
		if (!errors.As(err, &ae) || ae.Code == api.CodeUnavailable) && ctx.Err() == nil {
			gr.log.Error("exec failed", "request_id", RequestID(ctx), "sandbox", ref, "err", err)
		}
		sendExecError(ctx, c, err)
		return nil
	}
	proxyStream(ctx, c, st, gr.writeTimeout)
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
