package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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

// defaultMemoryMiB and defaultCPUs are the memory and CPUs of a sandbox
// that asks for none (the daemon's sandbox.Config.Defaults).
const (
	defaultMemoryMiB = 512
	defaultCPUs      = 1
)

// Place decides where a create (POST /v1/sandboxes) is made, and passes it
// there when that is another node; it reports whether it answered the
// call (passed on, or refused with limit). A create pinned to a node
// ("node", the operator's alone) goes to that node; a fork to the node of
// its checkpoint's sandbox, unless the checkpoint is in the object store
// (then any node, that one preferred), and a sandbox of a checkpoint
// template to the node that keeps it (until templates travel, only that
// node has them); any other to the ready, uncordoned node with the most
// memory free after it, preferring one that has its template or image
// cached (placeImage). A node with less memory free or fewer CPUs than
// the sandbox asks for takes none; what was placed on a node since its
// last report counts as taken (placed). Every decision is logged with its
// reason. A create with a count of forks is not placed whole: this node
// makes each fork as a create of its own, placed on its own.
func (rt *Router) Place(w http.ResponseWriter, r *http.Request) bool {
	if _, ok := rt.Routed(r); ok {
		return false // decided by the node that passed it on
	}
	body, ok := readBody(r)
	if !ok {
		return false
	}
	var req api.CreateSandbox
	if json.Unmarshal(body, &req) != nil {
		return false // the API says what is wrong with it
	}
	if req.Count != 0 {
		return false // each of its forks is placed on its own
	}
	ctx := r.Context()
	p, _ := auth.From(ctx)
	node, why, err := rt.choose(r, &req, p)
	if err != nil {
		rt.log.Info("placed no sandbox", "name", req.Name, "err", err)
		api.WriteError(w, err)
		return true
	}
	rt.log.Info("placed a sandbox", "name", req.Name, "node", node, "why", why)
	if node == rt.member.Name() {
		return false
	}
	return rt.passTo(w, r, rt.member.Node(node))
}

// passTo passes API call r to node n, or answers why it cannot (n gone,
// or its address no URL); either way r is answered.
func (rt *Router) passTo(w http.ResponseWriter, r *http.Request, n *store.Node) bool {
	u, err := parseAddress(n)
	if err != nil {
		api.WriteError(w, err)
		return true
	}
	rt.proxy(w, r, n.Name, u, true)
	return true
}

// readBody reads r's body for a placement, and puts it back for the
// handler; false when it is too big (the API refuses it itself).
func readBody(r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxPlaceBody+1))
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	return body, err == nil && len(body) <= maxPlaceBody
}

// ask is what a sandbox asks of the node it is placed on.
type ask struct {
	memoryMiB int64
	cpus      float64
}

// askOf is what a sandbox of resources r asks, the daemon's defaults for
// what r does not give.
func askOf(r *api.Resources) ask {
	a := ask{memoryMiB: defaultMemoryMiB, cpus: defaultCPUs}
	if r != nil && r.MemoryMiB > 0 {
		a.memoryMiB = int64(r.MemoryMiB)
	}
	if r != nil && r.CPUs > 0 {
		a.cpus = r.CPUs
	}
	return a
}

func (a ask) String() string {
	return fmt.Sprintf("%d MiB and %g CPU", a.memoryMiB, a.cpus)
}

// short says what node n lacks to take a sandbox asking a ("has 300 MiB
// free"), "" when it has enough; s is what was placed on it since its
// last report, whose memory is not free any more. A node that reports no
// CPUs (one of an older loam) is not refused for them.
func (a ask) short(n *store.Node, s recent) string {
	if free := n.Load.MemoryFreeMiB - s.memoryMiB; free < a.memoryMiB {
		if s.count > 0 {
			return fmt.Sprintf("has %d MiB free, less %s", n.Load.MemoryFreeMiB, s)
		}
		return fmt.Sprintf("has %d MiB free", n.Load.MemoryFreeMiB)
	}
	if n.Load.CPUs > 0 && float64(n.Load.CPUs) < a.cpus {
		return fmt.Sprintf("has %d CPUs", n.Load.CPUs)
	}
	return ""
}

