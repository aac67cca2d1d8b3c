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

func (s *Server) checkpointRoutes(v1 func(string, func(http.ResponseWriter, *http.Request) error)) {
	v1("POST /v1/sandboxes/{sandbox}/checkpoints", s.createCheckpoint)
	v1("GET /v1/sandboxes/{sandbox}/checkpoints", s.listCheckpoints)
	v1("GET /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}", s.getCheckpoint)
	v1("DELETE /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}", s.deleteCheckpoint)
	v1("POST /v1/sandboxes/{sandbox}/checkpoints/{checkpoint}/restore", s.restoreCheckpoint)
}

func (s *Server) createCheckpoint(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateCheckpoint
	if err := decodeOptional(w, r, &req); err != nil {
		return err
	}
	cp, err := s.sandboxes.CreateCheckpoint(r.Context(), r.PathValue("sandbox"), req)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusCreated, cp)
	return nil
}

func (s *Server) listCheckpoints(w http.ResponseWriter, r *http.Request) error {
	cps, err := s.sandboxes.ListCheckpoints(r.Context(), r.PathValue("sandbox"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, api.CheckpointList{Checkpoints: cps})
	return nil
}

func (s *Server) getCheckpoint(w http.ResponseWriter, r *http.Request) error {
	cp, err := s.sandboxes.GetCheckpoint(r.Context(), r.PathValue("sandbox"), r.PathValue("checkpoint"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, cp)
	return nil
}

func (s *Server) deleteCheckpoint(w http.ResponseWriter, r *http.Request) error {
	if err := s.sandboxes.DeleteCheckpoint(r.Context(), r.PathValue("sandbox"), r.PathValue("checkpoint")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) restoreCheckpoint(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandboxes.RestoreCheckpoint(r.Context(), r.PathValue("sandbox"), r.PathValue("checkpoint"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, sb)
	return nil
}
