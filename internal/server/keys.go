package server

import (
	"net/http"
	"strconv"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/store"
)

// keyRoutes serves an org's API keys and its audit log, to its admins.
type keyRoutes struct {
	keys  Authenticator
	audit AuditLog
}

// register adds the key and audit routes with v1.
func (kr *keyRoutes) register(v1 addRoute) {
	v1("POST /v1/keys", api.ScopeAdmin, "key.create", kr.createKey)
	v1("GET /v1/keys", api.ScopeAdmin, "", kr.listKeys)
	v1("DELETE /v1/keys/{key}", api.ScopeAdmin, "key.revoke", kr.revokeKey)
	v1("GET /v1/audit", api.ScopeAdmin, "", kr.listAudit)
}

func (kr *keyRoutes) createKey(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateKey
	if err := decode(w, r, &req); err != nil {
		return err
	}
	p, _ := auth.From(r.Context())
	k, err := kr.keys.Create(r.Context(), p, p.Org, req)
	if err != nil {
		return err
	}
	w.Header().Set("Cache-Control", "no-store")
	api.WriteJSON(w, http.StatusCreated, k)
	return nil
}

func (kr *keyRoutes) listKeys(w http.ResponseWriter, r *http.Request) error {
	p, _ := auth.From(r.Context())
	keys, err := kr.keys.List(r.Context(), p.Org)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, api.KeyList{Keys: keys})
	return nil
}

func (kr *keyRoutes) revokeKey(w http.ResponseWriter, r *http.Request) error {
	p, _ := auth.From(r.Context())
	if err := kr.keys.Revoke(r.Context(), p.Org, r.PathValue("key")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// listAudit answers GET /v1/audit?since=…&since_seq=…&action=…&limit=…:
// since is a time (RFC 3339) or how long ago ("1h"); since_seq pages on
// from the last event a client has. An org's admins see their org; the
// operator sees every org, or one with org=….
func (kr *keyRoutes) listAudit(w http.ResponseWriter, r *http.Request) error {
	if kr.audit == nil {
		return api.Errorf(api.CodeUnavailable, "this daemon keeps no audit log")
	}
	p, _ := auth.From(r.Context())
	q := r.URL.Query()
	f := store.AuditFilter{Org: p.Org, Action: q.Get("action"), Limit: api.MaxAuditPage}
	if p.Operator {
		f.Org = q.Get("org")
	}
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			d, derr := time.ParseDuration(v)
			if derr != nil || d < 0 {
				return api.Errorf(api.CodeInvalid, "since %q: want a time (2026-12-05T10:00:00Z) or how long ago (1h)", v)
			}
			t = store.Now().Add(-d)
		}
		f.Since = t
	}
	if v := q.Get("since_seq"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return api.Errorf(api.CodeInvalid, "since_seq %q: want the seq of the last event you have", v)
		}
		f.SinceSeq = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > api.MaxAuditPage {
			return api.Errorf(api.CodeInvalid, "limit %q: want 1 to %d", v, api.MaxAuditPage)
		}
		f.Limit = n
	}
	events, err := kr.audit.ListAudit(r.Context(), f)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, api.AuditList{Events: events})
	return nil
}
