package server

import (
	"context"
	"net/http"
	"strconv"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
)

// Orgs are the orgs' records, quotas and use (sandbox.Orgs).
type Orgs interface {
	Create(ctx context.Context, org string) (*api.Org, error)
	// Delete deletes an org and its keys; with all, its sandboxes too.
	Delete(ctx context.Context, org string, all bool) error
	Get(ctx context.Context, org string) (*api.Org, error)
	List(ctx context.Context) ([]api.Org, error)
	SetQuota(ctx context.Context, org string, q api.Quota) (*api.Org, error)
}

// WithOrgs serves the orgs' routes with o.
func WithOrgs(o Orgs) Option {
	return func(s *Server) { s.orgs = o }
}

// orgRoutes serves an org its own record, and the operator every org's.
type orgRoutes struct {
	orgs Orgs
	keys Authenticator
}

// register adds the org routes: the caller's org with v1, the operator's
// with operator.
func (or *orgRoutes) register(v1, operator addRoute) {
	v1("GET /v1/org", api.ScopeRead, "", or.getOrg)
	operator("GET /v1/orgs", api.ScopeAdmin, "", or.listOrgs)
	operator("POST /v1/orgs", api.ScopeAdmin, "org.create", or.createOrg)
	operator("DELETE /v1/orgs/{org}", api.ScopeAdmin, "org.delete", or.deleteOrg)
	operator("POST /v1/orgs/{org}/keys", api.ScopeAdmin, "key.create", or.createOrgKey)
	operator("PUT /v1/orgs/{org}/quota", api.ScopeAdmin, "quota.set", or.setQuota)
}

func (or *orgRoutes) service() (Orgs, error) {
	if or.orgs == nil {
		return nil, api.Errorf(api.CodeUnavailable, "this daemon keeps no orgs")
	}
	return or.orgs, nil
}

func (or *orgRoutes) getOrg(w http.ResponseWriter, r *http.Request) error {
	orgs, err := or.service()
	if err != nil {
		return err
	}
	p, _ := auth.From(r.Context())
	o, err := orgs.Get(r.Context(), p.Org)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, o)
	return nil
}

func (or *orgRoutes) listOrgs(w http.ResponseWriter, r *http.Request) error {
	orgs, err := or.service()
	if err != nil {
		return err
	}
	list, err := orgs.List(r.Context())
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, api.OrgList{Orgs: list})
	return nil
}

func (or *orgRoutes) setQuota(w http.ResponseWriter, r *http.Request) error {
	orgs, err := or.service()
	if err != nil {
		return err
	}
	var q api.Quota
	if err := decode(w, r, &q); err != nil {
		return err
	}
	o, err := orgs.SetQuota(r.Context(), r.PathValue("org"), q)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, o)
	return nil
}

func (or *orgRoutes) createOrg(w http.ResponseWriter, r *http.Request) error {
	orgs, err := or.service()
	if err != nil {
		return err
	}
	var req api.CreateOrg
	if err := decode(w, r, &req); err != nil {
		return err
	}
	o, err := orgs.Create(r.Context(), req.Name)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusCreated, o)
	return nil
}

// deleteOrg deletes an org, its keys and, with ?all=true, everything in
// it. The calls still open with its keys end.
func (or *orgRoutes) deleteOrg(w http.ResponseWriter, r *http.Request) error {
	orgs, err := or.service()
	if err != nil {
		return err
	}
	all := false
	if v := r.URL.Query().Get("all"); v != "" {
		if all, err = strconv.ParseBool(v); err != nil {
			return api.Errorf(api.CodeInvalid, "all: %q is not true or false", v)
		}
	}
	org := r.PathValue("org")
	keys, err := or.keys.List(r.Context(), org)
	if err != nil {
		return err
	}
	if err := orgs.Delete(r.Context(), org, all); err != nil {
		return err
	}
	ids := make([]string, 0, len(keys))
	for _, k := range keys {
		ids = append(ids, k.ID)
	}
	or.keys.Forget(ids...)
	or.keys.ForgetOrg(org)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// createOrgKey makes a key of another org, as POST /v1/keys makes one of
// the caller's: how an org gets its first admin.
func (or *orgRoutes) createOrgKey(w http.ResponseWriter, r *http.Request) error {
	orgs, err := or.service()
	if err != nil {
		return err
	}
	var req api.CreateKey
	if err := decode(w, r, &req); err != nil {
		return err
	}
	org := r.PathValue("org")
	if _, err := orgs.Get(r.Context(), org); err != nil {
		return err
	}
	p, _ := auth.From(r.Context())
	k, err := or.keys.Create(r.Context(), p, org, req)
	if err != nil {
		return err
	}
	w.Header().Set("Cache-Control", "no-store")
	api.WriteJSON(w, http.StatusCreated, k)
	return nil
}
