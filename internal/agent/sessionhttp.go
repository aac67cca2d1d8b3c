package agent

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// The session endpoints of the agent's API.

func (h *handler) serveSessionCreate(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxClientMessage)).Decode(&req); err != nil {
		api.WriteError(w, api.Errorf(api.CodeInvalid, "the body must be an exec request"))
		return
	}
	if err := checkRequest(&req); err != nil {
		api.WriteError(w, err)
		return
	}
	c, err := h.prepare(&req)
	if err != nil {
		h.sessionError(w, err)
		return
	}
	ss, err := h.sessions.start(h, c, &req)
	if err != nil {
		h.sessionError(w, err)
		return
	}
	api.WriteJSON(w, http.StatusCreated, ss.view())
}

// sessionError answers with err, logging causes that are not the client's.
func (h *handler) sessionError(w http.ResponseWriter, err error) {
	var e *api.Error
	if !errors.As(err, &e) {
		h.log.Warn("session failed", "err", err)
	}
	api.WriteError(w, err)
}

func (h *handler) serveSessionList(w http.ResponseWriter, r *http.Request) {
	api.WriteJSON(w, http.StatusOK, api.SessionList{Sessions: h.sessions.all()})
}

func (h *handler) serveSessionGet(w http.ResponseWriter, r *http.Request) {
	ss, err := h.sessions.get(r.PathValue("session"))
	if err != nil {
		api.WriteError(w, err)
		return
	}
	api.WriteJSON(w, http.StatusOK, ss.view())
}

func (h *handler) serveSessionWait(w http.ResponseWriter, r *http.Request) {
	ss, err := h.sessions.get(r.PathValue("session"))
	if err != nil {
		api.WriteError(w, err)
		return
	}
	select {
	case <-ss.done:
	case <-r.Context().Done():
		return
	}
	api.WriteJSON(w, http.StatusOK, ss.view())
}

func (h *handler) serveSessionSignal(w http.ResponseWriter, r *http.Request) {
	ss, err := h.sessions.get(r.PathValue("session"))
	if err != nil {
		api.WriteError(w, err)
		return
	}
	var req api.SignalSession
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil {
		api.WriteError(w, api.Errorf(api.CodeInvalid, `the body must be {"signal":"…"}`))
		return
	}
	sig := signalByName(req.Signal)
	if sig == 0 {
		api.WriteError(w, api.Errorf(api.CodeInvalid, "signal %q: not a signal name or number", req.Signal))
		return
	}
	if err := ss.signal(sig); err != nil {
		h.sessionError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) serveSessionDelete(w http.ResponseWriter, r *http.Request) {
	ss, err := h.sessions.get(r.PathValue("session"))
	if err != nil {
		api.WriteError(w, err)
		return
	}
	h.sessions.remove(ss)
	ss.log.Info("session deleted")
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) serveSessionAttach(w http.ResponseWriter, r *http.Request) {
	ss, err := h.sessions.get(r.PathValue("session"))
	if err != nil {
		api.WriteError(w, err)
		return
	}
	if !ss.detachable {
		api.WriteError(w, api.Errorf(api.CodeConflict, "session %s is not detachable: its output goes only to the socket that started it", ss.id))
		return
	}
	from, err := parseAttachFrom(r.URL.Query())
	if err != nil {
		api.WriteError(w, err)
		return
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return
	}
	defer conn.CloseNow()
	conn.SetReadLimit(maxClientMessage)
	ss.attach(r.Context(), conn, from)
}
