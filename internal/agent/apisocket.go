package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent/account"
)

// APISocketName is the name, in IdentityDir, of the unix socket on which the
// agent serves the sandbox's own API to the sandbox's processes. The token
// of that API (IdentityDir/token) is root's alone; the agent lends it to
// root and to the sandbox's user (the account commands run as by default),
// whom it tells apart by the peer credentials of the socket, so that no
// other user of the sandbox (a web server's, say) can take or restore its
// checkpoints. The in-sandbox CLI uses the socket when it cannot read the
// token file.
const APISocketName = api.InsideSocketName

// apiSocket serves the in-sandbox API's proxy on a unix socket.
type apiSocket struct {
	log *slog.Logger
	// allowed decides whether a process of uid may use the API.
	allowed func(uid uint32) bool

	id atomic.Pointer[Identity] // where the API is now; a fork moves it
	// mu guards serving: whether the socket is served. A start that
	// failed (no room on the disk for the socket) is tried again at the
	// next identity.
	mu      sync.Mutex
	serving bool
	proxy   *httputil.ReverseProxy
}

type peerKey struct{}

// set points the proxy at id's API and, until it serves, starts serving
// the socket at path.
func (s *apiSocket) set(id Identity, path string) error {
	if id.APIURL == "" {
		return errors.New("no in-sandbox API URL")
	}
	if _, err := url.Parse(id.APIURL); err != nil {
		return fmt.Errorf("in-sandbox API URL %q: %w", id.APIURL, err)
	}
	s.id.Store(&id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.serving {
		return nil
	}
	if err := s.serve(path); err != nil {
		return err
	}
	s.serving = true
	return nil
}

func (s *apiSocket) serve(path string) error {
	s.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			id := s.id.Load()
			target, _ := url.Parse(id.APIURL) // checked by set
			pr.SetURL(target)
			pr.Out.Header.Set("Authorization", "Bearer "+id.APIToken)
		},
		// The sandbox's environment may name a proxy; the host's API is
		// reached directly.
		Transport: &http.Transport{
			Proxy:           nil,
			DialContext:     (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			IdleConnTimeout: 30 * time.Second,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				// The caller went away (which ends the call to the
				// host too): nobody to answer, nothing unreachable.
				return
			}
			s.log.Warn("in-sandbox API unreachable", "err", err)
			api.WriteError(w, api.Errorf(api.CodeUnavailable, "the sandbox's API on the host does not answer"))
		},
	}
	_ = os.Remove(path) // a socket left by the agent of a restored or forked checkpoint's disk
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("serving the in-sandbox API on %s: %w", path, err)
	}
	// Anyone may connect; the peer's uid decides who is served.
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return err
	}
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if uc, ok := c.(*net.UnixConn); ok {
				if cred, err := peerCred(uc); err == nil {
					return context.WithValue(ctx, peerKey{}, cred)
				}
			}
			return ctx
		},
	}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("in-sandbox API socket stopped", "err", err)
		}
	}()
	return nil
}

// ServeHTTP passes a request of an allowed user on to the host's API with
// the sandbox's token.
func (s *apiSocket) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cred, ok := r.Context().Value(peerKey{}).(*unix.Ucred)
	if !ok || !s.allowed(cred.Uid) {
		api.WriteError(w, api.Errorf(api.CodeForbidden, "only root and the sandbox's user may use the sandbox's API"))
		return
	}
	s.proxy.ServeHTTP(w, r)
}

// peerCred is the credentials of the process at the other end of c.
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	err = raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	return cred, errors.Join(err, credErr)
}

// sandboxUser reports whether uid is root or the sandbox's user: the
// account commands run as when they name none.
func (h *handler) sandboxUser(uid uint32) bool {
	if uid == 0 {
		return true
	}
	acct, err := account.Lookup(h.passwdPath, h.groupPath, h.user)
	return err == nil && acct.UID == uid
}
