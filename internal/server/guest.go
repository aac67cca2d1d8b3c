package server

import (
	"context"
	"log/slog"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/sandbox"
)

// Guest is what the server needs of the sandbox manager to reach inside a
// running sandbox: exec, and the guest's files, sessions, services and
// ports.
type Guest interface {
	// CheckExec checks that a command can run now; the sandbox stays
	// active until release.
	CheckExec(ctx context.Context, ref string) (_ *api.Sandbox, release func(), err error)
	Exec(ctx context.Context, ref string, req api.ExecRequest) (*sandbox.Stream, error)
	Files
	Sessions
	Services
	Ports
}

// guestRoutes serves what runs inside a sandbox, through its agent: exec,
// files, sessions, services and ports. Most of them stream, so they hold
// the server's write timeout.
type guestRoutes struct {
	guest Guest
	log   *slog.Logger
	// writeTimeout is the server's (see WithWriteTimeout).
	writeTimeout time.Duration
}

// register adds the guest routes with v1.
func (gr *guestRoutes) register(v1 addRoute) {
	v1("GET /v1/sandboxes/{sandbox}/exec", api.ScopeWrite, "exec.start", gr.exec)
	gr.registerFiles(v1)
	gr.registerSessions(v1)
	gr.registerServices(v1)
	gr.registerPorts(v1)
}
