// Package console is loam's web console: the page the daemon serves at /
// on the API's listener (built from web/ into dist/ and embedded in the
// binary), and the browser sessions that let that page call the API with a
// cookie instead of holding the token.
//
// A person logs in with the API token, or an API key of any scope, once
// (POST /console/login); the session is that key's, and acts within its
// scope and org (a revoked key's session ends with it). The answer
// sets a session cookie (HttpOnly, so the page's scripts never see it;
// SameSite=Strict, so other sites' requests do not carry it) and gives the
// page the session's CSRF token. Every API call made with the cookie must
// also carry that CSRF token, in the X-Loam-CSRF header (or, on a WebSocket,
// which cannot carry headers from a browser, as the subprotocol
// loam.csrf.TOKEN): a form or a script on another site can neither read the
// token nor send the header, so a cookie alone opens nothing. Sessions live
// in the daemon's memory: a restarted daemon asks everyone to log in again.
package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/store"
)

// dist is the built page: index.html and assets/ (see web/build.mjs).
//
//go:embed dist
var dist embed.FS

// Names the page and the daemon share.
const (
	// CookieName is the session cookie.
	CookieName = "loam_console"
	// CSRFHeader carries the session's CSRF token on API calls.
	CSRFHeader = "X-Loam-CSRF"
	// CSRFProtocolPrefix, followed by the CSRF token, is a WebSocket
	// subprotocol that carries it on a socket.
	CSRFProtocolPrefix = "loam.csrf."
)

// SessionTTL is how long a session lasts after its login.
const SessionTTL = 12 * time.Hour

// maxSessions bounds the sessions kept at once; a login beyond it ends the
// oldest one.
const maxSessions = 1024

// Config is what a Console needs.
type Config struct {
	// Keys says who a login's token is (the admin token, or an API key)
	// and who a session's key is at each call (internal/auth.Keys).
	Keys Keys
	// Audit, when set, records each login, and each failed one.
	Audit store.AuditWriter
	// TLS is true when the daemon's listener serves TLS: the cookie is then
	// Secure.
	TLS bool
	// Sessions keeps the sessions across restarts of the daemon; without
	// it they live in memory only, and a restart logs everyone out.
	Sessions SessionStore
	// TokenFile is where the daemon keeps the token, for the login page's
	// hint; empty when it was given to the daemon, not kept in a file.
	TokenFile string
	// Idle is the daemon's idle for sandboxes created without one (loam
	// serve --idle); 0 is never.
	Idle time.Duration
	// Shared is set on a node of a cluster: Sessions is the cluster's,
	// which every node logs in and out through, so each call's session
	// is read from it rather than from this node's memory.
	Shared bool
}

// Keys finds who a token or a key is (internal/auth.Keys has it).
type Keys interface {
	// Org is the daemon's own org, whose log records a wrong login.
	Org() string
	Authenticate(ctx context.Context, token string) (auth.Principal, error)
	Principal(ctx context.Context, org, id string) (auth.Principal, error)
}

// SessionStore keeps console sessions (store/sqlite is one). Sessions are
// read once, at New; then each login and logout is written through.
type SessionStore interface {
	PutConsoleSession(ctx context.Context, cs *store.ConsoleSession) error
	// ListConsoleSessions lists those that have not expired at now.
	ListConsoleSessions(ctx context.Context, now time.Time) ([]*store.ConsoleSession, error)
	// GetConsoleSession finds the one of key that has not expired at
	// now; store.ErrNotFound if none.
	GetConsoleSession(ctx context.Context, key string, now time.Time) (*store.ConsoleSession, error)
	// DeleteConsoleSessions deletes those of keys, and every one expired
	// at now.
	DeleteConsoleSessions(ctx context.Context, now time.Time, keys ...string) error
}

// Console serves the page and keeps its sessions. It is safe for
// concurrent use.
type Console struct {
	cfg   Config
	log   *slog.Logger
	files map[string]file
	now   func() time.Time

	mu       sync.Mutex
	sessions map[string]session // by the sha256 of the cookie's value
}

type session struct {
	csrf    string
	expires time.Time
	// org and key are the org and id of the key that logged in.
	org, key string
}

// file is one file of the page, ready to serve.
type file struct {
	body        []byte
	contentType string
	etag        string
}

