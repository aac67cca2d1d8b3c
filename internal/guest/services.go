package guest

import (
	"context"
	"net/http"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/agentconn"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/store"
)

// servicesProtocol is the first agent protocol with services.
const servicesProtocol = 3

// Services (api/service.go) live in the sandbox's agent, which supervises
// them and keeps their definitions on the sandbox's disk: these relays
// only route calls to it, check that the agent is new enough, and turn the
// agent's answers, which are the sandbox's word, into the API's own. Since
// definitions are on the disk, checkpoints, restores and forks need
// nothing of them: a memory one carries the services on as they ran, and
// a fresh boot (a disk-only one) makes the agent start them again.

var servicesNeed = sandbox.Need{Protocol: servicesProtocol, What: "services"}

func noService(sb *store.Sandbox, name string) error {
	return api.Errorf(api.CodeNotFound, "sandbox %s has no service %q", sb.Name, name)
}

// checkServiceName refuses a name that is not one before it goes into a
// path.
func checkServiceName(sb *store.Sandbox, name string) error {
	if !api.ValidServiceName(name) {
		return noService(sb, name)
	}
	return nil
}

// serviceError is err, from a call to the agent about service name ("" for
// none), as the API shows it (agentconn.Map). The agent answers 404 only
// for a service it does not have; a definition it cannot run (no such
// user, directory or program) is a 400 whose text is passed on, as on
// exec. Anything else the agent says is its own failure, and a call that
// got no answer is unavailable.
func (g *Guest) serviceError(ctx context.Context, sb *store.Sandbox, name string, err error) error {
	return agentconn.Map(ctx, err, func(ae *agent.Error) error {
		switch {
		case ae.Status == http.StatusNotFound && name != "":
			return noService(sb, name)
		case ae.Status == http.StatusBadRequest && api.Code(ae.Code) == api.CodeInvalid:
			return api.Errorf(api.CodeInvalid, "service %s of %s: %s", name, sb.Name, ae.Message)
		}
		return nil
	}, g.noAnswer(sb.ID, "service", name, err))
}

// checkServiceAnswer checks a service an agent answered with: it is the
// sandbox's word, passed on to clients only when it is well formed.
func checkServiceAnswer(sb *store.Sandbox, s *api.ServiceStatus) error {
	switch s.State {
	case api.ServiceStarting, api.ServiceRunning, api.ServiceBackoff, api.ServiceExited, api.ServiceStopped:
	default:
		return malformedService(sb)
	}
	if !api.ValidServiceName(s.Name) || s.PID < 0 || s.Restarts < 0 {
		return malformedService(sb)
	}
	return nil
}

func malformedService(sb *store.Sandbox) error {
	return api.Errorf(api.CodeInternal, "the sandbox's agent failed: it answered with a malformed service (sandbox %s)", sb.Name)
}

// serviceCall begins a call about service name ("" for none) of sandbox
// ref.
func (g *Guest) serviceCall(ctx context.Context, ref, name string) (*sandbox.Call, error) {
	c, err := g.core.Relay(ctx, ref, servicesNeed)
	if err != nil {
		return nil, err
	}
	if name != "" {
		if err := checkServiceName(c.Sandbox, name); err != nil {
			c.End()
			return nil, err
		}
	}
	return c, nil
}

// PutService defines (or redefines) a service of a sandbox and starts it.
// It reports whether the service is new.
func (g *Guest) PutService(ctx context.Context, ref string, def api.Service) (*api.ServiceStatus, bool, error) {
	if err := api.CheckService(&def); err != nil {
		return nil, false, err
	}
	c, err := g.serviceCall(ctx, ref, "")
	if err != nil {
		return nil, false, err
	}
	defer c.End()
	s, created, err := c.Agent.PutService(c.Ctx, def)
	if err != nil {
		return nil, false, g.serviceError(c.Ctx, c.Sandbox, def.Name, err)
	}
	if err := checkServiceAnswer(c.Sandbox, s); err != nil {
		return nil, false, err
	}
	return s, created, nil
}

// ListServices lists a sandbox's services, by name.
func (g *Guest) ListServices(ctx context.Context, ref string) ([]api.ServiceStatus, error) {
	c, err := g.serviceCall(ctx, ref, "")
	if err != nil {
		return nil, err
	}
	defer c.End()
	l, err := c.Agent.ListServices(c.Ctx)
	if err != nil {
		return nil, g.serviceError(c.Ctx, c.Sandbox, "", err)
	}
	if l == nil {
		l = []api.ServiceStatus{}
	}
	for i := range l {
		if err := checkServiceAnswer(c.Sandbox, &l[i]); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// GetService returns one service of a sandbox.
func (g *Guest) GetService(ctx context.Context, ref, name string) (*api.ServiceStatus, error) {
	c, err := g.serviceCall(ctx, ref, name)
	if err != nil {
		return nil, err
	}
	defer c.End()
	s, err := c.Agent.GetService(c.Ctx, name)
	if err != nil {
		return nil, g.serviceError(c.Ctx, c.Sandbox, name, err)
	}
	if err := checkServiceAnswer(c.Sandbox, s); err != nil {
		return nil, err
	}
	return s, nil
}

// ServiceAction starts, stops or restarts a service (api.ServiceStart,
// api.ServiceStop, api.ServiceRestart). Stopping waits until its
// processes have exited (SIGTERM to its process group, then SIGKILL).
func (g *Guest) ServiceAction(ctx context.Context, ref, name, action string) (*api.ServiceStatus, error) {
	switch action {
	case api.ServiceStart, api.ServiceStop, api.ServiceRestart:
	default:
		return nil, api.Errorf(api.CodeNotFound, "no service action %q: start, stop or restart", action)
	}
	c, err := g.serviceCall(ctx, ref, name)
	if err != nil {
		return nil, err
	}
	defer c.End()
	s, err := c.Agent.ServiceAction(c.Ctx, name, action)
	if err != nil {
		return nil, g.serviceError(c.Ctx, c.Sandbox, name, err)
	}
	if err := checkServiceAnswer(c.Sandbox, s); err != nil {
		return nil, err
	}
	return s, nil
}

// DeleteService stops a service and forgets it, on the sandbox's disk too.
func (g *Guest) DeleteService(ctx context.Context, ref, name string) error {
	c, err := g.serviceCall(ctx, ref, name)
	if err != nil {
		return err
	}
	defer c.End()
	if err := c.Agent.DeleteService(c.Ctx, name); err != nil {
		return g.serviceError(c.Ctx, c.Sandbox, name, err)
	}
	return nil
}

// ServiceLogs opens a socket of a service's logs and returns it as a Stream
// for the caller to proxy: "offset" messages and output frames, as an
// attach socket sends, and neither "started" nor "exit". With p.NoFollow it
// ends once what was buffered is sent. It fails, before the caller has
// upgraded its client, when the service is not there.
func (g *Guest) ServiceLogs(ctx context.Context, ref, name string, p api.AttachParams) (*sandbox.Stream, error) {
	c, err := g.serviceCall(ctx, ref, name)
	if err != nil {
		return nil, err
	}
	defer c.End()
	if err := checkOffsets(p); err != nil {
		return nil, err
	}
	conn, err := c.Agent.DialServiceLogs(c.Ctx, name, p)
	if err != nil {
		return nil, g.serviceError(c.Ctx, c.Sandbox, name, err)
	}
	conn.SetReadLimit(agentconn.MessageLimit)
	return c.Stream(conn, agentconn.Control), nil
}
