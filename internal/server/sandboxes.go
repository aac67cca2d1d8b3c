package server

import (
	"context"
	"log/slog"
	"net/http"
	"strings"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/store"
)

// Sandboxes is what the server needs of the sandbox manager.
type Sandboxes interface {
	Create(ctx context.Context, req api.CreateSandbox) (*api.Sandbox, error)
	List(ctx context.Context, labels map[string]string) ([]api.Sandbox, error)
	Get(ctx context.Context, ref string) (*api.Sandbox, error)
	Delete(ctx context.Context, ref string) error
	// Update changes the settings a sandbox may change while it lives.
	Update(ctx context.Context, ref string, req api.UpdateSandbox) (*api.Sandbox, error)
	// AccessToken is a sandbox's URL and the token that opens it; only the
	// owner's API offers it, never the in-sandbox one.
	AccessToken(ctx context.Context, ref string) (*api.AccessToken, error)
	Sleep(ctx context.Context, ref string) (*api.Sandbox, error)
	Wake(ctx context.Context, ref string) (*api.Sandbox, error)
	Checkpoints
	Guest
	Network
}

// sandboxRoutes serves the sandboxes themselves: create, list, get, update
// and delete them, their access token, sleep and wake, and their network
// policy. What runs inside a sandbox is guestRoutes'.
type sandboxRoutes struct {
	sandboxes Sandboxes
	// root is the server's own handler, which each fork of a count is a
	// call to (see createForks); log its log.
	root http.Handler
	log  *slog.Logger
}

// register adds the sandbox routes with v1.
func (sr *sandboxRoutes) register(v1 addRoute) {
	v1("POST /v1/sandboxes", api.ScopeWrite, "sandbox.create", sr.createSandbox)
	v1("GET /v1/sandboxes", api.ScopeRead, "", sr.listSandboxes)
	v1("GET /v1/sandboxes/{sandbox}", api.ScopeRead, "", sr.getSandbox)
	v1("DELETE /v1/sandboxes/{sandbox}", api.ScopeWrite, "sandbox.delete", sr.deleteSandbox)
	v1("PATCH /v1/sandboxes/{sandbox}", api.ScopeWrite, "sandbox.update", sr.updateSandbox)
	v1("GET /v1/sandboxes/{sandbox}/access-token", api.ScopeWrite, "", sr.accessToken)
	v1("POST /v1/sandboxes/{sandbox}/sleep", api.ScopeWrite, "sandbox.sleep", sr.sleepSandbox)
	v1("POST /v1/sandboxes/{sandbox}/wake", api.ScopeWrite, "sandbox.wake", sr.wakeSandbox)
	v1("PUT /v1/sandboxes/{sandbox}/network", api.ScopeWrite, "sandbox.network", sr.setNetwork)
}

func (sr *sandboxRoutes) createSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSandbox
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if err := sr.limitCreate(r.Context(), &req); err != nil {
		return err
	}
	call := store.AuditFrom(r.Context())
	if req.From != nil {
		call.SetAction("sandbox.fork")
	}
	if req.Count != 0 {
		// Each fork is a call of its own, with its own record.
		return sr.createForks(w, r, req)
	}
	if req.Name != "" {
		call.SetTarget("sandboxes/" + req.Name)
	}
	sb, err := sr.sandboxes.Create(r.Context(), req)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusCreated, sb)
	return nil
}

// limitCreate gives a sandbox that a label-limited key makes the key's
// labels. (A fork of a sandbox outside its selector finds none, as the
// sandbox manager resolves the source.)
func (sr *sandboxRoutes) limitCreate(ctx context.Context, req *api.CreateSandbox) error {
	p, ok := auth.From(ctx)
	if !ok || !p.Limited() {
		return nil
	}
	labels, err := p.WithLabels(req.Labels)
	if err != nil {
		return err
	}
	req.Labels = labels
	return nil
}

func (sr *sandboxRoutes) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	labels, err := labelFilter(r.URL.Query()["label"])
	if err != nil {
		return err
	}
	if p, ok := auth.From(r.Context()); ok && p.Limited() {
		// The key's selector narrows the filter; a filter at odds with it
		// matches nothing the key may see.
		for k, v := range p.Labels {
			if got, ok := labels[k]; ok && got != v {
				api.WriteJSON(w, http.StatusOK, api.SandboxList{Sandboxes: []api.Sandbox{}})
				return nil
			}
			labels[k] = v
		}
	}
	sbs, err := sr.sandboxes.List(r.Context(), labels)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, api.SandboxList{Sandboxes: sbs})
	return nil
}

// labelFilter reads the label=key=value filters of a list. They follow the
// rules of labels themselves, so a filter that no sandbox could match is a
// mistake, and there can be no more of them than a sandbox can have labels:
// each one costs the store a condition.
func labelFilter(filters []string) (map[string]string, error) {
	if len(filters) > api.MaxLabels {
		return nil, api.Errorf(api.CodeInvalid, "label: %d filters; at most %d (a sandbox has at most %d labels)", len(filters), api.MaxLabels, api.MaxLabels)
	}
	labels := make(map[string]string, len(filters))
	for _, l := range filters {
		k, v, ok := strings.Cut(l, "=")
		switch {
		case !ok || k == "":
			return nil, api.Errorf(api.CodeInvalid, "label: %q is not key=value", l)
		case !api.ValidLabelKey(k):
			return nil, api.Errorf(api.CodeInvalid, "label: key %q: %s", k, api.LabelKeyRule)
		case !api.ValidLabelValue(v):
			return nil, api.Errorf(api.CodeInvalid, "label: the value of %s: %s", k, api.LabelValueRule)
		}
		if prev, ok := labels[k]; ok && prev != v {
			// A sandbox has one value per key: no sandbox would match.
			return nil, api.Errorf(api.CodeInvalid, "label: %s is given twice, as %q and %q", k, prev, v)
		}
		labels[k] = v
	}
	return labels, nil
}

func (sr *sandboxRoutes) getSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := sr.sandboxes.Get(r.Context(), r.PathValue("sandbox"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, sb)
	return nil
}

func (sr *sandboxRoutes) updateSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.UpdateSandbox
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if p, ok := auth.From(r.Context()); ok && p.Limited() && req.Labels != nil {
		// The sandbox keeps the key's labels: a key cannot give its
		// sandbox away, nor take it out of its own sight.
		labels, err := p.WithLabels(*req.Labels)
		if err != nil {
			return err
		}
		req.Labels = &labels
	}
	sb, err := sr.sandboxes.Update(r.Context(), r.PathValue("sandbox"), req)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, sb)
	return nil
}

func (sr *sandboxRoutes) accessToken(w http.ResponseWriter, r *http.Request) error {
	at, err := sr.sandboxes.AccessToken(r.Context(), r.PathValue("sandbox"))
	if err != nil {
		return err
	}
	w.Header().Set("Cache-Control", "no-store")
	api.WriteJSON(w, http.StatusOK, at)
	return nil
}

func (sr *sandboxRoutes) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	if err := sr.sandboxes.Delete(r.Context(), r.PathValue("sandbox")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// sleepSandbox puts a sandbox to sleep now (POST …/sleep).
func (sr *sandboxRoutes) sleepSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := sr.sandboxes.Sleep(r.Context(), r.PathValue("sandbox"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, sb)
	return nil
}

// wakeSandbox wakes a sleeping sandbox (POST …/wake).
func (sr *sandboxRoutes) wakeSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := sr.sandboxes.Wake(r.Context(), r.PathValue("sandbox"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, sb)
	return nil
}