// New makes a console for the page embedded in the binary, with the
// sessions cfg.Sessions kept.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Console, error) {
	files, err := loadFiles(dist, "dist")
	if err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, log: log, files: files, now: time.Now, sessions: map[string]session{}}
	if cfg.Sessions != nil {
		kept, err := cfg.Sessions.ListConsoleSessions(ctx, c.now())
		if err != nil {
			return nil, fmt.Errorf("reading the console's sessions: %w", err)
		}
		for _, cs := range kept {
			c.sessions[cs.Key] = session{csrf: cs.CSRFToken, expires: cs.ExpiresAt, org: cs.Org, key: cs.APIKey}
		}
	}
	return c, nil
}

// loadFiles reads every file under root of fsys, keyed by its URL path
// ("/index.html", "/assets/app.js"). Only these exact paths are served, so
// no request path can reach anything else.
func loadFiles(fsys fs.FS, root string) (map[string]file, error) {
	files := map[string]file{}
	err := fs.WalkDir(fsys, root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		ct := mime.TypeByExtension(path.Ext(p))
		if ct == "" {
			ct = "application/octet-stream"
		}
		files[strings.TrimPrefix(p, root)] = file{body: body, contentType: ct, etag: `"` + hex.EncodeToString(sum[:12]) + `"`}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the console's page: %w", err)
	}
	if _, ok := files["/index.html"]; !ok {
		return nil, errors.New("the console's page has no index.html (build web/: cd web && npm run build)")
	}
	return files, nil
}

// Owns reports whether path is the console's rather than the API's: the
// page (/, /index.html, /assets/…) and the session calls (/console/…).
func Owns(path string) bool {
	return path == "/" || path == "/index.html" || strings.HasPrefix(path, "/assets/") ||
		path == "/console" || strings.HasPrefix(path, "/console/")
}

// Mount serves the console's paths (see Owns) and hands every other request
// to next, the API.
func (c *Console) Mount(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !Owns(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		c.ServeHTTP(w, r)
	})
}

// ServeHTTP serves the page and the session calls.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var err error
	switch p := r.URL.Path; {
	case p == "/console/login":
		err = c.login(w, r)
	case p == "/console/logout":
		err = c.logout(w, r)
	case p == "/console/session":
		err = c.current(w, r)
	case strings.HasPrefix(p, "/console"):
		err = api.Errorf(api.CodeNotFound, "no such console call: %s %s", r.Method, p)
	default:
		err = c.static(w, r)
	}
	if err != nil {
		api.WriteError(w, err)
	}
}

// static serves a file of the page.
func (c *Console) static(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return api.Errorf(api.CodeMethodNotAllowed, "%s %s: the method is not allowed (allowed: GET, HEAD)", r.Method, r.URL.Path)
	}
	name := r.URL.Path
	if name == "/" {
		name = "/index.html"
	}
	f, ok := c.files[name]
	if !ok {
		return api.Errorf(api.CodeNotFound, "no such file of the console: %s", r.URL.Path)
	}
	h := w.Header()
	h.Set("Content-Type", f.contentType)
	h.Set("ETag", f.etag)
	// Revalidated on every load: the files keep their names from one
	// build to the next, and a new daemon must not run an old page.
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	// Nothing but the daemon: no CDN, no inline script, no framing (which
	// would let another site dress up the console's buttons).
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "+
		"img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
	h.Set("X-Frame-Options", "DENY")
	if match := r.Header.Get("If-None-Match"); match != "" && match == f.etag {
		w.WriteHeader(http.StatusNotModified)
		return nil
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		_, _ = w.Write(f.body)
	}
	return nil
}

// Login is the body of POST /console/login.
type Login struct {
	Token string `json:"token"`
}

// SessionInfo is the answer of a login and of GET /console/session: the
// CSRF token the page sends with every API call, when the session ends,
// and the daemon's settings the page shows.
type SessionInfo struct {
	CSRFToken string    `json:"csrf_token"`
	ExpiresAt time.Time `json:"expires_at"`
	// Idle is the daemon's idle for a sandbox created without one, as a
	// sandbox's idle is written ("10m", "1h30m"; "0" never).
	Idle string `json:"idle"`
	// Org, Key and Scope are whose session it is: the page shows what
	// the scope may not do as disabled.
	Org   string    `json:"org"`
	Key   string    `json:"key"`
	Scope api.Scope `json:"scope"`
}

// LoginHint is the answer of GET /console/login: where the person logging
// in finds the token.
type LoginHint struct {
	// TokenFile is the file the daemon keeps its token in; empty when the
	// token was given to the daemon rather than kept in a file.
	TokenFile string `json:"token_file,omitempty"`
}

// info is the SessionInfo of session s, whose key is p.
func (c *Console) info(s session, p auth.Principal) SessionInfo {
	return SessionInfo{CSRFToken: s.csrf, ExpiresAt: s.expires, Idle: idleString(c.cfg.Idle), Org: p.Org, Key: p.Key, Scope: p.Scope}
}

