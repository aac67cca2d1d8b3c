package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// Releaser is the owner's half of a move (checkpoints.Service has it):
// Release hands a sandbox to node to, stopped at a stored checkpoint, and
// answers it and the checkpoint; Reclaim takes it back here from that
// checkpoint when node to could not take it.
type Releaser interface {
	Release(ctx context.Context, ref, to string) (*store.Sandbox, string, error)
	Reclaim(ctx context.Context, id, cp string) (*api.Sandbox, error)
	// Unpin lets a sleeping sandbox go once its sleep image is stored:
	// it is tied to no node, and wakes on any.
	Unpin(ctx context.Context, ref string) (*api.Sandbox, error)
}

// MoveRecords lists a node's sandboxes, for a drain.
type MoveRecords interface {
	ListSandboxes(ctx context.Context, f store.Filter) ([]*store.Sandbox, error)
}

// Moves moves sandboxes from this node to others through the object store
// (loam move, loam nodes drain): the owner stops a sandbox at a memory
// checkpoint and stores it (Releaser), then has the node it goes to
// restore it, which takes it over with the same id, name and URL. Calls
// to it meanwhile wait (Router's awaitMove) and then reach it there.
type Moves struct {
	rt     *Router
	rel    Releaser
	recs   MoveRecords
	cordon func(ctx context.Context, node string, on bool) error
	log    *slog.Logger
}

// NewMoves makes the moves of this node, with rel its checkpoints, recs
// its records and cordon the cluster's cordon (a drain cordons the node
// first). A front end has no rel: it passes drains to their nodes (and
// moves reach the sandbox's node before Move), and drains nothing of its
// own.
func NewMoves(rt *Router, rel Releaser, recs MoveRecords, cordon func(ctx context.Context, node string, on bool) error, log *slog.Logger) *Moves {
	return &Moves{rt: rt, rel: rel, recs: recs, cordon: cordon, log: log}
}

// Move moves sandbox ref, this node's (the API passed the call to its
// owner), to node to, or to the one placement picks for "" (this node
// left out), and answers it as it is there. r is the operator's call:
// its credentials go with the restore asked of that node.
func (m *Moves) Move(r *http.Request, ref, to string) (*api.Sandbox, error) {
	ctx := r.Context()
	self := m.rt.member.Name()
	if m.rel == nil {
		return nil, api.Errorf(api.CodeUnavailable, "front end %s could not pass the move of %s to its node: try again", self, ref)
	}
	if to == "" {
		sb, err := m.rt.recs.GetSandbox(ctx, "", ref)
		if err != nil {
			return nil, api.Errorf(api.CodeNotFound, "sandbox %q not found", ref)
		}
		if to, err = m.target(sb); err != nil {
			return nil, err
		}
	} else if err := m.check(ctx, to); err != nil {
		return nil, err
	}
	start := time.Now()
	sb, cp, err := m.rel.Release(ctx, ref, to)
	if err != nil {
		return nil, err
	}
	released := time.Since(start)
	ctx = context.WithoutCancel(ctx)
	status, body, err := m.rt.Call(r.WithContext(ctx), to, http.MethodPost, "/v1/sandboxes/"+sb.ID+"/checkpoints/"+cp+"/restore", nil)
	if err == nil && status == http.StatusOK {
		var v api.Sandbox
		if err := json.Unmarshal(body, &v); err == nil {
			m.log.Info("moved a sandbox", "sandbox", sb.ID, "name", sb.Name, "from", self, "to", to, "checkpoint", cp,
				"release_ms", released.Milliseconds(), "ms", time.Since(start).Milliseconds())
			return &v, nil
		}
	}
	why := fmt.Sprintf("%d %s", status, body)
	if err != nil {
		why = err.Error()
	}
	m.log.Error("the node a sandbox was handed to did not take it: it runs on here again", "sandbox", sb.ID, "to", to, "answer", why)
	if _, rerr := m.rel.Reclaim(ctx, sb.ID, cp); rerr != nil {
		return nil, api.Errorf(api.CodeUnavailable, "moving %s to node %s failed (%s), and so did taking it back here (%v): restore its checkpoint %s", sb.Name, to, why, rerr, cp)
	}
	return nil, api.Errorf(api.CodeUnavailable, "moving %s to node %s failed (%s): it runs on node %s again", sb.Name, to, why, self)
}

