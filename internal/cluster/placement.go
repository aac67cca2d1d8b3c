package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/store"
)

// maxPlaceBody is the most of a create's body placement reads: the API
// takes at most 1 MiB of JSON, and refuses more itself.
const maxPlaceBody = 1 << 20

// defaultMemoryMiB is the memory of a sandbox that asks for none (the
// daemon's sandbox.Config.Defaults).
const defaultMemoryMiB = 512

// Place decides where a create (POST /v1/sandboxes) is made, and passes it
// there when that is another node; it reports whether it answered the
// call (passed on, or refused with limit). A fork goes to the node of its
// checkpoint's sandbox (until checkpoints travel, only that node has it);
// a create pinned to a node ("node", the operator's alone) to that node;
// any other to the ready, uncordoned node with the most memory free after
// it, preferring one that has its template cached. Every decision is
// logged with its reason.
func (rt *Router) Place(w http.ResponseWriter, r *http.Request) bool {
	if _, ok := rt.Routed(r); ok {
		return false // decided by the node that passed it on
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxPlaceBody+1))
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	if err != nil || len(body) > maxPlaceBody {
		return false // the API refuses it here
	}
	var req api.CreateSandbox
	if json.Unmarshal(body, &req) != nil {
		return false // the API says what is wrong with it
	}
	ctx := r.Context()
	p, _ := auth.From(ctx)
	node, why, err := rt.choose(r, &req, p)
	if err != nil {
		api.WriteError(w, err)
		return true
	}
	rt.log.Info("placed a sandbox", "name", req.Name, "node", node, "why", why)
	if node == rt.member.Name() {
		return false
	}
	n := rt.member.Node(node)
	u, err := parseAddress(n)
	if err != nil {
		api.WriteError(w, err)
		return true
	}
	rt.proxy(w, r, n.Name, u, true)
	return true
}

// choose is the node a create goes to, and why.
func (rt *Router) choose(r *http.Request, req *api.CreateSandbox, p auth.Principal) (node, why string, err error) {
	ctx := r.Context()
	if req.Node != "" {
		if !p.Operator {
			return "", "", api.Errorf(api.CodeForbidden, "node: only the operator (the admin token) pins a sandbox to a node")
		}
		n := rt.node(ctx, req.Node)
		if n == nil {
			return "", "", api.Errorf(api.CodeInvalid, "node: no node %q in the cluster (loam nodes lists them)", req.Node)
		}
		if since, lapsed := rt.member.Lapsed(n.Name); lapsed {
			return "", "", api.Errorf(api.CodeUnavailable, "node %s stopped answering at %s", n.Name, since.UTC().Format(time.RFC3339))
		}
		if n.Load.Role != RoleNode {
			return "", "", api.Errorf(api.CodeInvalid, "node: %s is an API front end (--role api): it runs no sandboxes", n.Name)
		}
		return n.Name, "pinned by the operator", nil
	}
	if req.From != nil && req.From.Sandbox != "" {
		src, err := rt.recs.GetSandbox(ctx, auth.Scope(ctx), req.From.Sandbox)
		if err != nil || src.Node == "" || src.Pool != "" {
			// Not found, or the store cannot say: this node answers.
			return rt.member.Name(), "the fork's source is not known here", nil
		}
		if since, lapsed := rt.member.Lapsed(src.Node); lapsed {
			return "", "", api.Errorf(api.CodeUnavailable, "the checkpoint is on node %s, which stopped answering at %s; a fork is made where its checkpoint is until checkpoints travel",
				src.Node, since.UTC().Format(time.RFC3339))
		}
		if n := rt.member.Node(src.Node); n != nil && n.Cordoned {
			rt.log.Info("a fork goes to a cordoned node: its checkpoint is there alone", "node", n.Name)
		}
		return src.Node, "the node that holds the checkpoint", nil
	}
	want := int64(defaultMemoryMiB)
	if req.Resources != nil && req.Resources.MemoryMiB > 0 {
		want = int64(req.Resources.MemoryMiB)
	}
	return rt.best(want, req.Template)
}

// best is the ready, uncordoned sandbox node with the most memory free
// after a sandbox of want MiB; one that has template cached wins a near tie
// (within a sandbox's memory). limit, naming what was short, when none can
// take it.
func (rt *Router) best(want int64, template string) (string, string, error) {
	nodes, now := rt.member.Nodes()
	var (
		pick     *store.Node
		pickFree int64
		skipped  []string
	)
	for _, n := range nodes {
		switch {
		case n.State(now) != api.NodeReady:
			skipped = append(skipped, n.Name+" unreachable")
			continue
		case n.Cordoned:
			skipped = append(skipped, n.Name+" cordoned")
			continue
		case n.Load.Role != RoleNode:
			continue
		}
		free := n.Load.MemoryFreeMiB - want
		if free < 0 {
			skipped = append(skipped, fmt.Sprintf("%s has %d MiB free", n.Name, n.Load.MemoryFreeMiB))
			continue
		}
		score := free
		if template != "" && slices.ContainsFunc(n.Load.Templates, func(t string) bool { return strings.HasPrefix(t, template+"-") || t == template }) {
			score += want
		}
		if pick == nil || score > pickFree {
			pick, pickFree = n, score
		}
	}
	if pick == nil {
		msg := fmt.Sprintf("no node can take a sandbox of %d MiB", want)
		if len(skipped) > 0 {
			msg += ": " + strings.Join(skipped, ", ")
		}
		return "", "", api.Errorf(api.CodeLimit, "%s", msg)
	}
	return pick.Name, fmt.Sprintf("the most memory free after it (%d MiB of %d)", pick.Load.MemoryFreeMiB-want, pick.Load.MemoryMiB), nil
}