// choose is the node a create goes to, and why. What it places is counted
// against the node until the node's next report (placed), so that the
// creates placed meanwhile spread over the nodes.
func (rt *Router) choose(r *http.Request, req *api.CreateSandbox, p auth.Principal) (node, why string, err error) {
	node, why, a, err := rt.decide(r, req, p)
	if err == nil && a.memoryMiB > 0 {
		rt.placed.add(node, rt.member.Now(), a)
	}
	return node, why, err
}

// decide is choose's decision: the node, why, and what the sandbox asks
// of it (zero when that is not known here, the node then saying why it
// cannot make the sandbox).
func (rt *Router) decide(r *http.Request, req *api.CreateSandbox, p auth.Principal) (node, why string, a ask, err error) {
	ctx := r.Context()
	if req.Node != "" {
		node, why, err := rt.pinned(ctx, req, p)
		return node, why, askOf(req.Resources), err
	}
	if req.From != nil && req.From.Sandbox != "" {
		src, err := rt.recs.GetSandbox(ctx, auth.Scope(ctx), req.From.Sandbox)
		if err != nil || src.Node == "" || src.Pool != "" {
			// Not found, or the store cannot say: this node answers.
			return rt.member.Name(), "the fork's source is not known here", ask{}, nil
		}
		// A fork takes its resources from the checkpoint; its sandbox's
		// are what it asks, short of reading the checkpoint.
		a := askOf(&src.Resources)
		node, why, err := rt.fork(ctx, src, req.From.Checkpoint, a)
		return node, why, a, err
	}
	a = askOf(req.Resources)
	nodes, now := rt.member.Nodes()
	org := auth.Scope(ctx)
	if req.Template != "" && req.Image == "" && org != "" {
		held, at := rt.holders(ctx, org, req.Template)
		if len(held) > 0 {
			node, why, err := rt.kept(req.Template, held, at, a)
			return node, why, a, err
		}
	}
	if req.Image != "" && req.Template == "" && org != "" {
		node, why, err := rt.placeImage(ctx, org, req.Image, nodes, now, a)
		return node, why, a, err
	}
	node, why, err = best(nodes, now, a, templateCached(req.Template), rt.placed.recent(nodes))
	return node, why, a, err
}

// pinned is the node of a create the operator pinned to one (req.Node).
func (rt *Router) pinned(ctx context.Context, req *api.CreateSandbox, p auth.Principal) (string, string, error) {
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
	if held := rt.heldOn(ctx, req); held != "" && held != n.Name {
		if rt.storedFork(ctx, req) {
			return n.Name, "pinned by the operator; its checkpoint is stored, and " + n.Name + " fetches it", nil
		}
		return "", "", api.Errorf(api.CodeInvalid, "node: %s is on node %s, and is made there alone until checkpoints travel; pin it to %s, or to no node", pinnedWhat(req), held, held)
	}
	return n.Name, "pinned by the operator", nil
}