// idleString writes d as a sandbox's idle is written: "0" for never, else
// Go's form without its zero units ("1h30m", not "1h30m0s").
func idleString(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// login checks the API token and starts a session (POST), or says where
// the token is (GET; the file's path is no secret: only root reads it). It
// takes JSON only: a form on another site can post to it, but only as a
// form, so it cannot log a browser in to a session of the attacker's
// choosing.
func (c *Console) login(w http.ResponseWriter, r *http.Request) error {
	if r.Method == http.MethodGet {
		// The login page's hint: where this daemon keeps its token.
		api.WriteJSON(w, http.StatusOK, LoginHint{TokenFile: c.cfg.TokenFile})
		return nil
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "GET, POST")
		return api.Errorf(api.CodeMethodNotAllowed, "%s %s: the method is not allowed (allowed: GET, POST)", r.Method, r.URL.Path)
	}
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/json" {
		return api.Errorf(api.CodeInvalid, "login: the body must be JSON (Content-Type: application/json)")
	}
	var req Login
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return api.Errorf(api.CodeInvalid, "login: the body must be {\"token\": \"…\"}")
	}
	p, err := c.cfg.Keys.Authenticate(r.Context(), req.Token)
	if err != nil {
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeUnauthorized {
			return err
		}
		c.record(r, auth.Principal{Org: c.cfg.Keys.Org()}, string(api.CodeUnauthorized))
		return api.Errorf(api.CodeUnauthorized, "wrong token: give the daemon's API token (LOAM_TOKEN, or the file loam serve made it in) or an API key")
	}
	id, csrf := randomToken(), randomToken()
	now := c.now()
	s := session{csrf: csrf, expires: now.Add(SessionTTL), org: p.Org, key: p.Key}
	key := hashID(id)
	c.mu.Lock()
	evicted := c.prune(now)
	c.sessions[key] = s
	c.mu.Unlock()
	if st := c.cfg.Sessions; st != nil {
		err := st.PutConsoleSession(r.Context(), &store.ConsoleSession{Key: key, CSRFToken: csrf, ExpiresAt: s.expires, Org: p.Org, APIKey: p.Key})
		if err == nil {
			err = st.DeleteConsoleSessions(r.Context(), now, evicted...)
		}
		if err != nil {
			c.mu.Lock()
			delete(c.sessions, key)
			c.mu.Unlock()
			c.log.Error("console login: keeping the session", "err", err)
			return api.Errorf(api.CodeInternal, "the console session could not be kept: see the daemon's log")
		}
	}
	http.SetCookie(w, &http.Cookie{
		Name: CookieName, Value: id, Path: "/", Expires: s.expires,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: c.cfg.TLS,
	})
	c.log.Info("console login", "remote", r.RemoteAddr, "org", p.Org, "key", p.Key)
	c.record(r, p, "ok")
	api.WriteJSON(w, http.StatusOK, c.info(s, p))
	return nil
}

// record writes a login's audit record (console.login), with the key that
// logged in, or none for a wrong token.
func (c *Console) record(r *http.Request, p auth.Principal, outcome string) {
	if c.cfg.Audit == nil {
		return
	}
	client := r.RemoteAddr
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		client = host
	}
	ev := api.AuditEvent{Time: store.Now(), Org: p.Org, Key: p.Key, Action: "console.login", Target: "console", Outcome: outcome, Client: client}
	if err := c.cfg.Audit.AppendAudit(context.WithoutCancel(r.Context()), ev); err != nil {
		c.log.Error("writing the audit record of a console login", "err", err)
	}
}

// prune drops expired sessions and, at maxSessions, the one that ends
// first, whose key it returns (the store drops expired ones itself). c.mu
// is held.
func (c *Console) prune(now time.Time) (evicted []string) {
	var oldest string
	for k, s := range c.sessions {
		if !now.Before(s.expires) {
			delete(c.sessions, k)
			continue
		}
		if oldest == "" || s.expires.Before(c.sessions[oldest].expires) {
			oldest = k
		}
	}
	if len(c.sessions) >= maxSessions {
		delete(c.sessions, oldest)
		evicted = append(evicted, oldest)
	}
	return evicted
}

// current gives the page its session's CSRF token again (after a reload,
// which loses what the page held). Another site cannot read the answer: it
// has no CORS headers, and the cookie is not sent cross-site.
func (c *Console) current(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", "GET")
		return api.Errorf(api.CodeMethodNotAllowed, "%s %s: the method is not allowed (allowed: GET)", r.Method, r.URL.Path)
	}
	s, err := c.lookup(r)
	if err != nil {
		return err
	}
	p, err := c.cfg.Keys.Principal(r.Context(), s.org, s.key)
	if err != nil {
		return err // a revoked or expired key: its session is over
	}
	w.Header().Set("Cache-Control", "no-store")
	api.WriteJSON(w, http.StatusOK, c.info(s, p))
	return nil
}

