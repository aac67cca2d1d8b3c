package server

import (
	"context"
	"net/http"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
)

// Orgs are the orgs' records, quotas and use (sandbox.Orgs).
type Orgs interface {
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
}

// register adds the org routes: the caller's org with v1, the operator's
// with operator.
func (or *orgRoutes) register(v1, operator addRoute) {
	v1("GET /v1/org", api.ScopeRead, "", or.getOrg)
	operator("GET /v1/orgs", api.ScopeAdmin, "", or.listOrgs)
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
