package server

import (
	"context"
	"net/http"

	"loam.dev/loam/api"
)

// Network is what the server needs of the sandbox manager for sandboxes'
// network policies (see api.NetworkPolicy). GET of a sandbox shows its
// policy.
type Network interface {
	// SetNetwork replaces a sandbox's network policy and returns the
	// sandbox; a running sandbox's connections that the new policy
	// forbids are cut.
	SetNetwork(ctx context.Context, ref string, p api.NetworkPolicy) (*api.Sandbox, error)
}

// setNetwork replaces a sandbox's network policy (PUT …/network).
func (sr *sandboxRoutes) setNetwork(w http.ResponseWriter, r *http.Request) error {
	var p api.NetworkPolicy
	if err := decode(w, r, &p); err != nil {
		return err
	}
	sb, err := sr.sandboxes.SetNetwork(r.Context(), r.PathValue("sandbox"), p)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, sb)
	return nil
}
