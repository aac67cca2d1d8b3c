package mcp

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Path is where Handler serves MCP's streamable HTTP transport.
const Path = "/mcp"

// sessionIdle is how long an HTTP session may go without a request before
// it is closed, so that clients that vanish do not pile up.
const sessionIdle = 30 * time.Minute

// Handler serves the server over MCP's streamable HTTP transport at Path,
// to callers that send "Authorization: Bearer <token>". An empty token
// lets no one in.
func (s *Server) Handler(token string) http.Handler {
	verify := func(_ context.Context, got string, _ *http.Request) (*auth.TokenInfo, error) {
		if token == "" || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			return nil, fmt.Errorf("%w: send the loam API token as Authorization: Bearer $LOAM_TOKEN", auth.ErrInvalidToken)
		}
		// One user: the token's holder. The SDK ties each session to it.
		return &auth.TokenInfo{UserID: "loam"}, nil
	}
	streamable := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s.mcp },
		&sdk.StreamableHTTPOptions{SessionTimeout: sessionIdle, Logger: s.log})
	mux := http.NewServeMux()
	mux.Handle(Path, auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(streamable))
	return mux
}

// ListenAndServe serves Handler(token) on l (with TLS when tlsConfig is not
// nil) until ctx ends, then shuts the server down, giving calls in flight a
// few seconds to end.
func (s *Server) ListenAndServe(ctx context.Context, l net.Listener, token string, tlsConfig *tls.Config) error {
	if token == "" {
		return errors.New("serving MCP over HTTP: no token to require of callers (set LOAM_TOKEN)")
	}
	srv := &http.Server{Handler: s.Handler(token), ReadHeaderTimeout: 10 * time.Second}
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
		l = tls.NewListener(l, tlsConfig)
	}
	s.log.Info("serving MCP over HTTP", "url", scheme+"://"+l.Addr().String()+Path,
		"checkpoint_before", string(s.cfg.CheckpointBefore), "checkpoint_memory", s.cfg.CheckpointMemory,
		"read_only", s.cfg.ReadOnly)
	if ap, err := netip.ParseAddrPort(l.Addr().String()); err == nil && !ap.Addr().IsLoopback() && tlsConfig == nil {
		s.log.Warn("MCP over plain HTTP on an address other machines reach: the token and every call cross the network in clear; give --tls-cert and --tls-key, or put a TLS proxy in front")
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	select {
	case err := <-done:
		return fmt.Errorf("serving MCP over HTTP: %w", err)
	case <-ctx.Done():
	}
	// A session's event stream lasts as long as the session: end the
	// sessions, so that Shutdown has only calls in flight to wait for.
	for ss := range s.mcp.Sessions() {
		_ = ss.Close()
	}
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil {
		// Calls still running after the grace are cut, as a stdio server's
		// are when its client goes.
		s.log.Warn("cutting the MCP calls still running", "error", err.Error())
		_ = srv.Close()
	}
	return nil
}

// shutdownGrace is how long calls in flight may take to end once the server
// is told to stop.
const shutdownGrace = 5 * time.Second
