package server

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
)

// Inside serves the API to the sandboxes themselves, so that a program in a
// sandbox can checkpoint (or restore) its own sandbox. Each sandbox gets a
// listener of its own on the host end of its veth pair, reachable only from
// that sandbox, and a token of its own that reaches only that sandbox: only
// its own record and its own checkpoints.
type Inside struct {
	sandboxes Sandboxes
	secret    []byte
	log       *slog.Logger

	// Limits of each sandbox's server (see serveLocked). NewInside sets
	// them; tests shorten them.
	readHeaderTimeout time.Duration
	readTimeout       time.Duration
	idleTimeout       time.Duration
	maxConns          int

	mu   sync.Mutex
	srvs map[string]*http.Server
}

// Limits of each sandbox's own API. A sandbox is a program we do not trust:
// whatever it does with its connections should cost the daemon little, and
// starve only itself.
const (
	// maxInsideConns is the most connections one sandbox may have open to
	// its API at once; more wait to be accepted.
	maxInsideConns = 16
	// insideReadHeaderTimeout bounds reading a request's header, and
	// insideReadTimeout its header and body: a body is at most maxBody
	// (1 MiB), over the sandbox's own link to the host.
	insideReadHeaderTimeout = 5 * time.Second
	insideReadTimeout       = 10 * time.Second
	// insideIdleTimeout is how long a kept-alive connection may wait for
	// its next request.
	insideIdleTimeout = 30 * time.Second
	// insideMaxHeaderBytes bounds a request's header: it holds a token and
	// little else.
	insideMaxHeaderBytes = 16 << 10
)

// NewInside makes the in-sandbox API. Sandbox tokens are derived from
// secret, so they need no storing and survive restarts of the daemon.
func NewInside(sandboxes Sandboxes, secret []byte, log *slog.Logger) *Inside {
	return &Inside{
		sandboxes: sandboxes, secret: secret, log: log,
		readHeaderTimeout: insideReadHeaderTimeout,
		readTimeout:       insideReadTimeout,
		idleTimeout:       insideIdleTimeout,
		maxConns:          maxInsideConns,
		srvs:              map[string]*http.Server{},
	}
}

// Token is the token of sandbox id's own API.
func (in *Inside) Token(id string) string {
	mac := hmac.New(sha256.New, in.secret)
	mac.Write([]byte("loam inside token\x00" + id))
	return "loam_sb_" + hex.EncodeToString(mac.Sum(nil))[:40]
}

// Open starts serving sandbox id on addr, unless it is served already.
// Only connections from peer, the sandbox's own address, are served: the
// host answers on every local address, so without that another sandbox
// could reach this listener too (it would still need the token).
func (in *Inside) Open(id string, addr netip.AddrPort, peer netip.Addr) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if _, ok := in.srvs[id]; ok {
		return nil
	}
	ln, err := net.Listen("tcp", addr.String())
	if err != nil {
		return err
	}
	in.serveLocked(id, ln, peer)
	return nil
}

// serveLocked serves sandbox id on ln. in.mu is held.
//
// A connection from any address but peer is closed as it is accepted,
// before HTTP sees it. At most in.maxConns of the peer's connections are
// open at once: Accept waits for one to close before it takes the next,
// which starves only the sandbox that holds them. Connections from other
// addresses are weeded out beneath that limit, so they never take a place;
// but while the sandbox holds all its places they wait, unaccepted, with
// its own.
func (in *Inside) serveLocked(id string, ln net.Listener, peer netip.Addr) {
	ln = &limitListener{
		Listener: &peerListener{Listener: ln, peer: peer.Unmap()},
		places:   make(chan struct{}, in.maxConns),
		done:     make(chan struct{}),
	}
	srv := &http.Server{
		Handler:           in.handler(id),
		ReadHeaderTimeout: in.readHeaderTimeout,
		ReadTimeout:       in.readTimeout,
		// No WriteTimeout: net/http starts it when the request has been
		// read, so it would bound the handler too, and a memory
		// checkpoint or a restore can take tens of seconds. (ReadTimeout
		// does not: once the body is read, net/http lifts the read
		// deadline while the handler runs.)
		IdleTimeout:    in.idleTimeout,
		MaxHeaderBytes: insideMaxHeaderBytes,
		// What net/http logs of a connection is the sandbox's doing: keep
		// it out of the daemon's warnings, where a sandbox could flood them.
		ErrorLog: slog.NewLogLogger(in.log.With("sandbox", id).Handler(), slog.LevelDebug),
	}
	in.srvs[id] = srv
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			in.log.Warn("in-sandbox API stopped", "sandbox", id, "err", err)
		}
	}()
}

