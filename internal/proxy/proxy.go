// Package proxy is loam's URL front door: it serves each sandbox's
// http_port at the sandbox's URL, NAME--ORG.DOMAIN, on the API's own
// listener, routed by the request's Host. Any method, streamed bodies and
// WebSocket upgrades pass through (httputil.ReverseProxy). Requests sent
// while a sandbox is being created or restored wait for it (see
// sandbox.Manager.HTTPTarget) and are answered by the new machine.
//
// Connections go from the host straight to the sandbox's address and
// http_port over its veth: the firewall lets the host's connections into
// its sandboxes, and a direct TCP connection costs about half of a port
// stream through the agent (one WebSocket, and the agent's copy, per
// connection; see BenchmarkURL). Only when the direct connection is refused
// (a server that listens on the sandbox's loopback only) is a port stream
// used instead.
package proxy

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/conns"
	"loam.dev/loam/internal/sandbox"
)

// Targets finds where a sandbox's requests go: the sandbox core
// (sandbox.Manager) and, for port streams, the guest data plane (package
// guest).
type Targets interface {
	// HTTPTarget is the sandbox named name of org, running, waiting while it is
	// created or restored; not_found when there is none, unavailable
	// when it cannot serve (sleeping, stopped, …).
	// admit is asked first, before any wait or wake, and its error is
	// returned as it is.
	HTTPTarget(ctx context.Context, org, name string, admit func(sandbox.Target) error) (sandbox.Target, error)
	// DialPort opens a port stream: a connection made inside the sandbox
	// by its agent, for servers that listen on its loopback only.
	DialPort(ctx context.Context, ref string, port int) (*sandbox.Stream, error)
	// Active marks sandbox id active until release is called, so that
	// a long response or a WebSocket keeps it from falling asleep.
	Active(id string) (release func())
}

// Names of what a client presents to open a private sandbox's URL.
const (
	// TokenHeader carries the sandbox's access token (or the API token).
	TokenHeader = "X-Loam-Access-Token"
	// TokenParam carries it once in the query string; the answer is a
	// redirect to the same URL without it, setting TokenCookie.
	TokenParam = "loam_token"
	// TokenCookie keeps the sandbox's access token in a browser, for its
	// URL's host only.
	TokenCookie = "loam_access"
)

// Config is the front door's configuration.
type Config struct {
	// Domain and Org make URLs: NAME--ORG.DOMAIN. A port in Domain, or in
	// the request's Host, is not compared: the listener is the daemon's.
	Domain, Org string
	// Token is the admin (API) token, which opens every sandbox's URL;
	// Keys's admin token opens them too.
	Token string
	// Keys, when set, lets API keys open URLs too: a key of scope write
	// or admin opens the URLs of the sandboxes its labels select (all of
	// its org's when it has none). A read key opens none.
	Keys Authenticator
	// TLS is true when the listener serves TLS: the cookie is then Secure.
	TLS bool
	// Forward, in a cluster, passes a request for the URL of a sandbox
	// another node owns to that node, whose front door decides it; false
	// when this node is the one to (cluster.Router.ForwardURL).
	Forward func(w http.ResponseWriter, r *http.Request, org, name string) bool
	// Reforward, in a cluster, passes a request for the URL of a sandbox
	// that moved to another node while the request was on its way here
	// (sandbox.Elsewhere) to that node, even one passed here already;
	// false when it cannot (cluster.Router.ReforwardURL).
	Reforward func(w http.ResponseWriter, r *http.Request, org, name string) bool
	// BodyTimeout is how long a client may send nothing of a request body
	// passed to a sandbox before the request fails; 0 is no limit. It
	// replaces the server's read timeout, which would cut off a long
	// upload whatever its pace.
	BodyTimeout time.Duration
}

