package server

import (
	"context"
	"net/http"

	"loam.dev/loam/api"
)

// Checkpoints is what the server needs of the checkpoint service.
type Checkpoints interface {
	CreateCheckpoint(ctx context.Context, sandbox string, req api.CreateCheckpoint) (*api.Checkpoint, error)
	ListCheckpoints(ctx context.Context, sandbox string) ([]api.Checkpoint, error)
	GetCheckpoint(ctx context.Context, sandbox, ref string) (*api.Checkpoint, error)
	DeleteCheckpoint(ctx context.Context, sandbox, ref string) error
	RestoreCheckpoint(ctx context.Context, sandbox, ref string) (*api.Sandbox, error)
}

// checkpointRoutes serves a sandbox's checkpoints: take, list, get, delete
// and restore them. Both the daemon's API and the in-sandbox API register
// them (see Inside).
type checkpointRoutes struct {
	checkpoints Checkpoints
}

// register adds the checkpoint routes with v1.
func (cr *checkpointRoutes) register(v1 addRoute) {
	v1("POST /v1/sandboxes/{sandbox}/checkpoints", api.ScopeWrite, "checkpoint.create", cr.createCheckpoint)
	v1("GET /v1/sandboxes/{sandbox}/checkpoints", api.ScopeRead, "", cr.listCheckpoints)
	v1("GET /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}", api.ScopeRead, "", cr.getCheckpoint)
	v1("DELETE /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}", api.ScopeWrite, "checkpoint.delete", cr.deleteCheckpoint)
	v1("POST /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}/restore", api.ScopeWrite, "checkpoint.restore", cr.restoreCheckpoint)
}

func (cr *checkpointRoutes) createCheckpoint(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateCheckpoint
	if err := decodeOptional(w, r, &req); err != nil {
		return err
	}
	cp, err := cr.checkpoints.CreateCheckpoint(r.Context(), r.PathValue("sandbox"), req)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusCreated, cp)
	return nil
}

func (cr *checkpointRoutes) listCheckpoints(w http.ResponseWriter, r *http.Request) error {
	cps, err := cr.checkpoints.ListCheckpoints(r.Context(), r.PathValue("sandbox"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, api.CheckpointList{Checkpoints: cps})
	return nil
}

// checkpointWaiter is the checkpoint service of a daemon that can wait for
// a checkpoint to be stored (GET …?wait=stored).
type checkpointWaiter interface {
	WaitCheckpoint(ctx context.Context, sandbox, ref, wait string) (*api.Checkpoint, error)
}

func (cr *checkpointRoutes) getCheckpoint(w http.ResponseWriter, r *http.Request) error {
	var cp *api.Checkpoint
	var err error
	if wait := r.URL.Query().Get("wait"); wait != "" {
		cw, ok := cr.checkpoints.(checkpointWaiter)
		if !ok {
			return api.Errorf(api.CodeInvalid, "wait: this API does not wait for checkpoints")
		}
		cp, err = cw.WaitCheckpoint(r.Context(), r.PathValue("sandbox"), r.PathValue("checkpoint"), wait)
	} else {
		cp, err = cr.checkpoints.GetCheckpoint(r.Context(), r.PathValue("sandbox"), r.PathValue("checkpoint"))
	}
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, cp)
	return nil
}

func (cr *checkpointRoutes) deleteCheckpoint(w http.ResponseWriter, r *http.Request) error {
	if err := cr.checkpoints.DeleteCheckpoint(r.Context(), r.PathValue("sandbox"), r.PathValue("checkpoint")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (cr *checkpointRoutes) restoreCheckpoint(w http.ResponseWriter, r *http.Request) error {
	sb, err := cr.checkpoints.RestoreCheckpoint(r.Context(), r.PathValue("sandbox"), r.PathValue("checkpoint"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, sb)
	return nil
}