// Close stops serving sandbox id.
func (in *Inside) Close(id string) {
	in.mu.Lock()
	srv := in.srvs[id]
	delete(in.srvs, id)
	in.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

// CloseAll stops serving every sandbox (the daemon is stopping).
func (in *Inside) CloseAll() {
	in.mu.Lock()
	ids := make([]string, 0, len(in.srvs))
	for id := range in.srvs {
		ids = append(ids, id)
	}
	in.mu.Unlock()
	for _, id := range ids {
		in.Close(id)
	}
}

// handler serves one sandbox: its record and its checkpoints, with its
// token; "{sandbox}" in a path must be that sandbox, by id or name.
func (in *Inside) handler(id string) http.Handler {
	s := &Server{sandboxes: in.sandboxes, log: in.log, mux: http.NewServeMux(), where: " inside a sandbox", writeTimeout: DefaultWriteTimeout}
	token := in.Token(id)
	v1 := func(pattern string, _ api.Scope, _ string, h func(http.ResponseWriter, *http.Request) error) {
		s.handle(pattern, func(w http.ResponseWriter, r *http.Request) {
			got, ok := api.BearerToken(r.Header)
			if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
				writeError(w, r, s.log, api.Errorf(api.CodeUnauthorized, "missing or wrong token"))
				return
			}
			if err := in.own(r.Context(), id, r.PathValue("sandbox")); err != nil {
				writeError(w, r, s.log, err)
				return
			}
			// From here on the sandbox is named by its id, which is
			// unique across orgs: its name may be another org's too.
			r.SetPathValue("sandbox", id)
			// The sandbox asks about itself: the checkpoint rules that
			// keep the owner's undo points apply (checkpoint.Caller).
			r = r.WithContext(checkpoint.WithCaller(r.Context(), checkpoint.Inside))
			if err := h(w, r); err != nil {
				writeError(w, r, s.log, err)
			}
		})
	}
	v1("GET /v1/sandboxes/{sandbox}", api.ScopeRead, "", (&sandboxRoutes{sandboxes: in.sandboxes}).getSandbox)
	(&checkpointRoutes{checkpoints: in.sandboxes}).register(v1)
	return s
}

// own refuses a path about any sandbox but id, as if it did not exist.
// The sandbox is found by its id (a name may be another org's sandbox's
// too), then ref must be that id or its name.
func (in *Inside) own(ctx context.Context, id, ref string) error {
	sb, err := in.sandboxes.Get(ctx, id)
	if err != nil && !errors.Is(err, api.ErrNotFound) {
		// Not an answer about the sandbox (a lookup cut short by a client
		// that went away, say): it must not read as one.
		return err
	}
	if err != nil || sb.ID != id || ref != sb.ID && ref != sb.Name {
		return api.Errorf(api.CodeNotFound, "sandbox %q not found", ref)
	}
	return nil
}

// peerListener accepts connections from peer only, and closes any other as
// soon as it is accepted.
type peerListener struct {
	net.Listener
	peer netip.Addr
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if from, ok := c.RemoteAddr().(*net.TCPAddr); ok && from.AddrPort().Addr().Unmap() == l.peer {
			return c, nil
		}
		c.Close()
	}
}

// limitListener keeps at most cap(places) accepted connections open: Accept
// waits for a place before it accepts, and a connection gives its place
// back when it is closed.
type limitListener struct {
	net.Listener
	places    chan struct{}
	done      chan struct{} // closed by Close
	closeOnce sync.Once
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.places <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.places
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.places }}, nil
}

// Close closes the listener and ends an Accept waiting for a place.
func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

// limitConn gives its place back once, on its first Close.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