// Handler is the URL front door.
type Handler struct {
	targets Targets
	cfg     Config
	suffix  string // "." + DOMAIN without its port, lower case
	log     *slog.Logger
	rp      *httputil.ReverseProxy
	tr      *http.Transport

	mu sync.Mutex
	// seen is, for each sandbox address, the sandbox and epoch last sent
	// a request there (see fresh).
	seen map[netip.AddrPort]seenTarget
	// gates pace the requests released together after a hold, per
	// sandbox address (see pace).
	gates map[netip.AddrPort]chan struct{}
}

// heldAtOnce is how many requests held during a create or restore are sent
// to the new machine at once; the rest wait for their answers' headers.
// Servers with a short accept queue (python's http.server keeps 5) reset
// connections beyond it when a burst arrives all together.
const heldAtOnce = 4

type seenTarget struct {
	id    string
	epoch uint64
}

// New makes the front door.
func New(targets Targets, cfg Config, log *slog.Logger) *Handler {
	h := &Handler{targets: targets, cfg: cfg, log: log, seen: map[netip.AddrPort]seenTarget{}, gates: map[netip.AddrPort]chan struct{}{}}
	h.suffix = "." + strings.ToLower(stripPort(cfg.Domain))
	tr := &http.Transport{
		// Never a proxy from the environment: the sandboxes are local.
		Proxy:                 nil,
		DialContext:           h.dial,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       60 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	h.tr = tr
	h.rp = &httputil.ReverseProxy{
		Rewrite:       h.rewrite,
		Transport:     &retrier{base: tr, h: h},
		FlushInterval: -1,
		ErrorHandler:  h.proxyError,
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	return h
}

// dial connects to a sandbox's server: straight to its address, or, when
// that is refused (a server that listens on the sandbox's loopback only),
// through a port stream. A memory checkpoint or a restore ends the
// connections made the second way.
func (h *Handler) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	c, err := d.DialContext(ctx, network, addr)
	if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		return c, err
	}
	t, ok := ctx.Value(ctxKey{}).(sandbox.Target)
	if !ok || t.Addr.String() != addr {
		return nil, err
	}
	st, serr := h.targets.DialPort(ctx, t.ID, int(t.Addr.Port()))
	if serr != nil {
		h.log.Debug("no port stream either", "sandbox", t.ID, "err", serr)
		return nil, err
	}
	// The connection outlives the dial's context: it may be kept alive.
	return &streamConn{Conn: websocket.NetConn(context.Background(), st.Agent(), websocket.MessageBinary), st: st}, nil
}

// streamConn is a connection carried by a port stream.
type streamConn struct {
	net.Conn
	st *sandbox.Stream
}

func (c *streamConn) Close() error {
	err := c.Conn.Close()
	c.st.Close()
	return err
}

// stripPort is host without its port, if it has one.
func stripPort(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		return h
	}
	return host
}

// Match tells whether host (a request's Host) is a sandbox's URL, and
// whose: NAME--ORG.DOMAIN, in any case, with any port or none. An org's
// name never holds "--", so the last one separates the two.
func (h *Handler) Match(host string) (name, org string, ok bool) {
	host = strings.ToLower(strings.TrimSuffix(stripPort(host), "."))
	label, ok := strings.CutSuffix(host, h.suffix)
	if !ok || strings.Contains(label, ".") {
		return "", "", false
	}
	i := strings.LastIndex(label, "--")
	if i <= 0 || i+2 == len(label) {
		return "", "", false
	}
	return label[:i], label[i+2:], true
}

// Mount is the daemon's handler: requests for a sandbox's URL go to the
// front door, every other one to api.
func (h *Handler) Mount(api http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name, org, ok := h.Match(r.Host); ok {
			h.serve(w, r, org, name)
			return
		}
		api.ServeHTTP(w, r)
	})
}

type ctxKey struct{}

// errDenied is the admit error of a request that may not use the URL.
var errDenied = errors.New("denied")