// fork is the node of a fork of checkpoint cp of src. A checkpoint in the
// object store can be fetched by any node: the fork goes where placement
// says (best), the node that holds the checkpoint preferred in a near
// tie, so that many forks of one checkpoint spread. Any other is made on
// the node that holds it, even cordoned (only it has the checkpoint),
// unless that node stopped answering or lacks what the fork asks.
func (rt *Router) fork(ctx context.Context, src *store.Sandbox, cp string, a ask) (string, string, error) {
	node := src.Node
	stored, err := rt.storedCheckpoint(ctx, src, cp)
	if err != nil {
		return "", "", err
	}
	since, lapsed := rt.member.Lapsed(node)
	n := rt.member.Node(node)
	var short string
	if n != nil {
		short = a.short(n, rt.placed.recent([]*store.Node{n})[node])
	}
	if stored {
		why := "its checkpoint is stored"
		switch {
		case lapsed:
			why += " and its node " + node + " stopped answering"
		case short != "":
			why += " and its node " + node + " " + short
		case n != nil && n.Cordoned:
			why += " and its node " + node + " is cordoned"
		}
		nodes, now := rt.member.Nodes()
		holds := cachePref{what: "the checkpoint", has: func(n *store.Node) bool { return n.Name == node }}
		picked, w, err := best(nodes, now, a, holds, rt.placed.recent(nodes))
		if err != nil {
			return "", "", err
		}
		return picked, why + "; " + w, nil
	}
	if lapsed {
		return "", "", api.Errorf(api.CodeUnavailable, "the checkpoint is on node %s, which stopped answering at %s, and is not in the object store (loam serve --objects); a fork is made where its checkpoint is",
			node, since.UTC().Format(time.RFC3339))
	}
	if n == nil {
		return node, "the node that holds the checkpoint", nil // it answers for itself
	}
	if short != "" {
		return "", "", api.Errorf(api.CodeLimit, "no node can take a fork of %s: its checkpoint is on node %s, which %s, and is not in the object store (loam serve --objects); a fork is made where its checkpoint is",
			a, node, short)
	}
	if n.Cordoned {
		rt.log.Info("a fork goes to a cordoned node: its checkpoint is there alone", "node", n.Name)
	}
	return node, "the node that holds the checkpoint", nil
}

// storedCheckpoint reports whether checkpoint cp of src is in the object
// store (false without one, or when the store cannot say); not found when
// there is no such checkpoint.
func (rt *Router) storedCheckpoint(ctx context.Context, src *store.Sandbox, cp string) (bool, error) {
	if rt.stored == nil {
		return false, nil
	}
	stored, err := rt.stored.Stored(ctx, src.ID, cp)
	if errors.Is(err, store.ErrNotFound) {
		return false, api.Errorf(api.CodeNotFound, "checkpoint %q of sandbox %s not found", cp, src.Name)
	}
	return stored && err == nil, nil
}

// StoredCheckpoints says whether a checkpoint is in the object store, so
// that any node can fetch it (the daemon's checkpoints.Uploader).
type StoredCheckpoints interface {
	// Stored reports whether checkpoint ref (id or name) of sandbox
	// sandboxID is stored, complete; store.ErrNotFound when there is no
	// such checkpoint.
	Stored(ctx context.Context, sandboxID, ref string) (bool, error)
}

// SetStored gives the router what says which checkpoints are stored (a
// daemon with --objects); without it, a fork goes where its checkpoint
// is.
func (rt *Router) SetStored(s StoredCheckpoints) { rt.stored = s }

// kept is the node of a sandbox of checkpoint template name, which the
// nodes held keep: the best of them, which must be ready and uncordoned
// like any other. limit when none can take it, or unavailable when every
// one stopped answering, naming each and why.
func (rt *Router) kept(name string, held []*store.Node, now time.Time, a ask) (string, string, error) {
	node, code, why := within(held, now, a, rt.placed.recent(held))
	if node != "" {
		return node, "the node that keeps template " + name, nil
	}
	return "", "", api.Errorf(code, "no node can take a sandbox of template %s (%s): the template is on %s; a sandbox of a checkpoint template is made where the template is until templates travel",
		name, a, why)
}

// within is the best of the nodes held, which alone have what a sandbox
// asking a is made of; when none can take it, "" and the code of the
// answer (limit, or unavailable when every one stopped answering) and
// why each cannot ("node b, which is cordoned and node c, which ...").
func within(held []*store.Node, now time.Time, a ask, placed map[string]recent) (string, api.Code, string) {
	if node, _, err := best(held, now, a, cachePref{}, placed); err == nil {
		return node, "", ""
	}
	var why []string
	down := 0
	for _, n := range held {
		switch {
		case n.State(now) != api.NodeReady:
			down++
			why = append(why, fmt.Sprintf("node %s, which stopped answering at %s", n.Name, n.LeaseUntil.UTC().Format(time.RFC3339)))
		case n.Cordoned:
			why = append(why, fmt.Sprintf("node %s, which is cordoned", n.Name))
		default:
			why = append(why, fmt.Sprintf("node %s, which %s", n.Name, a.short(n, placed[n.Name])))
		}
	}
	code := api.CodeLimit
	if down == len(held) {
		code = api.CodeUnavailable
	}
	return "", code, strings.Join(why, " and ")
}