// logout ends the session; it needs the CSRF token like any other call
// that changes something.
func (c *Console) logout(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		return api.Errorf(api.CodeMethodNotAllowed, "%s %s: the method is not allowed (allowed: POST)", r.Method, r.URL.Path)
	}
	_, _, has, err := c.Authorize(r)
	if err != nil {
		return err
	}
	ck, cerr := r.Cookie(CookieName)
	if !has || cerr != nil {
		return api.Errorf(api.CodeUnauthorized, "not logged in to the console")
	}
	key := hashID(ck.Value)
	c.mu.Lock()
	delete(c.sessions, key)
	c.mu.Unlock()
	if st := c.cfg.Sessions; st != nil {
		if err := st.DeleteConsoleSessions(r.Context(), c.now(), key); err != nil {
			// The browser forgets the cookie all the same.
			c.log.Error("console logout: forgetting the session", "err", err)
		}
	}
	http.SetCookie(w, &http.Cookie{
		Name: CookieName, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: c.cfg.TLS,
	})
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// lookup finds the live session of r's cookie.
func (c *Console) lookup(r *http.Request) (session, error) {
	ck, err := r.Cookie(CookieName)
	if err != nil || ck.Value == "" {
		return session{}, api.Errorf(api.CodeUnauthorized, "not logged in to the console")
	}
	key := hashID(ck.Value)
	if c.cfg.Shared && c.cfg.Sessions != nil {
		return c.lookupShared(r.Context(), key)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.sessions[key]
	if ok && !c.now().Before(s.expires) {
		delete(c.sessions, key)
		ok = false
	}
	if !ok {
		return session{}, api.Errorf(api.CodeUnauthorized, "the console session is unknown or has expired: log in again")
	}
	return s, nil
}

// lookupShared finds the session of key in the store, which the nodes of a
// cluster share: a session made on one node opens the others (a call the
// console makes on one is passed to the node of its sandbox with its
// cookie), and one ended on any node is ended on all.
func (c *Console) lookupShared(ctx context.Context, key string) (session, error) {
	cs, err := c.cfg.Sessions.GetConsoleSession(ctx, key, c.now())
	if errors.Is(err, store.ErrNotFound) {
		c.mu.Lock()
		delete(c.sessions, key)
		c.mu.Unlock()
		return session{}, api.Errorf(api.CodeUnauthorized, "the console session is unknown or has expired: log in again")
	}
	if err != nil {
		return session{}, fmt.Errorf("checking the console session: %w", err)
	}
	return session{csrf: cs.CSRFToken, expires: cs.ExpiresAt, org: cs.Org, key: cs.APIKey}, nil
}

// Authorize checks a request made with the session cookie (it implements
// server.BrowserSessions): the org and id of the session's key; false,
// nil when r carries no cookie of ours; an unauthorized error for a
// session that is unknown or expired; a forbidden one when the session's
// CSRF token is missing or wrong.
func (c *Console) Authorize(r *http.Request) (org, key string, ok bool, err error) {
	if _, err := r.Cookie(CookieName); err != nil {
		return "", "", false, nil
	}
	s, err := c.lookup(r)
	if err != nil {
		return "", "", true, err
	}
	if !matchesCSRF(r, s.csrf) {
		return "", "", true, api.Errorf(api.CodeForbidden, "a console session's call must carry its CSRF token (header %s)", CSRFHeader)
	}
	return s.org, s.key, true, nil
}

// matchesCSRF reports whether r carries csrf: in the header, or on a
// WebSocket upgrade as a subprotocol.
func matchesCSRF(r *http.Request, csrf string) bool {
	if got := r.Header.Get(CSRFHeader); got != "" {
		return subtle.ConstantTimeCompare([]byte(got), []byte(csrf)) == 1
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return false
	}
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(h, ",") {
			got, ok := strings.CutPrefix(strings.TrimSpace(p), CSRFProtocolPrefix)
			if ok && subtle.ConstantTimeCompare([]byte(got), []byte(csrf)) == 1 {
				return true
			}
		}
	}
	return false
}

// randomToken is 32 random bytes in hex.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// hashID is the key a session is kept under: the cookie's value itself is
// not kept, so that what the daemon holds cannot be replayed.
func hashID(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])
}