// ServeHTTP serves a request for a sandbox's URL; any other Host is a 404.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name, org, ok := h.Match(r.Host)
	if !ok {
		h.page(w, http.StatusNotFound, "Not a sandbox's URL", fmt.Sprintf("%s is not the URL of a sandbox here.", r.Host))
		return
	}
	h.serve(w, r, org, name)
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request, org, name string) {
	if h.cfg.Forward != nil && h.cfg.Forward(w, r, org, name) {
		return
	}
	start := time.Now()
	// Access is decided before the sandbox is woken or waited for: a
	// request that may not use a private sandbox's URL leaves it asleep.
	var v verdict
	t, err := h.targets.HTTPTarget(r.Context(), org, name, func(t sandbox.Target) error {
		if h.foreign(r, t) {
			// A key of another org finds no sandbox here, as it would
			// find none through the API: names do not leak across orgs.
			return api.Errorf(api.CodeNotFound, "sandbox %q not found", name)
		}
		if v = h.allow(r, t); v == denied {
			return errDenied
		}
		return nil
	})
	if errors.Is(err, errDenied) {
		h.page(w, http.StatusUnauthorized, "Private sandbox",
			fmt.Sprintf("Sandbox %s is private. Open its URL with ?%s=ACCESS_TOKEN once (loam url %s shows it), or send the header %s.",
				name, TokenParam, name, TokenHeader))
		return
	}
	var moved *sandbox.Elsewhere
	if errors.As(err, &moved) && h.cfg.Reforward != nil && h.cfg.Reforward(w, r, org, name) {
		return
	}
	if err != nil {
		h.targetError(w, r, name, err)
		return
	}
	// Past the front door: the connection may be kept alive.
	conns.KeepAlive(w)
	switch v {
	case redirect:
		h.setCookie(w, t)
		u := *r.URL
		q := u.Query()
		q.Del(TokenParam)
		u.RawQuery = q.Encode()
		http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
		return
	case newCookie:
		h.setCookie(w, t)
	}
	// The body may take as long as it keeps coming.
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = newPacedBody(w, r, h.cfg.BodyTimeout)
	}
	h.fresh(t)
	// The sandbox is in use for as long as the exchange lasts: a WebSocket
	// or a streamed response keeps it awake, whatever its idle time.
	release := h.targets.Active(t.ID)
	defer release()
	r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, t))
	h.rp.ServeHTTP(w, r)
	h.log.Debug("url request", "sandbox", t.ID, "method", r.Method, "path", r.URL.Path, "ms", time.Since(start).Milliseconds())
}

// verdict is what allow decides.
type verdict int

const (
	denied    verdict = iota
	allowed           // pass the request on
	newCookie         // pass it on and set the cookie (a request with ?loam_token= that is not a GET)
	redirect          // set the cookie and redirect to the URL without ?loam_token=
)

// allow decides whether r may use t's URL: a public sandbox's by anyone; a
// private one's with its access token or the API token, in the header, the
// query (once) or the cookie.
func (h *Handler) allow(r *http.Request, t sandbox.Target) verdict {
	ctx := r.Context()
	if q := r.URL.Query(); q.Has(TokenParam) && h.opens(ctx, q.Get(TokenParam), t) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			return redirect
		}
		return newCookie
	}
	if t.Public {
		return allowed
	}
	if h.opens(ctx, r.Header.Get(TokenHeader), t) {
		return allowed
	}
	if bearer, ok := api.BearerToken(r.Header); ok && h.isOurs(ctx, bearer) && h.opens(ctx, bearer, t) {
		return allowed
	}
	if c, err := r.Cookie(TokenCookie); err == nil && h.opens(ctx, c.Value, t) {
		return allowed
	}
	return denied
}

// Authenticator finds who an API token belongs to (internal/auth.Keys).
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (auth.Principal, error)
}

