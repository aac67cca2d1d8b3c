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
	"strings"
	"sync"
	"time"

	"loam.dev/loam/api"
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

	mu   sync.Mutex
	srvs map[string]*http.Server
}

// NewInside makes the in-sandbox API. Sandbox tokens are derived from
// secret, so they need no storing and survive restarts of the daemon.
func NewInside(sandboxes Sandboxes, secret string, log *slog.Logger) *Inside {
	return &Inside{sandboxes: sandboxes, secret: []byte(secret), log: log, srvs: map[string]*http.Server{}}
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
	h := in.handler(id)
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if from, err := netip.ParseAddrPort(r.RemoteAddr); err != nil || from.Addr().Unmap() != peer {
			writeError(w, r, in.log, api.Errorf(api.CodeUnauthorized, "this API serves only its own sandbox"))
			return
		}
		h.ServeHTTP(w, r)
	})}
	in.srvs[id] = srv
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			in.log.Warn("in-sandbox API stopped", "sandbox", id, "err", err)
		}
	}()
	return nil
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
	s := &Server{sandboxes: in.sandboxes, log: in.log, mux: http.NewServeMux(), where: " inside a sandbox"}
	token := in.Token(id)
	v1 := func(pattern string, h func(http.ResponseWriter, *http.Request) error) {
		s.handle(pattern, func(w http.ResponseWriter, r *http.Request) {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
				writeError(w, r, s.log, api.Errorf(api.CodeUnauthorized, "missing or wrong token"))
				return
			}
			if err := in.own(r.Context(), id, r.PathValue("sandbox")); err != nil {
				writeError(w, r, s.log, err)
				return
			}
			if err := h(w, r); err != nil {
				writeError(w, r, s.log, err)
			}
		})
	}
	v1("GET /v1/sandboxes/{sandbox}", s.getSandbox)
	s.checkpointRoutes(v1)
	return s
}

// own refuses a path about any sandbox but id, as if it did not exist.
func (in *Inside) own(ctx context.Context, id, ref string) error {
	sb, err := in.sandboxes.Get(ctx, ref)
	if err != nil || sb.ID != id {
		return api.Errorf(api.CodeNotFound, "sandbox %q not found", ref)
	}
	return nil
}