// check refuses a node a sandbox cannot be moved to: none of the
// cluster's, this one, one that does not answer, a front end, or one
// cordoned.
func (m *Moves) check(ctx context.Context, to string) error {
	n := m.rt.node(ctx, to)
	switch {
	case n == nil:
		return api.Errorf(api.CodeInvalid, "to: no node %q in the cluster (loam nodes lists them)", to)
	case to == m.rt.member.Name():
		return api.Errorf(api.CodeInvalid, "to: the sandbox is on node %s already", to)
	case n.Load.Role != RoleNode:
		return api.Errorf(api.CodeInvalid, "to: %s is an API front end (--role api): it runs no sandboxes", to)
	case n.Cordoned:
		return api.Errorf(api.CodeInvalid, "to: node %s is cordoned", to)
	}
	if since, lapsed := m.rt.member.Lapsed(to); lapsed {
		return api.Errorf(api.CodeUnavailable, "node %s stopped answering at %s", to, since.UTC().Format(time.RFC3339))
	}
	return nil
}

// target is the node placement picks for sb, this node left out.
func (m *Moves) target(sb *store.Sandbox) (string, error) {
	nodes, now := m.rt.member.Nodes()
	others := make([]*store.Node, 0, len(nodes))
	for _, n := range nodes {
		if n.Name != m.rt.member.Name() {
			others = append(others, n)
		}
	}
	a := askOf(&sb.Resources)
	node, why, err := best(others, now, a, cachePref{}, m.rt.placed.recent(others))
	if err != nil {
		return "", err
	}
	m.rt.placed.add(node, now, a)
	m.log.Info("placed a sandbox moved off its node", "sandbox", sb.ID, "node", node, "why", why)
	return node, nil
}

// Drain cordons node (this one: the API passes the call to it) and moves
// every sandbox of it, running, sleeping or stopped, to the nodes
// placement picks, one at a time; it answers each one's outcome.
func (m *Moves) Drain(r *http.Request) (*api.DrainResult, error) {
	ctx := r.Context()
	self := m.rt.member.Name()
	if m.rel == nil {
		return nil, api.Errorf(api.CodeInvalid, "node %s is a front end (--role api): it runs no sandboxes to drain", self)
	}
	if err := m.cordon(ctx, self, true); err != nil {
		return nil, err
	}
	sbs, err := m.recs.ListSandboxes(ctx, store.Filter{Node: self})
	if err != nil {
		return nil, err
	}
	res := &api.DrainResult{Node: self, Moved: []api.MovedSandbox{}, Failed: []api.MoveFailure{}}
	start := time.Now()
	for _, sb := range sbs {
		if sb.Pool != "" {
			continue // a warm pool's member: made again where its pool is
		}
		t := time.Now()
		if sb.State == api.StateSleeping {
			// Asleep, it just loses its tie to the node: its image goes
			// to the object store, and it wakes wherever it is used.
			// Should that fail, it is moved as the others are.
			v, err := m.rel.Unpin(ctx, sb.ID)
			if err == nil {
				res.Moved = append(res.Moved, api.MovedSandbox{Name: v.Name, ID: v.ID, To: "", MS: time.Since(t).Milliseconds()})
				continue
			}
			m.log.Warn("letting a sleeping sandbox go: moving it instead", "sandbox", sb.ID, "err", err)
		}
		to, err := m.target(sb)
		var v *api.Sandbox
		if err == nil {
			v, err = m.Move(r, sb.ID, to)
		}
		if err != nil {
			res.Failed = append(res.Failed, api.MoveFailure{Name: sb.Name, ID: sb.ID, Error: m.errOf(sb, err)})
			continue
		}
		res.Moved = append(res.Moved, api.MovedSandbox{Name: v.Name, ID: v.ID, To: v.Node, MS: time.Since(t).Milliseconds()})
	}
	m.log.Info("drained the node", "node", self, "moved", len(res.Moved), "failed", len(res.Failed), "ms", time.Since(start).Milliseconds())
	return res, nil
}

// PassDrain passes a drain of node, another than this one, to it, and
// reports whether it did (false: this node is the one).
func (m *Moves) PassDrain(w http.ResponseWriter, r *http.Request, node string) bool {
	if node == m.rt.member.Name() {
		return false
	}
	n := m.rt.node(r.Context(), node)
	if n == nil {
		api.WriteError(w, api.Errorf(api.CodeNotFound, "no node %q in the cluster (loam nodes lists them)", node))
		return true
	}
	if since, lapsed := m.rt.member.Lapsed(node); lapsed {
		api.WriteError(w, api.Errorf(api.CodeUnavailable, "node %s stopped answering at %s: a drain moves sandboxes off a node that answers (bring back a lost node's by restoring their stored checkpoints)", node, since.UTC().Format(time.RFC3339)))
		return true
	}
	return m.rt.passTo(w, r, n)
}

// errOf is err as a drain's answer shows it: an API error as it is, any
// other (logged) as internal.
func (m *Moves) errOf(sb *store.Sandbox, err error) *api.Error {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae
	}
	m.log.Error("moving a sandbox off a node being drained", "sandbox", sb.ID, "err", err)
	return api.Errorf(api.CodeInternal, "internal error moving %s (the node's log says more)", sb.Name)
}