// opens tells whether tok opens t's URL: its access token, the API token,
// or an API key that may (see Config.Keys).
func (h *Handler) opens(ctx context.Context, tok string, t sandbox.Target) bool {
	if tok == "" {
		return false
	}
	if subtle.ConstantTimeCompare([]byte(tok), []byte(t.AccessToken)) == 1 || h.isAdmin(ctx, tok) {
		return true
	}
	if h.cfg.Keys == nil || !strings.HasPrefix(tok, api.KeyPrefix) {
		return false
	}
	p, err := h.cfg.Keys.Authenticate(ctx, tok)
	return err == nil && p.Allows(api.ScopeWrite) && p.Org == t.Org && p.Matches(t.Labels)
}

// foreign reports whether r presents a valid API key of an org other than
// t's, where a key opens a URL: the header, the query or the bearer.
func (h *Handler) foreign(r *http.Request, t sandbox.Target) bool {
	if h.cfg.Keys == nil {
		return false
	}
	toks := []string{r.URL.Query().Get(TokenParam), r.Header.Get(TokenHeader)}
	if bearer, ok := api.BearerToken(r.Header); ok {
		toks = append(toks, bearer)
	}
	for _, tok := range toks {
		if !strings.HasPrefix(tok, api.KeyPrefix) {
			continue
		}
		if p, err := h.cfg.Keys.Authenticate(r.Context(), tok); err == nil && p.Org != t.Org {
			return true
		}
	}
	return false
}

// isAdmin reports whether tok is the admin token: Token, or Keys's (a
// cluster's nodes know it by its hash alone).
func (h *Handler) isAdmin(ctx context.Context, tok string) bool {
	if h.cfg.Token != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(h.cfg.Token)) == 1 {
		return true
	}
	if h.cfg.Keys == nil || tok == "" || strings.HasPrefix(tok, api.KeyPrefix) {
		return false
	}
	p, err := h.cfg.Keys.Authenticate(ctx, tok)
	return err == nil && p.Operator
}

// isOurs reports whether tok is a credential of loam's API (the admin
// token, or anything shaped as an API key, valid or not): it never goes
// on to the sandbox.
func (h *Handler) isOurs(ctx context.Context, tok string) bool {
	return h.isAdmin(ctx, tok) || strings.HasPrefix(tok, api.KeyPrefix)
}

// setCookie keeps the sandbox's access token (never the API token) in the
// browser, for this host only.
func (h *Handler) setCookie(w http.ResponseWriter, t sandbox.Target) {
	http.SetCookie(w, &http.Cookie{
		Name: TokenCookie, Value: t.AccessToken, Path: "/",
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: h.cfg.TLS,
	})
}

// rewrite sends the request to the sandbox, with the client's Host, and
// without what opened the URL: the sandbox sees none of loam's tokens.
func (h *Handler) rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(ctxKey{}).(sandbox.Target)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = t.Addr.String()
	pr.Out.Host = pr.In.Host
	pr.SetXForwarded()
	h.strip(pr.Out)
}

// strip removes loam's credentials from a request bound for a sandbox: the
// access token header, query parameter and cookie, and an Authorization
// header that carries the API token (any other is the sandbox app's own).
func (h *Handler) strip(r *http.Request) {
	r.Header.Del(TokenHeader)
	if bearer, ok := api.BearerToken(r.Header); ok && h.isOurs(r.Context(), bearer) {
		r.Header.Del("Authorization")
	}
	if q := r.URL.Query(); q.Has(TokenParam) {
		q.Del(TokenParam)
		r.URL.RawQuery = q.Encode()
	}
	if cookies := r.Cookies(); len(cookies) > 0 {
		r.Header.Del("Cookie")
		var keep []string
		for _, c := range cookies {
			if c.Name != TokenCookie {
				keep = append(keep, c.String())
			}
		}
		if len(keep) > 0 {
			r.Header.Set("Cookie", strings.Join(keep, "; "))
		}
	}
}

