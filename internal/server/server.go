// Package server is loam's HTTP API: the REST and WebSocket handlers. It is
// the only place where errors become HTTP statuses.
package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/conns"
	"loam.dev/loam/internal/store"
)

// maxBody is the largest request body the API reads.
const maxBody = 1 << 20

// Server serves the API.
type Server struct {
	sandboxes Sandboxes
	// catalog, images, registries and secrets serve their routes; nil
	// answers unavailable (see WithTemplates, WithImages, WithSecrets).
	catalog    Templates
	images     Images
	registries Registries
	secrets    Secrets
	// keys says who makes each call (see WithKeys); audit keeps the record
	// of the calls that change something (nil: none is kept).
	keys  Authenticator
	audit AuditLog
	log   *slog.Logger
	mux   *http.ServeMux
	// patterns are the patterns handle registered, in order (see Routes);
	// table the API's routes with their scope and action (see RouteTable).
	patterns []string
	table    []route
	// where says which API this is in messages: "" for the daemon's own,
	// " inside a sandbox" for a sandbox's (see Inside).
	where string
	// writeTimeout cuts off a client that takes no write of a stream, or
	// sends no byte of an upload, for this long (DefaultWriteTimeout).
	writeTimeout time.Duration
	// browsers, when set, lets a browser call the API with a session
	// cookie instead of a token (the web console).
	browsers BrowserSessions
	// warmPools, when set, serves the warm pools' routes (see Pools).
	warmPools Pools
	// orgs, when set, serves the orgs' routes (see Orgs).
	orgs Orgs
	// nodes, when set, serves the nodes' routes (a node of a cluster).
	nodes Nodes
	// moves, when set, moves sandboxes between nodes (a cluster with an
	// object store).
	moves Moves
	// router, when set, passes a call for another node's sandbox to it.
	router Router
}

// BrowserSessions authorizes API calls that a browser makes with a session
// cookie (the web console's) instead of a token. A cookie is ambient: a
// browser sends it on requests that other sites' pages make too, so a
// session must also prove that the call comes from the console's own page
// (its CSRF token, which other sites cannot read).
type BrowserSessions interface {
	// Authorize reports whether r carries a session cookie at all (false,
	// nil when it carries none: the call then needs a token, as without
	// browser sessions). When it carries one, the error is an *api.Error
	// for a session that may not make the call: unknown or expired
	// (unauthorized), or without the session's CSRF token (forbidden).
	// The org and key are the session's key's (auth.Keys.Principal finds
	// who it is).
	Authorize(r *http.Request) (org, key string, ok bool, err error)
}

// Authenticator says who makes a call and ends the calls of a key that is
// revoked (internal/auth.Keys).
type Authenticator interface {
	// Authenticate is the principal of a token; an *api.Error
	// (unauthorized) for one that opens nothing.
	Authenticate(ctx context.Context, token string) (auth.Principal, error)
	// Admin is the principal of the admin token.
	Admin() auth.Principal
	// Principal is who key id of org is (a console session's key).
	Principal(ctx context.Context, org, id string) (auth.Principal, error)
	// Hold is ctx, ended when p's key is revoked or expires, for the
	// length of a call; the func releases it.
	Hold(ctx context.Context, p auth.Principal) (context.Context, func())
	// Create makes a key of org for by; List lists org's keys; Revoke
	// deletes one.
	Create(ctx context.Context, by auth.Principal, org string, req api.CreateKey) (*api.Key, error)
	List(ctx context.Context, org string) ([]api.Key, error)
	Revoke(ctx context.Context, org, id string) error
	// Forget ends the calls still open with keys ids, deleted with their
	// org; ForgetOrg those of any key of org (one made while its delete
	// ran too).
	Forget(ids ...string)
	ForgetOrg(org string)
}

// AuditLog keeps the audit log (store/sqlite).
type AuditLog interface {
	store.AuditWriter
	ListAudit(ctx context.Context, f store.AuditFilter) ([]api.AuditEvent, error)
}

// Option sets something of a Server New makes.
type Option func(*Server)

// WithWriteTimeout sets how long a client may take no write of a stream,
// or send no byte of an upload, before it is cut off (DefaultWriteTimeout
// when d <= 0).
func WithWriteTimeout(d time.Duration) Option {
	return func(s *Server) {
		if d > 0 {
			s.writeTimeout = d
		}
	}
}

