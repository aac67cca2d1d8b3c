package server

import (
	"context"
	"net/http"
	"strconv"

	"loam.dev/loam/api"
)

// Nodes are the nodes of the daemon's cluster (cluster.Nodes), for the
// operator.
type Nodes interface {
	List(ctx context.Context) ([]api.Node, error)
	// Cordon stops (on) or resumes placements on a node.
	Cordon(ctx context.Context, node string, on bool) (*api.Node, error)
	// Remove declares a node gone for good: its sandboxes are marked
	// error. It returns how many.
	Remove(ctx context.Context, node string) (int, error)
}

// Moves moves sandboxes from node to node through the object store
// (cluster.Moves), for the operator.
type Moves interface {
	// Move moves sandbox ref, this node's, to node to ("" placement's
	// pick), and answers it there.
	Move(r *http.Request, ref, to string) (*api.Sandbox, error)
	// Drain cordons this node and moves every sandbox off it.
	Drain(r *http.Request) (*api.DrainResult, error)
	// PassDrain passes a drain of another node to it, and reports
	// whether it did.
	PassDrain(w http.ResponseWriter, r *http.Request, node string) bool
}

// WithMoves serves moves and drains with m (a node of a cluster with an
// object store).
func WithMoves(m Moves) Option {
	return func(s *Server) { s.moves = m }
}

// Router passes a call about a sandbox another node of the cluster owns
// to that node (cluster.Router).
type Router interface {
	// Forward passes r, an API call about sandbox ref, to its owner, and
	// reports whether it did (false: this node answers it).
	Forward(w http.ResponseWriter, r *http.Request, ref string) bool
	// Place passes r, a create, to the node placement picks, and reports
	// whether it answered it (passed on, or refused).
	Place(w http.ResponseWriter, r *http.Request) bool
	// PlaceTemplate passes r, a POST /v1/templates, to the node that
	// holds its checkpoint, and reports whether it answered it.
	PlaceTemplate(w http.ResponseWriter, r *http.Request) bool
	// ForwardTemplate passes r, a call about checkpoint template name, to
	// the node that keeps it, and reports whether it did.
	ForwardTemplate(w http.ResponseWriter, r *http.Request, name string) bool
	// Client is the client's address of a call a node passed on.
	Client(r *http.Request) (string, bool)
}

// WithRouter passes the calls for other nodes' sandboxes with rt.
func WithRouter(rt Router) Option {
	return func(s *Server) { s.router = rt }
}

// WithNodes serves the nodes' routes with n (a node of a cluster).
func WithNodes(n Nodes) Option {
	return func(s *Server) { s.nodes = n }
}

// nodeRoutes serves the operator the cluster's nodes.
type nodeRoutes struct {
	nodes Nodes
	moves Moves
}

func (nr *nodeRoutes) register(operator addRoute) {
	operator("GET /v1/nodes", api.ScopeAdmin, "", nr.list)
	operator("POST /v1/nodes/{node}/cordon", api.ScopeAdmin, "node.cordon", nr.cordon(true))
	operator("POST /v1/nodes/{node}/uncordon", api.ScopeAdmin, "node.uncordon", nr.cordon(false))
	operator("DELETE /v1/nodes/{node}", api.ScopeAdmin, "node.remove", nr.remove)
	operator("POST /v1/nodes/{node}/drain", api.ScopeAdmin, "node.drain", nr.drain)
	operator("POST /v1/sandboxes/{sandbox}/move", api.ScopeAdmin, "sandbox.move", nr.move)
}

// errNoMoves is the answer of a move or drain on a daemon that cannot
// make one.
var errNoMoves = api.Errorf(api.CodeInvalid, "a move takes a cluster whose nodes share an object store (loam serve --node … --objects …)")

func (nr *nodeRoutes) drain(w http.ResponseWriter, r *http.Request) error {
	if nr.moves == nil {
		return errNoMoves
	}
	if nr.moves.PassDrain(w, r, r.PathValue("node")) {
		return nil
	}
	res, err := nr.moves.Drain(r)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, res)
	return nil
}

func (nr *nodeRoutes) move(w http.ResponseWriter, r *http.Request) error {
	var req api.MoveSandbox
	if err := decodeOptional(w, r, &req); err != nil {
		return err
	}
	if nr.moves == nil {
		return errNoMoves
	}
	sb, err := nr.moves.Move(r, r.PathValue("sandbox"), req.To)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, sb)
	return nil
}

// errAlone is the answer of a change to nodes on a daemon that is none.
var errAlone = api.Errorf(api.CodeInvalid, "this daemon runs alone, not as a node of a cluster (loam serve --node NAME --database postgres://…)")

func (nr *nodeRoutes) list(w http.ResponseWriter, r *http.Request) error {
	list := []api.Node{}
	if nr.nodes != nil {
		var err error
		if list, err = nr.nodes.List(r.Context()); err != nil {
			return err
		}
	}
	api.WriteJSON(w, http.StatusOK, api.NodeList{Nodes: list})
	return nil
}

func (nr *nodeRoutes) cordon(on bool) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		if nr.nodes == nil {
			return errAlone
		}
		n, err := nr.nodes.Cordon(r.Context(), r.PathValue("node"), on)
		if err != nil {
			return err
		}
		api.WriteJSON(w, http.StatusOK, n)
		return nil
	}
}

func (nr *nodeRoutes) remove(w http.ResponseWriter, r *http.Request) error {
	if nr.nodes == nil {
		return errAlone
	}
	force, _ := strconv.ParseBool(r.URL.Query().Get("force"))
	if !force {
		return api.Errorf(api.CodeInvalid, "removing node %s marks every sandbox of it error for good; say so with ?force=true (loam nodes remove NAME --force)", r.PathValue("node"))
	}
	n, err := nr.nodes.Remove(r.Context(), r.PathValue("node"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, api.NodeRemoved{Node: r.PathValue("node"), Sandboxes: n})
	return nil
}
