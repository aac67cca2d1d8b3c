package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
)

// The service endpoints of the agent's API (see service.go).

func (h *handler) serviceRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /services", h.serveServiceList)
	mux.HandleFunc("PUT /services/{service}", h.serveServicePut)
	mux.HandleFunc("GET /services/{service}", h.serveServiceGet)
	mux.HandleFunc("DELETE /services/{service}", h.serveServiceDelete)
	mux.HandleFunc("POST /services/{service}/{action}", h.serveServiceAction)
	mux.HandleFunc("GET /services/{service}/logs", h.serveServiceLogs)
}

func (h *handler) serveServiceList(w http.ResponseWriter, r *http.Request) {
	api.WriteJSON(w, http.StatusOK, api.ServiceList{Services: h.services.all()})
}

func (h *handler) serveServicePut(w http.ResponseWriter, r *http.Request) {
	var def api.Service
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxClientMessage)).Decode(&def); err != nil {
		api.WriteError(w, api.Errorf(api.CodeInvalid, "the body must be a service definition"))
		return
	}
	name := r.PathValue("service")
	if def.Name == "" {
		def.Name = name
	}
	if def.Name != name {
		api.WriteError(w, api.Errorf(api.CodeInvalid, "name: %q is not the service of the path, %q", def.Name, name))
		return
	}
	s, created, err := h.services.put(def)
	if err != nil {
		h.sessionError(w, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	api.WriteJSON(w, status, s.view())
}

func (h *handler) serveServiceGet(w http.ResponseWriter, r *http.Request) {
	s, err := h.services.get(r.PathValue("service"))
	if err != nil {
		api.WriteError(w, err)
		return
	}
	api.WriteJSON(w, http.StatusOK, s.view())
}

func (h *handler) serveServiceDelete(w http.ResponseWriter, r *http.Request) {
	s, err := h.services.get(r.PathValue("service"))
	if err != nil {
		api.WriteError(w, err)
		return
	}
	if err := h.services.remove(s); err != nil {
		h.sessionError(w, err)
		return
	}
	s.log.Info("service deleted")
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) serveServiceAction(w http.ResponseWriter, r *http.Request) {
	s, err := h.services.get(r.PathValue("service"))
	if err != nil {
		api.WriteError(w, err)
		return
	}
	if err := h.services.act(s, r.PathValue("action")); err != nil {
		h.sessionError(w, err)
		return
	}
	api.WriteJSON(w, http.StatusOK, s.view())
}

// serveServiceLogs serves a service's logs as an attach socket without
// stdin: "offset" messages and output frames (api/exec.go), from the
// offsets asked for. With follow=false it closes normally once what was
// buffered is sent; else it follows until the client goes away or the
// service is deleted. It never sends "started" or "exit": a service's
// output goes on across its restarts.
func (h *handler) serveServiceLogs(w http.ResponseWriter, r *http.Request) {
	s, err := h.services.get(r.PathValue("service"))
	if err != nil {
		api.WriteError(w, err)
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
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	// Reading notices the client's close; nothing it sends is acted on.
	go func() {
		defer cancel()
		for {
			if _, _, err := conn.Read(ctx); err != nil {
				return
			}
		}
	}()
	var wmu sync.Mutex
	send := func(typ websocket.MessageType, b []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return conn.Write(ctx, typ, b)
	}
	var outs sync.WaitGroup
	failed := make(chan struct{}, len(s.outs))
	for _, o := range s.outs {
		off := from.stdout
		if o.stream == api.StreamStderr {
			off = from.stderr
		}
		until := int64(-1)
		if from.noFollow {
			_, until = o.ring.Bounds()
		}
		outs.Go(func() {
			if followOutput(ctx, o, off, until, send) != nil {
				failed <- struct{}{}
			}
		})
	}
	outs.Wait()
	if len(failed) == 0 && ctx.Err() == nil {
		conn.Close(websocket.StatusNormalClosure, "")
	}
}