// WithBrowserSessions lets browsers call the API with the session cookies
// that b checks, besides the token (see BrowserSessions).
func WithBrowserSessions(b BrowserSessions) Option {
	return func(s *Server) { s.browsers = b }
}

// WithKeys authenticates calls with k instead of the token New was given
// alone: API keys besides the admin token.
func WithKeys(k Authenticator) Option {
	return func(s *Server) { s.keys = k }
}

// WithAudit records the calls that change something in log, and serves it
// (GET /v1/audit).
func WithAudit(log AuditLog) Option {
	return func(s *Server) { s.audit = log }
}

// WithPools serves the warm pools' routes with p (see Pools).
func WithPools(p Pools) Option {
	return func(s *Server) { s.warmPools = p }
}

// New makes a server over the sandbox manager. Every /v1 call must carry
// token as a bearer token (or, with WithBrowserSessions, a browser
// session).
func New(sandboxes Sandboxes, token string, log *slog.Logger, opts ...Option) *Server {
	s := &Server{sandboxes: sandboxes, log: log, mux: http.NewServeMux(), writeTimeout: DefaultWriteTimeout}
	for _, o := range opts {
		o(s)
	}
	if s.keys == nil {
		s.keys = auth.NewKeys(DefaultOrg, token, nil, log)
	}
	s.routes()
	return s
}

func (s *Server) routes() {
	s.handle("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		api.WriteJSON(w, http.StatusOK, map[string]any{"ok": true})
	})
	// The API's own description, open like /healthz: it holds no secret,
	// and a client needs it before it has a token to read it with.
	s.handle("GET /v1/openapi.yaml", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(api.OpenAPI)
	})
	v1 := func(pattern string, need api.Scope, action string, h func(http.ResponseWriter, *http.Request) error) {
		rt := route{Pattern: pattern, Scope: need, Action: action}
		s.table = append(s.table, rt)
		s.handle(pattern, s.auth(rt, h))
	}
	// The operator's routes (orgs and their quotas) take the admin token
	// of loam serve alone: no key of an org's, whatever its scope.
	operator := func(pattern string, need api.Scope, action string, h func(http.ResponseWriter, *http.Request) error) {
		rt := route{Pattern: pattern, Scope: need, Action: action, Operator: true}
		s.table = append(s.table, rt)
		s.handle(pattern, s.auth(rt, h))
	}
	// Each capability's routes are a type of their own, holding only the
	// services they use; the Server keeps what they share (the mux, auth,
	// error answers).
	(&templateRoutes{catalog: s.catalog, log: s.log, writeTimeout: s.writeTimeout}).register(v1)
	(&sandboxRoutes{sandboxes: s.sandboxes, root: s, log: s.log}).register(v1)
	(&checkpointRoutes{checkpoints: s.sandboxes}).register(v1)
	(&guestRoutes{guest: s.sandboxes, log: s.log, writeTimeout: s.writeTimeout}).register(v1)
	(&secretRoutes{secrets: s.secrets}).register(v1)
	(&imageRoutes{images: s.images, registries: s.registries}).register(v1)
	(&poolRoutes{warmPools: s.warmPools}).register(v1)
	(&keyRoutes{keys: s.keys, audit: s.audit}).register(v1)
	(&orgRoutes{orgs: s.orgs, keys: s.keys}).register(v1, operator)
	(&nodeRoutes{nodes: s.nodes, moves: s.moves}).register(operator)
}

// addRoute registers an API handler for a pattern ("METHOD /path"), the
// scope a key needs to call it, and its action in the audit log ("" for a
// call that changes nothing); the Server's adds its auth, audit and error
// answers.
type addRoute func(pattern string, need api.Scope, action string, h func(http.ResponseWriter, *http.Request) error)

// endpoint is a handler the API registered. Any other handler the mux
// returns is one of its own answers, which route replaces.
type endpoint http.HandlerFunc

func (e endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) { e(w, r) }

// handle registers h for pattern ("METHOD /path").
func (s *Server) handle(pattern string, h http.HandlerFunc) {
	s.mux.Handle(pattern, endpoint(h))
	s.patterns = append(s.patterns, pattern)
}

