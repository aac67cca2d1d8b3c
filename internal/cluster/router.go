package cluster

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/netdial"
	"loam.dev/loam/internal/store"
)

// Headers of a call one node passes to another (Router).
const (
	// RoutedByHeader names the node that passed the call on.
	RoutedByHeader = "X-Loam-Routed-By"
	// RoutedHeader is the node credential: "MS.MAC", the time it was
	// passed on (Unix milliseconds) and an HMAC-SHA256, under the
	// cluster's node key, of the node, that time, the method, the host and
	// the path.
	RoutedHeader = "X-Loam-Routed"
)

// routedSkew is how far a routed call's time may be from the receiver's.
const routedSkew = time.Minute

// SandboxRecords is what the router reads of the shared records: a
// sandbox's owner, and the image a create names (placement prefers a node
// that has it cached).
type SandboxRecords interface {
	GetSandbox(ctx context.Context, org, ref string) (*store.Sandbox, error)
	// GetImage is org's image record by id (image.ID of its canonical
	// reference); store.ErrNotFound when org has not pulled it.
	GetImage(ctx context.Context, org, id string) (*store.Image, error)
}

// Router passes a call for a sandbox another node owns to that node: the
// API's calls (REST, WebSockets, file streams) and the requests to its URL.
// The caller's own credentials go with the call, and the owner checks
// them against the shared records as it would a call made to it; the
// node credential (RoutedHeader) only marks the call as passed on by a
// node of the cluster, so that it is never passed on again and its
// client's address (X-Forwarded-For) is believed.
type Router struct {
	member *Member
	recs   SandboxRecords
	key    []byte
	log    *slog.Logger
	rp     *httputil.ReverseProxy
	// stored, when set, says which checkpoints any node can fetch.
	stored StoredCheckpoints
	// placed is what placement put on each node since its last report.
	placed placed
}

type targetKey struct{}

// target is where a call is passed to.
type target struct {
	node string
	url  *url.URL
	api  bool // an API call (JSON errors), else a sandbox URL's request
}

// NewRouter makes the router of member's node, finding owners in recs
// and signing with key, the cluster's node key.
func NewRouter(member *Member, recs SandboxRecords, key []byte, log *slog.Logger) *Router {
	rt := &Router{member: member, recs: recs, key: key, log: log}
	tr := &http.Transport{
		Proxy: nil,
		// A node gone silent (down, or its link dropped) fails a call
		// in seconds rather than hanging it.
		DialContext:           netdial.Dialer().DialContext,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       50 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     true,
	}
	rt.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(targetKey{}).(*target)
			pr.SetURL(t.url)
			// The owner's mux tells a sandbox's URL from the API by Host.
			pr.Out.Host = pr.In.Host
			// A call that came through a proxy already keeps its chain.
			pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
			pr.SetXForwarded()
			rt.sign(pr.Out)
		},
		Transport: tr,
		// Streams (exec output, logs, downloads) pass at once.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t := r.Context().Value(targetKey{}).(*target)
			if errors.Is(r.Context().Err(), context.Canceled) {
				return // the client left
			}
			rt.log.Warn("passing a call to its sandbox's node", "node", t.node, "path", r.URL.Path, "err", err)
			msg := fmt.Sprintf("the sandbox is on node %s, which did not answer (%s): try again", t.node, errText(err))
			if t.api {
				api.WriteError(w, api.Errorf(api.CodeUnavailable, "%s", msg))
				return
			}
			http.Error(w, msg, http.StatusBadGateway)
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return rt
}

func errText(err error) string {
	var op *net.OpError
	if errors.As(err, &op) {
		return op.Err.Error()
	}
	return err.Error()
}

// mac is the node credential's MAC of a call.
func (rt *Router) mac(node, ms, method, host, path string) string {
	m := hmac.New(sha256.New, rt.key)
	for _, s := range []string{node, ms, method, host, path} {
		m.Write([]byte(s))
		m.Write([]byte{0})
	}
	return hex.EncodeToString(m.Sum(nil))
}

// sign marks r as passed on by this node.
func (rt *Router) sign(r *http.Request) {
	ms := strconv.FormatInt(time.Now().UnixMilli(), 10)
	r.Header.Set(RoutedByHeader, rt.member.Name())
	r.Header.Set(RoutedHeader, ms+"."+rt.mac(rt.member.Name(), ms, r.Method, r.Host, r.URL.Path))
}

