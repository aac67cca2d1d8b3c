// Package auth says who makes an API call and what they may do: the admin
// token of loam serve, API keys (kept as hashes, with a scope, an expiry
// and labels that limit them to some sandboxes) and the principal a call
// carries in its context. Every route asks it; it is the one place that
// reads a credential.
package auth

import (
	"context"
	"maps"
	"time"

	"loam.dev/loam/api"
)

// Principal is who makes a call: an org, the key's id (api.AdminKeyID for
// the admin token), its scope and labels.
type Principal struct {
	Org   string
	Key   string
	Scope api.Scope
	// Labels, when set, limit the caller to the sandboxes that have all of
	// them (see Matches), and are given to every sandbox it makes.
	Labels map[string]string
	// Operator is set for the admin token of loam serve: it may manage
	// orgs, besides being an admin of its own org.
	Operator bool
	// Expires is when the key expires; zero for never.
	Expires time.Time
}

// Allows reports whether p may make a call that needs scope need.
func (p Principal) Allows(need api.Scope) bool { return p.Scope.Includes(need) }

// Limited reports whether p is limited to some sandboxes by labels.
func (p Principal) Limited() bool { return len(p.Labels) > 0 }

// Matches reports whether a sandbox with labels is one p may see: it has
// every label of p's.
func (p Principal) Matches(labels map[string]string) bool {
	for k, v := range p.Labels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// WithLabels gives labels p's labels, refusing a label p's selector sets
// to another value. It returns a new map.
func (p Principal) WithLabels(labels map[string]string) (map[string]string, error) {
	out := maps.Clone(labels)
	if out == nil && len(p.Labels) > 0 {
		out = map[string]string{}
	}
	for k, v := range p.Labels {
		if got, ok := out[k]; ok && got != v {
			return nil, api.Errorf(api.CodeForbidden, "label %s=%s: this key's sandboxes all have %s=%s", k, got, k, v)
		}
		out[k] = v
	}
	return out, nil
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// From is the principal ctx carries, and whether it carries one. Calls
// made by the daemon itself (recovery, idle sleep) carry none.
func From(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// Scope is the org whose things a call may see: its caller's, or "" (every
// org's) for the daemon's own calls (recovery, idle sleep, the in-sandbox
// API, which resolves a sandbox by id), which carry no principal.
func Scope(ctx context.Context) string {
	if p, ok := From(ctx); ok {
		return p.Org
	}
	return ""
}

// OrgOr is the org a call makes things in: its caller's, or own (the
// daemon's, loam serve --org) for the daemon's own work.
func OrgOr(ctx context.Context, own string) string {
	if org := Scope(ctx); org != "" {
		return org
	}
	return own
}