// targetError answers a request whose sandbox cannot be reached.
func (h *Handler) targetError(w http.ResponseWriter, r *http.Request, name string, err error) {
	var ae *api.Error
	switch {
	case errors.As(err, &ae) && ae.Code == api.CodeNotFound:
		h.page(w, http.StatusNotFound, "No such sandbox", fmt.Sprintf("There is no sandbox named %s here.", name))
	case errors.As(err, &ae) && ae.Code == api.CodeUnavailable:
		w.Header().Set("Retry-After", "5")
		h.page(w, http.StatusServiceUnavailable, "Sandbox unavailable", ae.Message+".")
	case r.Context().Err() != nil:
		// The client went away while the request was held.
	default:
		h.log.Error("finding a sandbox for its URL", "name", name, "err", err)
		h.page(w, http.StatusInternalServerError, "Internal error", "loam could not look the sandbox up; see the daemon's log.")
	}
}

// proxyError answers a request the sandbox did not answer.
func (h *Handler) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	t := r.Context().Value(ctxKey{}).(sandbox.Target)
	var moved *sandbox.Elsewhere
	if errors.As(err, &moved) && h.cfg.Reforward != nil && (r.Body == nil || r.Body == http.NoBody || r.GetBody != nil) {
		// It moved while the request was sent to it (the retrier found
		// it elsewhere): the request goes on to its new node.
		if r.GetBody != nil {
			if body, berr := r.GetBody(); berr == nil {
				r.Body = body
			}
		}
		if h.cfg.Reforward(w, r, t.Org, t.Name) {
			return
		}
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		h.targetError(w, r, t.Name, err)
		return
	}
	if r.Context().Err() != nil {
		return
	}
	h.log.Info("url request failed", "sandbox", t.ID, "err", err)
	h.page(w, http.StatusBadGateway, "Nothing answers",
		fmt.Sprintf("Sandbox %s is running, but nothing answered on its port %d. Is its server started, and listening on port %d?",
			t.Name, t.Addr.Port(), t.Addr.Port()))
}

// page writes a small HTML page for a browser.
func (h *Handler) page(w http.ResponseWriter, status int, title, msg string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Loam-Error", strings.ToLower(strings.ReplaceAll(title, " ", "-")))
	w.WriteHeader(status)
	fmt.Fprintf(w, `<!doctype html>
<html><head><meta charset="utf-8"><title>%d %s</title></head>
<body style="font-family:sans-serif;max-width:40em;margin:4em auto">
<h1>%s</h1>
<p>%s</p>
<p style="color:#888">loam</p>
</body></html>
`, status, html.EscapeString(title), html.EscapeString(title), html.EscapeString(msg))
}

// fresh makes sure no kept-alive connection to a machine that t's has
// replaced is used for t: after a restore (a new epoch) or a new sandbox
// at the same address, idle connections were made to the old machine and
// would be answered with a reset. They are all dropped, as the Manager
// drops its agent connections: the next requests dial afresh, which costs
// little, and restores are rare beside requests.
func (h *Handler) fresh(t sandbox.Target) {
	now := seenTarget{t.ID, t.Epoch}
	h.mu.Lock()
	before, ok := h.seen[t.Addr]
	h.seen[t.Addr] = now
	h.mu.Unlock()
	if ok && before != now {
		h.tr.CloseIdleConnections()
	}
}

