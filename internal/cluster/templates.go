package cluster

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/store"
)

// Checkpoint templates are kept on the node that made them (or imported
// them), and nowhere else, until templates travel through an object
// store: each node reports its own with its lease
// (api.NodeLoad.CheckpointTemplates, "org/name"), and the router passes
// the calls about one to the node that keeps it. Built-in templates are
// built by every node, and images pulled again by whichever needs them.

// heldKey is how a lease names checkpoint template name of org.
func heldKey(org, name string) string { return org + "/" + name }

// holds reports whether n keeps org's checkpoint template name.
func holds(n *store.Node, org, name string) bool {
	return slices.Contains(n.Load.CheckpointTemplates, heldKey(org, name))
}

// HeldElsewhere are the checkpoint templates of org the other nodes keep,
// by name, and the node of each (the first by name, should two keep one),
// as their leases last said.
func (m *Member) HeldElsewhere(org string) map[string]string {
	nodes, _ := m.Nodes()
	out := map[string]string{}
	prefix := org + "/"
	for _, n := range nodes {
		if n.Name == m.Name() {
			continue
		}
		for _, k := range n.Load.CheckpointTemplates {
			if name, ok := strings.CutPrefix(k, prefix); ok {
				if _, seen := out[name]; !seen {
					out[name] = n.Name
				}
			}
		}
	}
	return out
}

// Report renews the lease now, out of turn, and reads the nodes again:
// the node's templates changed, and the other nodes should learn it
// before they place a sandbox of one. A renewal that fails is only
// logged; Run's next one tries again, and stops the daemon if it was
// fenced.
func (m *Member) Report(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.Lease/2)
	defer cancel()
	if err := m.recs.RenewNode(ctx, m.cfg.Name, m.epoch, m.cfg.Lease, m.cfg.Load(ctx)); err != nil {
		m.log.Warn("reporting the node's templates", "node", m.cfg.Name, "err", err)
		return
	}
	if err := m.readNodes(ctx); err != nil {
		m.log.Warn("reading the cluster's nodes", "err", err)
	}
}

// holders are the nodes that keep org's checkpoint template name. When
// none does at the last reading, the nodes are read again: the template
// may have been made a moment ago (its node reports it at once, Report).
func (rt *Router) holders(ctx context.Context, org, name string) ([]*store.Node, time.Time) {
	find := func() ([]*store.Node, time.Time) {
		nodes, now := rt.member.Nodes()
		var out []*store.Node
		for _, n := range nodes {
			if holds(n, org, name) {
				out = append(out, n)
			}
		}
		return out, now
	}
	held, now := find()
	if len(held) > 0 || rt.cached(name) {
		return held, now
	}
	if err := rt.member.readNodes(ctx); err != nil {
		return nil, now
	}
	return find()
}

// cached reports whether a node has template name in its template cache:
// a built-in one, which every node builds.
func (rt *Router) cached(name string) bool {
	return len(rt.member.BuiltOn(name)) > 0
}

// BuiltOn are the nodes that have built-in template name in their
// template cache, by name, as their leases last said: a front end, which
// builds none, lists a built-in template ready once a node has it.
func (m *Member) BuiltOn(name string) []string {
	nodes, _ := m.Nodes()
	var out []string
	for _, n := range nodes {
		if slices.ContainsFunc(n.Load.Templates, func(t string) bool { return isCache(t, name) }) {
			out = append(out, n.Name)
		}
	}
	return out
}

// isCache reports whether entry of a node's template cache is template's.
func isCache(entry, template string) bool {
	return entry == template || strings.HasPrefix(entry, template+"-")
}

// PlaceTemplate passes r, a POST /v1/templates, to the node that holds
// its checkpoint (its source sandbox's owner: until checkpoints travel,
// only that node has it), and reports whether it answered the call
// (passed on, or refused). A name another node's template has is
// refused here, since each node checks its own alone.
func (rt *Router) PlaceTemplate(w http.ResponseWriter, r *http.Request) bool {
	if _, ok := rt.Routed(r); ok {
		return false
	}
	body, ok := readBody(r)
	if !ok {
		return false
	}
	var req api.CreateTemplate
	if json.Unmarshal(body, &req) != nil || req.From == nil || req.From.Sandbox == "" {
		return false // the API says what is wrong with it
	}
	ctx := r.Context()
	src, err := rt.recs.GetSandbox(ctx, auth.Scope(ctx), req.From.Sandbox)
	if err != nil || src.Node == "" || src.Pool != "" {
		return false // not found, or the store cannot say: this node answers
	}
	if org := auth.Scope(ctx); org != "" {
		nodes, _ := rt.member.Nodes()
		for _, n := range nodes {
			if n.Name != src.Node && holds(n, org, req.Name) {
				api.WriteError(w, api.Errorf(api.CodeConflict, "template %q exists (on node %s)", req.Name, n.Name))
				return true
			}
		}
	}
	if since, lapsed := rt.member.Lapsed(src.Node); lapsed {
		api.WriteError(w, api.Errorf(api.CodeUnavailable, "the checkpoint is on node %s, which stopped answering at %s; a template is made where its checkpoint is until checkpoints travel",
			src.Node, since.UTC().Format(time.RFC3339)))
		return true
	}
	rt.log.Info("placed a template", "template", req.Name, "node", src.Node, "why", "the node that holds the checkpoint")
	if src.Node == rt.member.Name() {
		return false
	}
	return rt.passTo(w, r, rt.node(ctx, src.Node))
}

// ForwardTemplate passes a call about checkpoint template name (delete,
// export, its warm pool, an import under a name taken) to the node that
// keeps it, when another node does and this one does not, and reports
// whether it did. A node that stopped answering is named.
func (rt *Router) ForwardTemplate(w http.ResponseWriter, r *http.Request, name string) bool {
	if _, ok := rt.Routed(r); ok {
		return false
	}
	ctx := r.Context()
	org := auth.Scope(ctx)
	if org == "" {
		return false
	}
	var at *store.Node
	nodes, _ := rt.member.Nodes()
	for _, n := range nodes {
		if !holds(n, org, name) {
			continue
		}
		if n.Name == rt.member.Name() {
			return false
		}
		if at == nil {
			at = n
		}
	}
	if at == nil {
		return false
	}
	if since, lapsed := rt.member.Lapsed(at.Name); lapsed {
		api.WriteError(w, api.Errorf(api.CodeUnavailable, "template %s is on node %s, which stopped answering at %s",
			name, at.Name, since.UTC().Format(time.RFC3339)))
		return true
	}
	return rt.passTo(w, r, at)
}
