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
}

func (nr *nodeRoutes) register(operator addRoute) {
	operator("GET /v1/nodes", api.ScopeAdmin, "", nr.list)
	operator("POST /v1/nodes/{node}/cordon", api.ScopeAdmin, "node.cordon", nr.cordon(true))
	operator("POST /v1/nodes/{node}/uncordon", api.ScopeAdmin, "node.uncordon", nr.cordon(false))
	operator("DELETE /v1/nodes/{node}", api.ScopeAdmin, "node.remove", nr.remove)
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