// cachePref is what a sandbox is made of that a node may have cached:
// what names it ("template base"), and whether node n has it. The zero
// cachePref prefers no node.
type cachePref struct {
	what string
	has  func(n *store.Node) bool
}

// templateCached prefers the nodes that have built-in template name in
// their template cache; none when name is "".
func templateCached(name string) cachePref {
	if name == "" {
		return cachePref{}
	}
	return cachePref{what: "template " + name, has: func(n *store.Node) bool {
		return slices.ContainsFunc(n.Load.Templates, func(t string) bool { return isCache(t, name) })
	}}
}

// best is the ready, uncordoned sandbox node of nodes with the most
// memory free after a sandbox asking a, and CPUs enough; one that has
// pref cached wins a near tie (within the sandbox's memory). What was
// placed on a node since its last report (placed, by node) is not free,
// and of two nodes as good, the one fewer were placed on wins: creates
// placed between two reports spread. limit, naming what was short of
// each, when none can take it.
func best(nodes []*store.Node, now time.Time, a ask, pref cachePref, placed map[string]recent) (string, string, error) {
	var (
		pick     *store.Node
		pickFree int64
		pickHas  bool
		pickSent recent
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
		sent := placed[n.Name]
		if why := a.short(n, sent); why != "" {
			skipped = append(skipped, n.Name+" "+why)
			continue
		}
		score := n.Load.MemoryFreeMiB - sent.memoryMiB - a.memoryMiB
		has := pref.has != nil && pref.has(n)
		if has {
			score += a.memoryMiB
		}
		if pick == nil || score > pickFree || score == pickFree && sent.count < pickSent.count {
			pick, pickFree, pickHas, pickSent = n, score, has, sent
		}
	}
	if pick == nil {
		msg := fmt.Sprintf("no node can take a sandbox of %s", a)
		if len(skipped) > 0 {
			msg += ": " + strings.Join(skipped, ", ")
		}
		return "", "", api.Errorf(api.CodeLimit, "%s", msg)
	}
	why := fmt.Sprintf("the most memory free after it (%d MiB of %d", pick.Load.MemoryFreeMiB-pickSent.memoryMiB-a.memoryMiB, pick.Load.MemoryMiB)
	if pickSent.count > 0 {
		why += ", counting " + pickSent.String()
	}
	why += ")"
	if pickHas {
		why += ", and has " + pref.what + " cached"
	}
	return pick.Name, why, nil
}

// heldOn is the node that alone can make req, "" when any can: a fork's
// checkpoint, or a checkpoint template, is on one node's disk.
func (rt *Router) heldOn(ctx context.Context, req *api.CreateSandbox) string {
	org := auth.Scope(ctx)
	if req.From != nil && req.From.Sandbox != "" {
		if src, err := rt.recs.GetSandbox(ctx, org, req.From.Sandbox); err == nil && src.Pool == "" {
			return src.Node
		}
		return ""
	}
	if req.Template != "" && req.Image == "" && org != "" {
		if held, _ := rt.holders(ctx, org, req.Template); len(held) > 0 {
			return held[0].Name
		}
	}
	return ""
}

// storedFork reports whether req is a fork whose checkpoint is in the
// object store, complete: any node can fetch it, so the operator may pin
// the fork to any node.
func (rt *Router) storedFork(ctx context.Context, req *api.CreateSandbox) bool {
	if rt.stored == nil || req.From == nil || req.From.Sandbox == "" {
		return false
	}
	src, err := rt.recs.GetSandbox(ctx, auth.Scope(ctx), req.From.Sandbox)
	if err != nil {
		return false
	}
	stored, err := rt.stored.Stored(ctx, src.ID, req.From.Checkpoint)
	return err == nil && stored
}

// pinnedWhat names what req makes from, for heldOn's refusal.
func pinnedWhat(req *api.CreateSandbox) string {
	if req.From != nil && req.From.Sandbox != "" {
		return "the fork's checkpoint"
	}
	return fmt.Sprintf("template %q", req.Template)
}