// Routes lists every endpoint of the daemon's API as its "METHOD /path"
// pattern (such as "GET /v1/sandboxes/{sandbox}"), sorted, so that tests
// and documents can check that they cover each one.
func Routes() []string {
	s := New(nil, "", slog.New(slog.DiscardHandler))
	return slices.Sorted(slices.Values(s.patterns))
}

// RouteInfo is an endpoint of the API with the scope a key needs to call
// it and its action in the audit log ("" for none).
type RouteInfo = route

// RouteTable lists the API's authenticated endpoints (every /v1 route but
// the open /v1/openapi.yaml), sorted by pattern, with their scopes and
// actions: what the scope and isolation tests are generated from.
func RouteTable() []RouteInfo {
	s := New(nil, "", slog.New(slog.DiscardHandler))
	return slices.SortedFunc(slices.Values(s.table), func(a, b route) int { return strings.Compare(a.Pattern, b.Pattern) })
}

// DefaultOrg is the org of a daemon that names none (loam serve --org).
const DefaultOrg = "default"

// route serves r with its endpoint. When there is none, the mux would answer
// by itself in plain text or HTML (404, 405, or a redirect to the clean
// path); route asks it which, and answers with the API's JSON error instead.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	h, _ := s.mux.Handler(r)
	if _, ok := h.(endpoint); ok {
		// ServeHTTP, not h: the mux sets the path values.
		s.mux.ServeHTTP(w, r)
		return
	}
	ans := &recorded{header: http.Header{}}
	h.ServeHTTP(ans, r)
	var err error
	switch {
	case ans.status == http.StatusMethodNotAllowed:
		allow := ans.header.Get("Allow")
		w.Header().Set("Allow", allow)
		err = api.Errorf(api.CodeMethodNotAllowed, "%s %s: the method is not allowed (allowed: %s)", r.Method, r.URL.Path, allow)
	case ans.status/100 == 3:
		// The mux redirects a path to its clean form (the API registers
		// no "/dir/" patterns, so it makes no other redirects). An API
		// client should send the path it means, and many clients follow
		// a redirect with a GET, whatever the method was.
		clean, _, _ := strings.Cut(ans.header.Get("Location"), "?")
		err = api.Errorf(api.CodeNotFound, "%s %s: not a clean path (no //, /./ or /../); the clean path is %q", r.Method, r.URL.EscapedPath(), clean)
	default:
		err = api.Errorf(api.CodeNotFound, "no such endpoint%s: %s %s", s.where, r.Method, r.URL.Path)
	}
	writeError(w, r, s.log, err)
}

// recorded is an answer kept in memory: one of the mux's own, which route
// asks it for to replace, or that of a call the server makes to itself
// (a fork of a count, see createForks).
type recorded struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (a *recorded) Header() http.Header { return a.header }

func (a *recorded) WriteHeader(status int) {
	if a.status == 0 {
		a.status = status
	}
}

func (a *recorded) Write(b []byte) (int, error) {
	a.WriteHeader(http.StatusOK)
	return a.body.Write(b)
}

// Flush does nothing: the answer is read once it is whole. (A call passed
// on to another node flushes as it relays.)
func (a *recorded) Flush() {}

type ctxKey int

const (
	requestIDKey ctxKey = iota
	requestNoteKey
)

// requestNote is what a request's handler tells its log line.
type requestNote struct {
	mu sync.Mutex
	// cut is why a stream of the request was cut off (a client that
	// stopped reading), if it was.
	cut string
}

// noteCut records on ctx's request that its stream was cut off, and why:
// the request's log line says so, which is how an operator (or a test)
// sees slow clients being let go.
func noteCut(ctx context.Context, why string) {
	if n, ok := ctx.Value(requestNoteKey).(*requestNote); ok {
		n.mu.Lock()
		n.cut = why
		n.mu.Unlock()
	}
}

// RequestID is the id of the request a context belongs to, for logs.
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey).(string)
	return id
}

