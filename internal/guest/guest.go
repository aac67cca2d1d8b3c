// Package guest is the guest data plane: every call a user makes into a
// running sandbox (exec, sessions, services, files, watches, ports) is
// relayed here to the sandbox's agent. Each relay is thin: it checks the
// request, begins the call through the core's one entry point
// (sandbox.Manager.Relay, which wakes the sandbox and applies its holds
// and checkpoints), calls the agent, checks what the agent answered (the
// sandbox is not trusted), and turns its errors into the API's through
// the one mapper (agentconn.Map).
package guest

import (
	"context"
	"log/slog"

	"loam.dev/loam/internal/sandbox"
)

// Core is what the guest data plane needs of the sandbox core
// (sandbox.GuestCore has it).
type Core interface {
	// Relay begins a call to the agent of running sandbox ref (woken if
	// it sleeps), whose agent serves need; the caller ends it.
	Relay(ctx context.Context, ref string, need sandbox.Need) (*sandbox.Call, error)
	// AgentPort is the agent's own TCP port inside every sandbox.
	AgentPort() int
}

// Guest relays users' calls to sandboxes' agents. It holds no state of
// its own: what lives per sandbox (calls, streams, spare sockets) is the
// core's.
type Guest struct {
	core Core
	log  *slog.Logger
}

// New makes the guest data plane over core.
func New(core Core, log *slog.Logger) *Guest {
	return &Guest{core: core, log: log}
}
