package server

import (
	"context"
	"net/http"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/sandbox"
)

// Services is what the server needs of the sandbox manager for services
// (api/service.go).
type Services interface {
	// PutService defines or redefines a service and starts it; created
	// says whether it is new.
	PutService(ctx context.Context, sandbox string, def api.Service) (s *api.ServiceStatus, created bool, err error)
	ListServices(ctx context.Context, sandbox string) ([]api.ServiceStatus, error)
	GetService(ctx context.Context, sandbox, name string) (*api.ServiceStatus, error)
	// ServiceAction is api.ServiceStart, api.ServiceStop or
	// api.ServiceRestart of the service.
	ServiceAction(ctx context.Context, sandbox, name, action string) (*api.ServiceStatus, error)
	DeleteService(ctx context.Context, sandbox, name string) error
	// ServiceLogs opens a socket of the service's logs.
	ServiceLogs(ctx context.Context, sandbox, name string, p api.AttachParams) (*sandbox.Stream, error)
}

// registerServices adds the service routes with v1.
func (gr *guestRoutes) registerServices(v1 addRoute) {
	v1("GET /v1/sandboxes/{sandbox}/services", api.ScopeRead, "", gr.listServices)
	v1("PUT /v1/sandboxes/{sandbox}/services/{service}", api.ScopeWrite, "service.put", gr.putService)
	v1("GET /v1/sandboxes/{sandbox}/services/{service}", api.ScopeRead, "", gr.getService)
	v1("DELETE /v1/sandboxes/{sandbox}/services/{service}", api.ScopeWrite, "service.delete", gr.deleteService)
	v1("GET /v1/sandboxes/{sandbox}/services/{service}/logs", api.ScopeWrite, "", gr.serviceLogs)
	for _, action := range []string{api.ServiceStart, api.ServiceStop, api.ServiceRestart} {
		v1("POST /v1/sandboxes/{sandbox}/services/{service}/"+action, api.ScopeWrite, "service."+action, func(w http.ResponseWriter, r *http.Request) error {
			return gr.serviceAction(w, r, action)
		})
	}
}

func (gr *guestRoutes) putService(w http.ResponseWriter, r *http.Request) error {
	var def api.Service
	if err := decode(w, r, &def); err != nil {
		return err
	}
	name := r.PathValue("service")
	if def.Name == "" {
		def.Name = name
	}
	if def.Name != name {
		return api.Errorf(api.CodeInvalid, "name: %q is not the service of the path, %q", def.Name, name)
	}
	if err := api.CheckService(&def); err != nil {
		return err
	}
	st, created, err := gr.guest.PutService(r.Context(), r.PathValue("sandbox"), def)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	api.WriteJSON(w, status, st)
	return nil
}

func (gr *guestRoutes) listServices(w http.ResponseWriter, r *http.Request) error {
	l, err := gr.guest.ListServices(r.Context(), r.PathValue("sandbox"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, api.ServiceList{Services: l})
	return nil
}

func (gr *guestRoutes) getService(w http.ResponseWriter, r *http.Request) error {
	st, err := gr.guest.GetService(r.Context(), r.PathValue("sandbox"), r.PathValue("service"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, st)
	return nil
}

func (gr *guestRoutes) serviceAction(w http.ResponseWriter, r *http.Request, action string) error {
	st, err := gr.guest.ServiceAction(r.Context(), r.PathValue("sandbox"), r.PathValue("service"), action)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, st)
	return nil
}

func (gr *guestRoutes) deleteService(w http.ResponseWriter, r *http.Request) error {
	if err := gr.guest.DeleteService(r.Context(), r.PathValue("sandbox"), r.PathValue("service")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// serviceLogs upgrades to a socket of a service's logs: "offset" messages
// and output frames as on an attach socket (api/session.go), from offset
// and stderr_offset; follow=false ends it once what was buffered is sent.
func (gr *guestRoutes) serviceLogs(w http.ResponseWriter, r *http.Request) error {
	p, err := attachParams(r)
	if err != nil {
		return err
	}
	st, err := gr.guest.ServiceLogs(r.Context(), r.PathValue("sandbox"), r.PathValue("service"), p)
	if err != nil {
		return err
	}
	return gr.acceptStream(w, r, st)
}