// ServeHTTP gives each request an id, logs it, and routes it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	note := &requestNote{}
	r = r.WithContext(context.WithValue(context.WithValue(r.Context(), requestIDKey, id), requestNoteKey, note))
	w.Header().Set("X-Request-Id", id)
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	start := time.Now()
	if s.cors(rec, r) {
		return
	}
	aborted := true
	defer func() {
		if r.URL.Path == "/healthz" {
			return
		}
		var status any = rec.status
		if aborted {
			// The handler gave up on the connection (a client gone, a
			// stream broken mid-way: http.ErrAbortHandler): no status
			// was sent, but the request is in the log like any other.
			status = "aborted"
		}
		attrs := []any{"request_id", id, "method", r.Method, "path", r.URL.Path,
			"status", status, "ms", time.Since(start).Milliseconds()}
		note.mu.Lock()
		if note.cut != "" {
			attrs = append(attrs, "cut", note.cut)
		}
		note.mu.Unlock()
		s.log.Info("request", attrs...)
	}()
	s.route(rec, r)
	aborted = false
}

// cors lets web pages of any origin use the daemon's API (the TypeScript
// SDK in a browser): an answer to a request with an Origin may be read by
// the page, and a preflight is answered here (it reports whether it did).
// Any origin is safe because the API has no ambient credentials: no
// cookie opens it, only the token a page must already hold and send. The
// in-sandbox API does not take part.
func (s *Server) cors(w http.ResponseWriter, r *http.Request) bool {
	if s.where != "" || r.Header.Get("Origin") == "" || !strings.HasPrefix(r.URL.Path, "/v1/") {
		return false
	}
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Expose-Headers", "X-Request-Id, Allow, Content-Length, Content-Disposition")
	if r.Method != http.MethodOptions || r.Header.Get("Access-Control-Request-Method") == "" {
		return false
	}
	h.Set("Access-Control-Allow-Methods", "GET, HEAD, POST, PUT, PATCH, DELETE")
	h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type, Accept")
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
	return true
}

// route is an endpoint of the API as the route table has it: its pattern,
// the scope a key needs to call it, and, for a call that changes
// something, its action in the audit log ("" for one that changes
// nothing).
type route struct {
	Pattern string
	Scope   api.Scope
	Action  string
	// Operator is set for the routes only the operator may call (the
	// admin token of loam serve): orgs and their quotas.
	Operator bool
}

// auth finds who makes the call and whether they may, then runs h with the
// caller in its context (auth.From), and turns its error into a response.
// A call that changes something is recorded in the audit log.
func (s *Server) auth(rt route, h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	// A label-limited key is given the sandboxes of its selector: routes
	// about one sandbox, and making one. Anything else it may change
	// concerns the whole org.
	perSandbox := strings.Contains(rt.Pattern, "{sandbox}")
	orgWide := !perSandbox && rt.Pattern != "POST /v1/sandboxes"
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := s.principal(r)
		if err != nil {
			writeError(w, r, s.log, err)
			return
		}
		ctx := auth.WithPrincipal(r.Context(), p)
		// One request from here on: a placement reads the body and puts
		// it back in this one, for the handler (a copy's would be lost).
		r = r.WithContext(ctx)
		if s.router != nil && s.passOn(w, r, rt, perSandbox) {
			return
		}
		var call *store.AuditCall
		if rt.Action != "" && s.audit != nil {
			call = store.NewAuditCall(api.AuditEvent{
				Time: store.Now(), Org: p.Org, Key: p.Key, Action: rt.Action,
				Target: strings.TrimPrefix(r.URL.Path, "/v1/"), Client: s.clientAddr(r),
			}, s.audit)
			ctx = store.WithAudit(ctx, call)
		}
		ctx, release := s.keys.Hold(ctx, p)
		defer release()
		r = r.WithContext(ctx)
		err = s.allow(p, rt, orgWide)
		if err == nil {
			conns.KeepAlive(w)
			err = h(w, r)
		}
		if call != nil {
			if ferr := call.Finish(context.WithoutCancel(ctx), store.Outcome(err)); ferr != nil {
				s.log.Error("writing audit record", "request_id", RequestID(ctx), "action", rt.Action, "err", ferr)
			}
		}
		if err != nil {
			writeError(w, r, s.log, err)
		}
	}
}