// pace takes a place among the requests sent to t after a hold (none is
// needed for others); the returned func gives it back.
func (h *Handler) pace(ctx context.Context, t sandbox.Target) (func(), error) {
	if !t.Held {
		return func() {}, nil
	}
	h.mu.Lock()
	g, ok := h.gates[t.Addr]
	if !ok {
		g = make(chan struct{}, heldAtOnce)
		h.gates[t.Addr] = g
	}
	h.mu.Unlock()
	select {
	case g <- struct{}{}:
		return func() { <-g }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// retrier sends a request again when the machine it was sent to has been
// replaced meanwhile (a restore began after the request was held, or cut
// its connection): it waits for the new machine (HTTPTarget) and sends the
// request to it, if the request has no body to replay. A safe request
// (GET, HEAD, OPTIONS) whose connection was reset is sent again too.
type retrier struct {
	base http.RoundTripper
	h    *Handler
}

// maxRetries bounds how many replaced machines one request follows.
const maxRetries = 3

func (rt *retrier) RoundTrip(req *http.Request) (*http.Response, error) {
	t, _ := req.Context().Value(ctxKey{}).(sandbox.Target)
	for i := 0; ; i++ {
		done, err := rt.h.pace(req.Context(), t)
		if err != nil {
			return nil, err
		}
		resp, err := rt.base.RoundTrip(req)
		done()
		if err == nil || i == maxRetries || t.Name == "" || req.Context().Err() != nil ||
			(req.Body != nil && req.Body != http.NoBody && req.GetBody == nil) {
			return resp, err
		}
		if errors.Is(err, syscall.ECONNRESET) && (req.Method == http.MethodGet || req.Method == http.MethodHead || req.Method == http.MethodOptions) {
			// A server with a short accept queue (python's http.server
			// keeps 5) resets connections when the requests held during a
			// restore all arrive at once: a safe request tries again.
			time.Sleep(time.Duration(i+1) * 25 * time.Millisecond)
			continue
		}
		next, terr := rt.h.targets.HTTPTarget(req.Context(), t.Org, t.Name, nil)
		if terr != nil {
			return nil, terr
		}
		if next.ID != t.ID || next.Epoch == t.Epoch {
			return nil, err
		}
		t = next
		rt.h.fresh(t)
		req = req.Clone(req.Context())
		req.URL.Host = t.Addr.String()
		if req.GetBody != nil {
			if req.Body, err = req.GetBody(); err != nil {
				return nil, err
			}
		}
	}
}

// pacedBody is a request's body as the sandbox's server is sent it. It
// reads with a read deadline renewed at every read: a client that sends
// nothing for timeout fails the request, one that keeps sending may take
// as long as it needs.
//
// And it reports the end of a body the server already drained as the end.
// When the answer's header is written, the HTTP/1 server drains what is
// left of the request's body and closes it. The Transport, once it has
// sent the declared length, reads once more to check that nothing follows;
// a server that answers at once (most do, once they have the body) makes
// that read come after the close. It would fail with ErrBodyReadAfterClose,
// fail the request's write, and the Transport would close the connection
// under the answer on its way: the client got a 200 and then a cut body
// (golang/go#40747; seen as TestURL's POST ending in "unexpected EOF").
type pacedBody struct {
	io.ReadCloser
	rc      *http.ResponseController
	timeout time.Duration
	// left is what the declared length has left to read; -1 when there
	// is none (a chunked body).
	left int64
}

func newPacedBody(w http.ResponseWriter, r *http.Request, timeout time.Duration) io.ReadCloser {
	rc := http.NewResponseController(w)
	if timeout <= 0 {
		// Not every ResponseWriter has deadlines (a test's recorder).
		_ = rc.SetReadDeadline(time.Time{})
	}
	left := r.ContentLength
	if left < 0 {
		left = -1
	}
	return &pacedBody{ReadCloser: r.Body, rc: rc, timeout: timeout, left: left}
}

func (b *pacedBody) Read(p []byte) (int, error) {
	if b.timeout > 0 {
		_ = b.rc.SetReadDeadline(time.Now().Add(b.timeout))
	}
	n, err := b.ReadCloser.Read(p)
	if b.left > 0 {
		b.left -= int64(n)
	}
	if b.left == 0 && errors.Is(err, http.ErrBodyReadAfterClose) {
		// All of it was sent: what the server drained was nothing.
		return n, io.EOF
	}
	return n, err
}
