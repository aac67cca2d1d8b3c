package server

import (
	"context"
	"net/http"

	"loam.dev/loam/api"
)

// Pools is what the server needs to keep warm pools of checkpoints and
// templates (package warmpool), given with WithPools: a server without it
// (the in-sandbox API) answers these routes with unavailable.
type Pools interface {
	SetCheckpointPool(ctx context.Context, sandbox, checkpoint string, size int) (*api.Pool, error)
	CheckpointPool(ctx context.Context, sandbox, checkpoint string) (*api.Pool, error)
	SetTemplatePool(ctx context.Context, template string, size int) (*api.Pool, error)
	TemplatePool(ctx context.Context, template string) (*api.Pool, error)
}

// poolRoutes serves the warm pools of checkpoints and templates: read and
// set a pool's size.
type poolRoutes struct {
	// warmPools is nil on a server without pools (see WithPools).
	warmPools Pools
}

// register adds the pool routes with v1.
func (pr *poolRoutes) register(v1 addRoute) {
	v1("GET /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}/pool", api.ScopeRead, "", pr.getPool)
	v1("PUT /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}/pool", api.ScopeWrite, "pool.set", pr.setPool)
	v1("GET /v1/templates/{template}/pool", api.ScopeRead, "", pr.getPool)
	v1("PUT /v1/templates/{template}/pool", api.ScopeWrite, "pool.set", pr.setPool)
}

func (pr *poolRoutes) pools() (Pools, error) {
	if pr.warmPools == nil {
		return nil, api.Errorf(api.CodeUnavailable, "this server keeps no warm pools")
	}
	return pr.warmPools, nil
}

// getPool answers both routes: a template's pool when the path names a
// template, else a checkpoint'pr.
func (pr *poolRoutes) getPool(w http.ResponseWriter, r *http.Request) error {
	p, err := pr.pools()
	if err != nil {
		return err
	}
	var pool *api.Pool
	if t := r.PathValue("template"); t != "" {
		pool, err = p.TemplatePool(r.Context(), t)
	} else {
		pool, err = p.CheckpointPool(r.Context(), r.PathValue("sandbox"), r.PathValue("checkpoint"))
	}
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, pool)
	return nil
}

func (pr *poolRoutes) setPool(w http.ResponseWriter, r *http.Request) error {
	p, err := pr.pools()
	if err != nil {
		return err
	}
	var req api.SetPool
	if err := decode(w, r, &req); err != nil {
		return err
	}
	var pool *api.Pool
	if t := r.PathValue("template"); t != "" {
		pool, err = p.SetTemplatePool(r.Context(), t, req.Size)
	} else {
		pool, err = p.SetCheckpointPool(r.Context(), r.PathValue("sandbox"), r.PathValue("checkpoint"), req.Size)
	}
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, pool)
	return nil
}
