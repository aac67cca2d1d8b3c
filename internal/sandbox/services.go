package sandbox

import (
	"context"
	"net/http"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/agentconn"
	"loam.dev/loam/internal/store"
)

// A create may give services (api/service.go): they are defined in the
// sandbox's agent before the sandbox says running (see bootWith). Every
// other call about services is a relay of package guest.

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

// startServices defines and starts the services a create gives, once the
// sandbox's agent answers. A definition the agent cannot run (no such
// user, directory or program) is a 400 whose text is passed on, as on
// exec; anything else is mapped as every relay's answer (agentconn.Map).
// op is the create that holds the sandbox (see within).
func (a *agentLink) startServices(ctx context.Context, sb *store.Sandbox, op operation, defs []api.Service) error {
	m := a.m
	if len(defs) == 0 {
		return nil
	}
	ep, err := m.Endpoint(sb)
	if err != nil {
		return err
	}
	c, err := a.within(ctx, sb, op, ep, a.token(sb))
	if err != nil {
		return err
	}
	defer c.End()
	for _, def := range defs {
		if _, _, err := c.Agent.PutService(c.Ctx, def); err != nil {
			return agentconn.Map(ctx, err, func(ae *agent.Error) error {
				if ae.Status == http.StatusBadRequest && api.Code(ae.Code) == api.CodeInvalid {
					return api.Errorf(api.CodeInvalid, "service %s of %s: %s", def.Name, sb.Name, ae.Message)
				}
				return nil
			}, func() error {
				m.log.Warn("calling agent", "sandbox", sb.ID, "service", def.Name, "err", err)
				return api.Errorf(api.CodeUnavailable, "the sandbox's agent does not answer")
			})
		}
	}
	return nil
}

// startServicesOrDelete starts a new sandbox's services (a create's). A
// service the sandbox cannot run (no such user, program) is the client's
// mistake, told as it is; the sandbox is not kept. The caller holds sb's
// create operation.
func (m *Manager) startServicesOrDelete(ctx context.Context, sb *store.Sandbox, defs []api.Service) error {
	err := m.agents.startServices(ctx, sb, opCreate, defs)
	if err == nil {
		return nil
	}
	m.log.Info("create failed: starting services", "sandbox", sb.ID, "err", err)
	if derr := m.destroy(context.WithoutCancel(ctx), sb); derr != nil {
		m.log.Error("cleaning up after failed create", "sandbox", sb.ID, "err", derr)
	}
	return err
}