// Routed reports whether r was passed on by a node of the cluster (its
// node credential checks out), and by which.
func (rt *Router) Routed(r *http.Request) (node string, ok bool) {
	node = r.Header.Get(RoutedByHeader)
	ms, sum, found := strings.Cut(r.Header.Get(RoutedHeader), ".")
	if node == "" || !found {
		return "", false
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return "", false
	}
	if d := time.Since(time.UnixMilli(n)); d > routedSkew || d < -routedSkew {
		return "", false
	}
	want := rt.mac(node, ms, r.Method, r.Host, r.URL.Path)
	if !hmac.Equal([]byte(want), []byte(sum)) {
		return "", false
	}
	return node, true
}

// Client is the address of the client of r: the first X-Forwarded-For of
// a call a node passed on, else r's peer.
func (rt *Router) Client(r *http.Request) (string, bool) {
	if _, ok := rt.Routed(r); !ok {
		return "", false
	}
	xff := r.Header.Get("X-Forwarded-For")
	first, _, _ := strings.Cut(xff, ",")
	first = strings.TrimSpace(first)
	if first == "" {
		return "", false
	}
	return first, true
}

// Forward passes an API call about sandbox ref (of the caller's org, in
// r's context) to the node that owns it, and reports whether it did. It
// does not when this node owns it, when the call was passed on already,
// or when the owner stopped answering (the records answer reads here, and
// the sandbox's Manager refuses the rest, naming the node).
func (rt *Router) Forward(w http.ResponseWriter, r *http.Request, ref string) bool {
	return rt.forward(w, r, auth.Scope(r.Context()), ref, true)
}

// ForwardURL is Forward for a request to the URL of sandbox name of org.
func (rt *Router) ForwardURL(w http.ResponseWriter, r *http.Request, org, name string) bool {
	return rt.forward(w, r, org, name, false)
}

func (rt *Router) forward(w http.ResponseWriter, r *http.Request, org, ref string, isAPI bool) bool {
	if _, ok := rt.Routed(r); ok {
		return false
	}
	sb, err := rt.recs.GetSandbox(r.Context(), org, ref)
	if err == nil && sb.Handover != "" && sb.Handover != store.AnyNode {
		// A move is under way: the call waits for its end, then goes
		// where the sandbox is (as calls wait during a restore).
		sb, err = rt.awaitMove(r.Context(), org, sb)
	}
	if err == nil {
		if n := rt.wakeNode(sb); n != nil {
			u, err := parseAddress(n)
			if err == nil {
				rt.proxy(w, r, n.Name, u, isAPI)
				return true
			}
		}
	}
	if err != nil || sb.Node == "" || sb.Node == rt.member.Name() || sb.Pool != "" {
		// Not found, or the store cannot say: this node answers, as it
		// would alone. One asleep on no node (store.AnyNode) wakes here.
		return false
	}
	return rt.toNode(w, r, sb.Node, isAPI)
}

// toNode passes r to node, unless it stopped answering or has no
// address that is a URL, and reports whether it did.
func (rt *Router) toNode(w http.ResponseWriter, r *http.Request, node string, isAPI bool) bool {
	if _, lapsed := rt.member.Lapsed(node); lapsed {
		return false
	}
	n := rt.node(r.Context(), node)
	if n == nil {
		return false
	}
	u, err := parseAddress(n)
	if err != nil {
		rt.log.Error("a node's address is not a URL", "node", n.Name, "address", n.Address, "err", err)
		return false
	}
	rt.proxy(w, r, n.Name, u, isAPI)
	return true
}

// ReforwardURL passes a request for the URL of sandbox name of org that
// moved to another node while the request was on its way to this one
// (sandbox.Elsewhere) to that node, even if it was passed here already,
// and reports whether it did: not when the record names no node, this
// one, the node that passed it here (no request goes back and forth), or
// one that stopped answering.
func (rt *Router) ReforwardURL(w http.ResponseWriter, r *http.Request, org, name string) bool {
	sb, err := rt.recs.GetSandbox(r.Context(), org, name)
	if err == nil && sb.Handover != "" && sb.Handover != store.AnyNode {
		sb, err = rt.awaitMove(r.Context(), org, sb)
	}
	if err != nil || sb.Node == "" || sb.Node == rt.member.Name() || sb.Pool != "" {
		return false
	}
	if from, ok := rt.Routed(r); ok && from == sb.Node {
		return false
	}
	rt.log.Info("passing on a request for a sandbox that moved meanwhile", "sandbox", sb.ID, "to", sb.Node)
	return rt.toNode(w, r, sb.Node, false)
}

