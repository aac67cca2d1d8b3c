package server

import (
	"context"
	"net/http"
	"strconv"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/secret"
)

// Secrets is what the server needs of the secret keeper (secret.Keeper
// has it). No route returns a secret's value.
// Each call is about the caller's org's secrets.
type Secrets interface {
	Put(ctx context.Context, org, name string, value secret.Value) (*api.Secret, error)
	List(ctx context.Context, org string) ([]api.Secret, error)
	// Delete deletes a secret; one that a sandbox has is a conflict,
	// unless force.
	Delete(ctx context.Context, org, name string, force bool) error
}

// WithSecrets serves the secrets routes from secrets; without it they
// answer unavailable (and the list is empty).
func WithSecrets(secrets Secrets) Option {
	return func(s *Server) { s.secrets = secrets }
}

// errNoSecrets answers the secret routes of a server without secrets.
var errNoSecrets = api.Errorf(api.CodeUnavailable, "this daemon keeps no secrets")

// secretRoutes serves the secrets sandboxes may be given: put, list and
// delete them, never read their values.
type secretRoutes struct {
	// secrets is nil on a server without secrets (see WithSecrets).
	secrets Secrets
}

// register adds the secret routes with v1.
func (sc *secretRoutes) register(v1 addRoute) {
	v1("PUT /v1/secrets/{name}", api.ScopeWrite, "secret.put", sc.putSecret)
	v1("GET /v1/secrets", api.ScopeRead, "", sc.listSecrets)
	v1("DELETE /v1/secrets/{name}", api.ScopeWrite, "secret.delete", sc.deleteSecret)
}

// errSecretBody never quotes the body: encoding/json's own messages can
// hold a piece of it, which here is the value.
var errSecretBody = api.Errorf(api.CodeInvalid, `body: must be a JSON object {"value":"…"} whose value is a string`)

func (sc *secretRoutes) putSecret(w http.ResponseWriter, r *http.Request) error {
	var req api.PutSecret
	if err := decodeJSON(http.MaxBytesReader(w, r.Body, maxBody), &req); err != nil {
		return errSecretBody
	}
	if sc.secrets == nil {
		return errNoSecrets
	}
	sec, err := sc.secrets.Put(r.Context(), callerOrg(r), r.PathValue("name"), secret.NewValue(req.Value))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, sec)
	return nil
}

func (sc *secretRoutes) listSecrets(w http.ResponseWriter, r *http.Request) error {
	list := []api.Secret{}
	var err error
	if sc.secrets != nil {
		list, err = sc.secrets.List(r.Context(), callerOrg(r))
	}
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, api.SecretList{Secrets: list})
	return nil
}

func (sc *secretRoutes) deleteSecret(w http.ResponseWriter, r *http.Request) error {
	force := false
	if f := r.URL.Query().Get("force"); f != "" {
		var err error
		if force, err = strconv.ParseBool(f); err != nil {
			return api.Errorf(api.CodeInvalid, "force: %q is not true or false", f)
		}
	}
	if sc.secrets == nil {
		return errNoSecrets
	}
	if err := sc.secrets.Delete(r.Context(), callerOrg(r), r.PathValue("name"), force); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// callerOrg is the org of the call's principal (auth.From): whose secrets,
// and later whose everything, a call is about.
func callerOrg(r *http.Request) string {
	p, _ := auth.From(r.Context())
	return p.Org
}