// passOn passes r, of an authenticated caller, to the node of the cluster
// that answers it, and reports whether it did (or refused it): a call for
// a sandbox to its owner, a create to the node placement picks, and,
// until templates travel, a template of a checkpoint to the checkpoint's
// node and a call about a checkpoint template to the node keeping it.
// The caller's own credentials go with it: that node checks, audits and
// answers the call.
func (s *Server) passOn(w http.ResponseWriter, r *http.Request, rt route, perSandbox bool) bool {
	conns.KeepAlive(w)
	switch {
	case perSandbox:
		return s.router.Forward(w, r, r.PathValue("sandbox"))
	case rt.Pattern == "POST /v1/sandboxes":
		return s.router.Place(w, r)
	case rt.Pattern == "POST /v1/templates":
		return s.router.PlaceTemplate(w, r)
	case strings.Contains(rt.Pattern, "{template}"):
		return s.router.ForwardTemplate(w, r, r.PathValue("template"))
	}
	return false
}

// allow refuses a call p may not make: one that needs more than p's scope,
// or, for a key limited by labels, a change to the whole org.
func (s *Server) allow(p auth.Principal, rt route, orgWide bool) error {
	if rt.Operator && !p.Operator {
		return api.Errorf(api.CodeForbidden, "%s is the operator's: it needs the admin token of loam serve, not an org's key", rt.Pattern)
	}
	if !p.Allows(rt.Scope) {
		return api.Errorf(api.CodeForbidden, "%s needs a key of scope %s; this key's scope is %s", rt.Pattern, rt.Scope, p.Scope)
	}
	if !p.Limited() {
		return nil
	}
	// A sandbox outside the key's selector is not found where its
	// reference is resolved (the sandbox manager's lookup), after the
	// checks of the call's input, as one that does not exist would be.
	if orgWide && rt.Scope != api.ScopeRead {
		return api.Errorf(api.CodeForbidden, "%s: this key is limited to the sandboxes labelled %s; it may not change what the whole org shares", rt.Pattern, labelList(p.Labels))
	}
	return nil
}

// clientAddr is the address a call came from, as the connection has it:
// loam trusts no header a client sets for this.
func (s *Server) clientAddr(r *http.Request) string {
	if s.router != nil {
		if c, ok := s.router.Client(r); ok {
			return c
		}
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// labelList shows labels as k=v,k=v in key order.
func labelList(labels map[string]string) string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(labels)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + labels[k])
	}
	return b.String()
}

// principal is who makes r: the owner of the token it carries (as a bearer
// token or, on a WebSocket upgrade, as a subprotocol
// api.WebSocketTokenPrefix+token, since a browser cannot set Authorization
// on a WebSocket; the token is never the subprotocol the server picks, see
// acceptOptions), or of its browser session.
func (s *Server) principal(r *http.Request) (auth.Principal, error) {
	if token, ok := requestToken(r); ok {
		return s.keys.Authenticate(r.Context(), token)
	}
	org, key, ok, err := s.session(r)
	if err != nil {
		return auth.Principal{}, err
	}
	if !ok {
		return auth.Principal{}, auth.ErrWrongToken
	}
	return s.keys.Principal(r.Context(), org, key)
}

// requestToken is the token r carries, if any (see principal).
func requestToken(r *http.Request) (string, bool) {
	if got, ok := api.BearerToken(r.Header); ok {
		return got, true
	}
	if r.Header.Get("Authorization") != "" || !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return "", false
	}
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(h, ",") {
			if got, found := strings.CutPrefix(strings.TrimSpace(p), api.WebSocketTokenPrefix); found && got != "" {
				return got, true
			}
		}
	}
	return "", false
}

// session reports whether r is authorized by a browser session (see
// BrowserSessions). A request that names a token is judged by the token
// alone: a wrong token is not rescued by a cookie.
func (s *Server) session(r *http.Request) (org, key string, ok bool, err error) {
	if s.browsers == nil || r.Header.Get("Authorization") != "" {
		return "", "", false, nil
	}
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		if strings.Contains(h, api.WebSocketTokenPrefix) {
			return "", "", false, nil
		}
	}
	return s.browsers.Authorize(r)
}

// acceptOptions are the options of every WebSocket the API accepts. Of the
// subprotocols a client offers, the server picks api.WebSocketProtocol: a
// browser that offers the token as a subprotocol must offer it too, since a
// browser fails a handshake whose answer picks none of those it offered.
var acceptOptions = &websocket.AcceptOptions{
	InsecureSkipVerify: true,
	Subprotocols:       []string{api.WebSocketProtocol},
}