// wakeNode is the node a call for sb goes to when sb sleeps on no node
// that answers (its node stopped answering, or it is tied to none,
// store.AnyNode), so that it wakes there from its stored image (see
// sandbox's adopt), and this node cannot take it: a front end, a node
// cordoned (one being drained), or one short of room for it. nil when
// this node takes it, or sb is not such a sandbox.
func (rt *Router) wakeNode(sb *store.Sandbox) *store.Node {
	if sb.State != api.StateSleeping || sb.Pool != "" || sb.Node == rt.member.Name() {
		return nil
	}
	if sb.Node != "" || sb.Handover != store.AnyNode {
		if _, lapsed := rt.member.Lapsed(sb.Node); !lapsed {
			return nil
		}
	}
	nodes, now := rt.member.Nodes()
	a := askOf(&sb.Resources)
	sent := rt.placed.recent(nodes)
	if self := rt.member.Node(rt.member.Name()); self != nil && self.Load.Role == RoleNode && !self.Cordoned && a.short(self, sent[self.Name]) == "" {
		return nil
	}
	others := make([]*store.Node, 0, len(nodes))
	for _, n := range nodes {
		if n.Name != rt.member.Name() && n.Name != sb.Node {
			others = append(others, n)
		}
	}
	name, _, err := best(others, now, a, cachePref{}, sent)
	if err != nil {
		return nil // none can: this node answers, and says why
	}
	return rt.member.Node(name)
}

// moveWait bounds how long a call waits for a move of its sandbox.
const moveWait = 5 * time.Minute

// awaitMove waits until the move of sb is over (its record hands it to
// no node any more), reading the record again every 100 ms, and answers
// it as it then is; on ctx's end, or after moveWait, the last reading.
func (rt *Router) awaitMove(ctx context.Context, org string, sb *store.Sandbox) (*store.Sandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, moveWait)
	defer cancel()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for sb.Handover != "" && sb.Handover != store.AnyNode {
		select {
		case <-ctx.Done():
			return sb, nil
		case <-t.C:
		}
		next, err := rt.recs.GetSandbox(ctx, org, sb.ID)
		if err != nil {
			return nil, err
		}
		sb = next
	}
	return sb, nil
}

// Call makes an API call of the caller of r (its credentials go with it)
// to node, signed as passed on by this node, and answers its status and
// body: how a move has the node it hands a sandbox to restore it there.
func (rt *Router) Call(r *http.Request, node, method, path string, body []byte) (int, []byte, error) {
	n := rt.node(r.Context(), node)
	u, err := parseAddress(n)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequestWithContext(r.Context(), method, u.JoinPath(path).String(), bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	for _, h := range []string{"Authorization", "Cookie"} {
		if v := r.Header.Values(h); len(v) > 0 {
			req.Header[h] = v
		}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Host = r.Host
	rt.sign(req)
	res, err := rt.rp.Transport.RoundTrip(req)
	if err != nil {
		return 0, nil, api.Errorf(api.CodeUnavailable, "node %s did not answer (%s)", node, errText(err))
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 16<<20))
	return res.StatusCode, b, err
}

// node is the node called name, read again when the last reading does
// not have it (it joined since).
func (rt *Router) node(ctx context.Context, name string) *store.Node {
	if n := rt.member.Node(name); n != nil {
		return n
	}
	if err := rt.member.readNodes(ctx); err != nil {
		return nil
	}
	return rt.member.Node(name)
}

// parseAddress is node n's address (--advertise) as a URL.
func parseAddress(n *store.Node) (*url.URL, error) {
	if n == nil {
		return nil, api.Errorf(api.CodeUnavailable, "the node is not in the cluster any more")
	}
	u, err := url.Parse(n.Address)
	if err != nil || u.Host == "" {
		return nil, api.Errorf(api.CodeUnavailable, "node %s's address %q is not a URL", n.Name, n.Address)
	}
	return u, nil
}

// proxy passes r to node at u.
func (rt *Router) proxy(w http.ResponseWriter, r *http.Request, node string, u *url.URL, isAPI bool) {
	if r.Header.Get("Upgrade") != "" {
		// The owner's answer says how the connection goes on (Upgrade),
		// not a close set before the call was known to be one.
		w.Header().Del("Connection")
	}
	// The owner keeps the call's own timeouts; this node only relays, and
	// must not cut a long upload or stream by its own.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	ctx := context.WithValue(r.Context(), targetKey{}, &target{node: node, url: u, api: isAPI})
	rt.rp.ServeHTTP(w, r.WithContext(ctx))
}
