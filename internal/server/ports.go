package server

import (
	"context"
	"net/http"
	"strconv"
	"strings"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/sandbox"
)

// Ports is what the server needs of the sandbox manager for a sandbox's
// TCP ports (see api/ports.go). Watches and port streams are Streams that
// the manager ends, with a reason, before a memory checkpoint or a restore.
type Ports interface {
	// CheckPorts checks that a sandbox's ports can be reached now.
	CheckPorts(ctx context.Context, ref string) error
	// ListPorts lists the TCP ports something in a sandbox listens on.
	ListPorts(ctx context.Context, ref string) ([]api.Port, error)
	// WatchPorts opens a watch whose text messages are api.PortEvent.
	WatchPorts(ctx context.Context, ref string) (*sandbox.Stream, error)
	// DialPort opens a stream carrying one TCP connection to port.
	DialPort(ctx context.Context, ref string, port int) (*sandbox.Stream, error)
}

// portMessageLimit bounds one message from a client's port stream, which
// should be at most api.MaxPortMessage (the Go SDK's DialPort splits its
// writes); a little more is let through.
const portMessageLimit = 4 * api.MaxPortMessage

// registerPorts adds the port routes with v1.
func (gr *guestRoutes) registerPorts(v1 addRoute) {
	v1("GET /v1/sandboxes/{sandbox}/ports", api.ScopeRead, "", gr.listPorts)
	v1("GET /v1/sandboxes/{sandbox}/ports/watch", api.ScopeRead, "", gr.watchPorts)
	v1("GET /v1/sandboxes/{sandbox}/ports/{port}/stream", api.ScopeWrite, "", gr.portStream)
}

func (gr *guestRoutes) listPorts(w http.ResponseWriter, r *http.Request) error {
	ps, err := gr.guest.ListPorts(r.Context(), r.PathValue("sandbox"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, api.PortList{Ports: ps})
	return nil
}

// watchPorts upgrades to a port watch. As with exec, refusals about the
// sandbox come first, then those about the handshake.
func (gr *guestRoutes) watchPorts(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("sandbox")
	if err := gr.guest.CheckPorts(r.Context(), ref); err != nil {
		return err
	}
	if err := wantUpgrade(w, r, "ports/watch"); err != nil {
		return err
	}
	st, err := gr.guest.WatchPorts(r.Context(), ref)
	if err != nil {
		return err
	}
	return gr.proxyPorts(w, r, st, "ports/watch")
}

// portStream upgrades to a port stream. The connection to the port is made
// before the upgrade, so that a port nothing listens on is a plain 404.
func (gr *guestRoutes) portStream(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("sandbox")
	if err := gr.guest.CheckPorts(r.Context(), ref); err != nil {
		return err
	}
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > api.MaxPort {
		return api.Errorf(api.CodeInvalid, "port %q: give a TCP port, 1 to %d", r.PathValue("port"), api.MaxPort)
	}
	if err := wantUpgrade(w, r, "ports/{port}/stream"); err != nil {
		return err
	}
	st, err := gr.guest.DialPort(r.Context(), ref, port)
	if err != nil {
		return err
	}
	return gr.proxyPorts(w, r, st, "ports/{port}/stream")
}

// wantUpgrade refuses, before anything is opened in the sandbox, a request
// to a WebSocket endpoint (what) that does not ask for the upgrade.
func wantUpgrade(w http.ResponseWriter, r *http.Request, what string) error {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		w.Header().Set("Connection", "Upgrade")
		w.Header().Set("Upgrade", "websocket")
		return api.Errorf(api.CodeUpgradeRequired, "%s is a WebSocket endpoint: connect with a WebSocket client", what)
	}
	return nil
}

// proxyPorts accepts the client's socket and proxies st to it; st is
// closed whatever happens.
func (gr *guestRoutes) proxyPorts(w http.ResponseWriter, r *http.Request, st *sandbox.Stream, what string) error {
	hw := &handshakeWriter{ResponseWriter: w}
	c, err := websocket.Accept(hw, r, acceptOptions)
	if err != nil {
		st.Close()
		if hw.status == 0 {
			return nil
		}
		return api.Errorf(api.CodeForStatus(hw.status), "%s: %s", what, strings.TrimSpace(hw.msg.String()))
	}
	defer c.CloseNow()
	c.SetReadLimit(portMessageLimit)
	proxyStream(r.Context(), c, st, gr.writeTimeout)
	return nil
}
