package sandbox

import (
	"context"
	"errors"
	"net/http"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/store"
)

// servicesProtocol is the first agent protocol with services.
const servicesProtocol = 3

// Services (api/service.go) live in the sandbox's agent, which supervises
// them and keeps their definitions on the sandbox's disk: the Manager only
// routes calls to it, checks that the agent is new enough, and turns the
// agent's answers, which are the sandbox's word, into the API's own. Since
// definitions are on the disk, checkpoints, restores and forks need nothing
// of the Manager: a memory one carries the services on as they ran, and a
// fresh boot (a disk-only one) makes the agent start them again.

// serviceAgent finds the agent of a running sandbox that has services.
func (m *Manager) serviceAgent(ctx context.Context, ref string) (*store.Sandbox, *agent.Client, error) {
	sb, err := m.awake(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	if err := requireState(sb.Name, sb.State, api.StateRunning); err != nil {
		return nil, nil, err
	}
	if err := m.requireAgent(sb, servicesProtocol, "services"); err != nil {
		return nil, nil, err
	}
	ep, err := m.Endpoint(sb)
	if err != nil {
		return nil, nil, err
	}
	return sb, m.callClient(sb, ep), nil
}

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
// none), as the API shows it. The agent answers 404 only for a service it
// does not have; a definition it cannot run (no such user, directory or
// program) is a 400 whose text is passed on, as on exec. Anything else the
// agent says is its own failure, and a call that got no answer is
// unavailable.
func (m *Manager) serviceError(sb *store.Sandbox, name string, err error) error {
	var ae *agent.Error
	if !errors.As(err, &ae) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		m.log.Warn("calling agent", "sandbox", sb.ID, "service", name, "err", err)
		return api.Errorf(api.CodeUnavailable, "the sandbox's agent does not answer")
	}
	switch {
	case ae.Status == http.StatusNotFound && name != "":
		return noService(sb, name)
	case ae.Status == http.StatusBadRequest && api.Code(ae.Code) == api.CodeInvalid:
		return api.Errorf(api.CodeInvalid, "service %s of %s: %s", name, sb.Name, ae.Message)
	}
	return publicError(err)
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

// checkServices refuses definitions that are wrong whatever the sandbox,
// and two services of one name.
func checkServices(defs []api.Service) error {
	seen := map[string]bool{}
	for i := range defs {
		if err := api.CheckService(&defs[i]); err != nil {
			return api.Errorf(api.CodeInvalid, "services[%d]: %s", i, err.(*api.Error).Message)
		}
		if seen[defs[i].Name] {
			return api.Errorf(api.CodeInvalid, "services[%d]: two services named %q", i, defs[i].Name)
		}
		seen[defs[i].Name] = true
	}
	return nil
}

// PutService defines (or redefines) a service of a sandbox and starts it.
// It reports whether the service is new.
func (m *Manager) PutService(ctx context.Context, ref string, def api.Service) (*api.ServiceStatus, bool, error) {
	if err := api.CheckService(&def); err != nil {
		return nil, false, err
	}
	sb, ac, err := m.serviceAgent(ctx, ref)
	if err != nil {
		return nil, false, err
	}
	return m.putService(ctx, sb, ac, def)
}

func (m *Manager) putService(ctx context.Context, sb *store.Sandbox, ac *agent.Client, def api.Service) (*api.ServiceStatus, bool, error) {
	s, created, err := ac.PutService(ctx, def)
	if err != nil {
		return nil, false, m.serviceError(sb, def.Name, err)
	}
	if err := checkServiceAnswer(sb, s); err != nil {
		return nil, false, err
	}
	return s, created, nil
}

// ListServices lists a sandbox's services, by name.
func (m *Manager) ListServices(ctx context.Context, ref string) ([]api.ServiceStatus, error) {
	sb, ac, err := m.serviceAgent(ctx, ref)
	if err != nil {
		return nil, err
	}
	l, err := ac.ListServices(ctx)
	if err != nil {
		return nil, m.serviceError(sb, "", err)
	}
	if l == nil {
		l = []api.ServiceStatus{}
	}
	for i := range l {
		if err := checkServiceAnswer(sb, &l[i]); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// GetService returns one service of a sandbox.
func (m *Manager) GetService(ctx context.Context, ref, name string) (*api.ServiceStatus, error) {
	sb, ac, err := m.serviceAgent(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := checkServiceName(sb, name); err != nil {
		return nil, err
	}
	s, err := ac.GetService(ctx, name)
	if err != nil {
		return nil, m.serviceError(sb, name, err)
	}
	if err := checkServiceAnswer(sb, s); err != nil {
		return nil, err
	}
	return s, nil
}

// ServiceAction starts, stops or restarts a service (api.ServiceStart,
// api.ServiceStop, api.ServiceRestart). Stopping waits until its
// processes have exited (SIGTERM to its process group, then SIGKILL).
func (m *Manager) ServiceAction(ctx context.Context, ref, name, action string) (*api.ServiceStatus, error) {
	switch action {
	case api.ServiceStart, api.ServiceStop, api.ServiceRestart:
	default:
		return nil, api.Errorf(api.CodeNotFound, "no service action %q: start, stop or restart", action)
	}
	sb, ac, err := m.serviceAgent(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := checkServiceName(sb, name); err != nil {
		return nil, err
	}
	s, err := ac.ServiceAction(ctx, name, action)
	if err != nil {
		return nil, m.serviceError(sb, name, err)
	}
	if err := checkServiceAnswer(sb, s); err != nil {
		return nil, err
	}
	return s, nil
}

// DeleteService stops a service and forgets it, on the sandbox's disk too.
func (m *Manager) DeleteService(ctx context.Context, ref, name string) error {
	sb, ac, err := m.serviceAgent(ctx, ref)
	if err != nil {
		return err
	}
	if err := checkServiceName(sb, name); err != nil {
		return err
	}
	if err := ac.DeleteService(ctx, name); err != nil {
		return m.serviceError(sb, name, err)
	}
	return nil
}

// ServiceLogs opens a socket of a service's logs and returns it as a Stream
// for the caller to proxy: "offset" messages and output frames, as an
// attach socket sends, and neither "started" nor "exit". With p.NoFollow it
// ends once what was buffered is sent. It fails, before the caller has
// upgraded its client, when the service is not there.
func (m *Manager) ServiceLogs(ctx context.Context, ref, name string, p api.AttachParams) (*Stream, error) {
	sb, ac, err := m.serviceAgent(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := checkServiceName(sb, name); err != nil {
		return nil, err
	}
	for _, off := range []*int64{p.Offset, p.StderrOffset} {
		if off != nil && *off < 0 {
			return nil, api.Errorf(api.CodeInvalid, "offset: a byte offset is 0 or more")
		}
	}
	conn, err := ac.DialServiceLogs(ctx, name, p)
	if err != nil {
		return nil, m.serviceError(sb, name, err)
	}
	conn.SetReadLimit(agentMessageLimit)
	st := newStream(conn, agentControl)
	m.addStream(sb.ID, st)
	return st, nil
}

// startServices defines and starts the services a create gives, once the
// sandbox's agent answers.
func (m *Manager) startServices(ctx context.Context, sb *store.Sandbox, defs []api.Service) error {
	if len(defs) == 0 {
		return nil
	}
	ep, err := m.Endpoint(sb)
	if err != nil {
		return err
	}
	ac := m.callClient(sb, ep)
	for _, def := range defs {
		if _, _, err := ac.PutService(ctx, def); err != nil {
			return m.serviceError(sb, def.Name, err)
		}
	}
	return nil
}

// startServicesOrDelete starts a new sandbox's services (a create's). A
// service the sandbox cannot run (no such user, program) is the client's
// mistake, told as it is; the sandbox is not kept.
func (m *Manager) startServicesOrDelete(ctx context.Context, sb *store.Sandbox, defs []api.Service) error {
	err := m.startServices(ctx, sb, defs)
	if err == nil {
		return nil
	}
	m.log.Info("create failed: starting services", "sandbox", sb.ID, "err", err)
	if derr := m.destroy(context.WithoutCancel(ctx), sb); derr != nil {
		m.log.Error("cleaning up after failed create", "sandbox", sb.ID, "err", derr)
	}
	return err
}