// writeError sends err as the API's error body. Errors that carry an
// *api.Error are the user's to read; any other is logged and sent as a bare
// internal error, so internal details never leak.
//
// A client that went away gets no answer, and its request at most a debug
// line: it closed (or half-closed) its connection or reset its stream,
// which cancelled the request's context, and what failed then (a lookup
// cut short by that context, most often) is no fault of the daemon's. A
// client can do that at will, so it must neither read as an internal
// error nor fill the daemon's log.
func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	if clientGone(r) {
		log.Debug("client gone", "request_id", RequestID(r.Context()), "method", r.Method, "path", r.URL.Path, "err", err)
		// net/http closes the connection (or resets the stream) without
		// an answer, and logs nothing.
		panic(http.ErrAbortHandler)
	}
	var ae *api.Error
	if !errors.As(err, &ae) && errors.Is(err, store.ErrStale) {
		// Another writer (a node, a call) changed the record between this
		// call's read and its write, which did not land.
		log.Info("a record changed under a call", "request_id", RequestID(r.Context()), "err", err)
		ae = api.Errorf(api.CodeConflict, "the sandbox changed while this call ran (another call or node changed it first); read it again and retry")
	}
	if ae == nil {
		id := RequestID(r.Context())
		log.Error("internal error", "request_id", id, "method", r.Method, "path", r.URL.Path, "err", err)
		ae = api.Errorf(api.CodeInternal, "internal error (request id %s)", id)
	} else if ae.Code == api.CodeInternal || ae.Code == api.CodeUnavailable {
		log.Error("request failed", "request_id", RequestID(r.Context()), "err", err)
	}
	api.WriteJSON(w, ae.Code.HTTPStatus(), api.ErrorBody{Error: ae})
}

// clientGone reports whether r's client went away: net/http cancels a
// request's context when its connection closes (or its HTTP/2 stream is
// reset), and the handler is still running.
func clientGone(r *http.Request) bool { return r.Context().Err() != nil }

// decode reads a JSON object from r's body into v, refusing unknown fields,
// trailing data, other JSON values and bodies over maxBody, with a message
// that says what is wrong.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	if err := decodeJSON(http.MaxBytesReader(w, r.Body, maxBody), v); err != nil {
		return decodeError(err, v)
	}
	return nil
}

// decodeOptional is decode for bodies that may be empty.
func decodeOptional(w http.ResponseWriter, r *http.Request, v any) error {
	err := decodeJSON(http.MaxBytesReader(w, r.Body, maxBody), v)
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err != nil {
		return decodeError(err, v)
	}
	return nil
}

// decodeJSON decodes one JSON object from body into v and returns
// encoding/json's own error (io.EOF for an empty body), or an *api.Error for
// trailing data or a value that is not an object. (Decoding null into a
// struct would succeed and leave it as it was, as if no body were sent.)
func decodeJSON(body io.Reader, v any) error {
	dec := json.NewDecoder(body)
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return api.Errorf(api.CodeInvalid, "body: more than one JSON value")
	}
	if raw[0] != '{' {
		return api.Errorf(api.CodeInvalid, "body: must be an object, not %s", literalKind(raw[0]))
	}
	// JSON is UTF-8 (RFC 8259): encoding/json would quietly make each
	// invalid byte U+FFFD, storing what the client never sent.
	if !utf8.Valid(raw) {
		return api.Errorf(api.CodeInvalid, "body: not valid UTF-8")
	}
	if err := checkDuplicates(raw); err != nil {
		return err
	}
	dec = json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// checkDuplicates refuses a JSON value (valid, as json.Decoder read it)
// in which an object names a member twice. encoding/json keeps the last
// one, other parsers the first, so the two would read different requests
// (RFC 8259 leaves it undefined; RFC 7493, I-JSON, forbids it). Names are
// compared as decoded, so "a" and "\u0061" are the same name. The error
// names the member by its path, as typeError names fields.
func checkDuplicates(raw []byte) error {
	// One frame per open object or array: an object's names so far (nil
	// for an array), its path, and whether a name comes next.
	type frame struct {
		names    map[string]bool
		path     string
		wantName bool
	}
	var stack []*frame
	// pathOf is the path of the member name of the innermost open value.
	pathOf := func(name string) string {
		if len(stack) == 0 {
			return name
		}
		switch p := stack[len(stack)-1].path; {
		case name == "":
			return p
		case p == "":
			return name
		default:
			return p + "." + name
		}
	}
	// ended marks a value as complete: in an object, a name comes next.
	ended := func() {
		if len(stack) > 0 && stack[len(stack)-1].names != nil {
			stack[len(stack)-1].wantName = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	name := ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if n := len(stack); n > 0 && stack[n-1].wantName {
			if tok == json.Delim('}') {
				stack = stack[:n-1]
				ended()
				continue
			}
			name = tok.(string)
			if stack[n-1].names[name] {
				return api.Errorf(api.CodeInvalid, "%s: given twice", pathOf(name))
			}
			stack[n-1].names[name] = true
			stack[n-1].wantName = false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{names: map[string]bool{}, path: pathOf(name), wantName: true})
		case json.Delim('['):
			stack = append(stack, &frame{path: pathOf(name)})
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
			ended()
		default:
			ended()
		}
		name = ""
	}
}

// literalKind names the kind of a JSON value by its first byte.
func literalKind(b byte) string {
	switch b {
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "true or false"
	case 'n':
		return "null"
	}
	return "a number"
}

// decodeError turns an error of decoding a body into v into an *api.Error
// that names the field at fault.
func decodeError(err error, v any) error {
	var (
		syn  *json.SyntaxError
		typ  *json.UnmarshalTypeError
		size *http.MaxBytesError
	)
	var ae *api.Error
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, io.EOF):
		return api.Errorf(api.CodeInvalid, "body: empty")
	case errors.As(err, &size):
		return api.Errorf(api.CodeInvalid, "body: larger than %d bytes", size.Limit)
	case errors.As(err, &syn):
		return api.Errorf(api.CodeInvalid, "body: not valid JSON at byte %d", syn.Offset)
	case errors.As(err, &typ):
		return typeError(typ, v)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		// encoding/json has no typed error for this one.
		return api.Errorf(api.CodeInvalid, "%s: unknown field", strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return api.Errorf(api.CodeInvalid, "body: truncated JSON")
	}
	return api.Errorf(api.CodeInvalid, "body: %v", err)
}

// typeError says what a field of v must be and what it was, as in
// "resources.cpus: must be a number, not a string". encoding/json names the
// field by its path of JSON names; "" is the body itself. When a map's value
// or an array's item is wrong, the path names the map or array.
func typeError(e *json.UnmarshalTypeError, v any) error {
	field := e.Field
	if field == "" {
		field = "body"
	}
	must := "must be"
	if t := fieldType(reflect.TypeOf(v), e.Field); t != nil && t != e.Type {
		switch t.Kind() {
		case reflect.Map:
			must = "each value must be"
		case reflect.Slice, reflect.Array:
			must = "each item must be"
		}
	}
	return api.Errorf(api.CodeInvalid, "%s: %s %s, not %s", field, must, jsonKind(e.Type), valueKind(e.Value))
}

// valueKind reads UnmarshalTypeError.Value: the kind of JSON value that was
// sent, or "number 1.5" for a number that does not fit.
func valueKind(v string) string {
	switch v {
	case "array", "object":
		return "an " + v
	case "string", "number":
		return "a " + v
	case "bool":
		return "true or false"
	}
	if n, ok := strings.CutPrefix(v, "number "); ok {
		return n
	}
	return v
}

// fieldType is the type of the field of t at path, a path of JSON names as
// encoding/json gives it; nil if there is none.
func fieldType(t reflect.Type, path string) reflect.Type {
	if t == nil || path == "" {
		return nil
	}
	for name := range strings.SplitSeq(path, ".") {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return nil
		}
		found := false
		for _, f := range reflect.VisibleFields(t) {
			tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if f.IsExported() && !f.Anonymous && (tag == name || tag == "" && f.Name == name) {
				t, found = f.Type, true
				break
			}
		}
		if !found {
			return nil
		}
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// jsonKind says what JSON value decodes into t.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer of at least 0"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	}
	return "a " + t.Kind().String()
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

// Unwrap lets http.ResponseController (and the WebSocket upgrade) reach the
// underlying writer.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
