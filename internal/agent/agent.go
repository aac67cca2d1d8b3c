// Package agent is loam's in-sandbox agent and the daemon's client for it.
//
// The loam binary runs inside every gVisor sandbox as its init (PID 1) with
// `loam agent`. The agent owns every user process: it starts them as its own
// children (never as `runsc exec` children, which gVisor kills on restore),
// streams their output, delivers signals, reports exit codes and reaps every
// zombie of the sandbox.
//
// The daemon talks to it over plain HTTP and WebSocket on TCP inside the
// sandbox's network stack; every request carries the bearer token the agent
// was started with, and is served only if it comes over the sandbox's own
// link (see onLink), since a memory fork holds its source's token. The agent
// holds no file descriptor of the host, and no connection is needed for it
// to keep running: the daemon closes them all before a memory checkpoint and
// reconnects after a restore or fork, maybe at another address.
//
// The agent's parts, by job: package account (the sandbox's users, and
// work done with a user's rights), files (the files protocol, archives and
// watches), ports (listening ports and connections to them) and proc (the
// reaper, output rings, terminals, killing a process tree). This package
// holds the HTTP and WebSocket glue (auth, the link check, routes), exec,
// sessions, services, identity and token, and the daemon's Client.
//
// Endpoints:
//
//	GET  /healthz  {"ok":true,"pid":N,"uptime_ms":N}
//	GET  /exec     WebSocket, the exec protocol of package api (api/exec.go)
//	POST /token    {"token":"…"}: replace the token (a fork must not keep
//	               its source's); 204 on success
//	/files…        the files protocol and file watches (package files)
//	POST   /sessions                    start a detachable session (an
//	                                    api.ExecRequest) → 201 api.Session
//	GET    /sessions                    api.SessionList
//	GET    /sessions/{session}          api.Session
//	GET    /sessions/{session}/attach   WebSocket (api/exec.go); ?offset=N
//	                                    &stderr_offset=N&follow=false
//	POST   /sessions/{session}/wait     api.Session once it has exited
//	POST   /sessions/{session}/signal   api.SignalSession → 204
//	DELETE /sessions/{session}          kill its whole tree, forget it → 204
//	PUT    /services/{service}          define (or redefine) and start a
//	                                    service (api.Service) → 201 or 200
//	                                    api.ServiceStatus
//	GET    /services                    api.ServiceList
//	GET    /services/{service}          api.ServiceStatus
//	POST   /services/{service}/{action} start, stop or restart →
//	                                    api.ServiceStatus
//	DELETE /services/{service}          stop it and forget it → 204
//	GET    /services/{service}/logs     WebSocket of its output (see
//	                                    serveServiceLogs); ?offset=N
//	                                    &stderr_offset=N&follow=false
//	GET  /ports    api.PortList: the sandbox's listening TCP ports
//	GET  /ports/watch          WebSocket of api.PortEvent (package ports)
//	GET  /ports/{port}/stream  WebSocket carrying one TCP connection
package agent

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent/account"
	"loam.dev/loam/internal/agent/files"
	"loam.dev/loam/internal/agent/ports"
	"loam.dev/loam/internal/agent/proc"
)

// Environment variables the agent is configured by. ConfigFromEnv removes
// every LOAM_AGENT_* variable from the agent's environment, and no user
// process ever gets one, so that the token stays the agent's.
const (
	EnvListen = "LOAM_AGENT_LISTEN"
	EnvToken  = "LOAM_AGENT_TOKEN"
	// EnvUser and EnvDir are the sandbox's default user and directory
	// (an image's USER and WORKDIR); "loam" and the user's home unless set.
	EnvUser   = "LOAM_AGENT_USER"
	EnvDir    = "LOAM_AGENT_DIR"
	envPrefix = account.AgentEnvPrefix
)

// DefaultPort is the TCP port the agent listens on unless told otherwise.
const DefaultPort = 7071

// DefaultListen is the agent's default listen address: every address of the
// sandbox, so it still answers after a fork gives the sandbox a new one.
const DefaultListen = ":7071"

// Config configures an agent.
type Config struct {
	// Listen is the TCP address to serve on; DefaultListen when empty.
	Listen string
	// Token is the bearer token every request must carry. An agent with
	// no token refuses every request.
	Token string
	// Env is the sandbox's environment (KEY=VALUE), given to every process
	// under the variables of its request. LOAM_AGENT_* and the variables
	// that name the user (HOME, USER, LOGNAME, SHELL) are never taken from it.
	Env []string
	// Logger receives the agent's logs; slog.Default() when nil.
	Logger *slog.Logger
	// ServicesDir is where service definitions are kept (see service.go);
	// ConfigFromEnv sets DefaultServicesDir. Empty keeps them in memory
	// only, for tests of other parts.
	ServicesDir string
	// User runs the commands whose request names no user; account.DefaultUser
	// when empty. Dir is where they run when they name no directory; the
	// user's home when empty.
	User, Dir string
}

// ConfigFromEnv reads the agent's configuration from its environment
// (LOAM_AGENT_LISTEN, LOAM_AGENT_TOKEN), removes every LOAM_AGENT_* variable
// from the environment, and keeps the rest as the sandbox's environment.
func ConfigFromEnv() Config {
	cfg := Config{
		Listen:      os.Getenv(EnvListen),
		Token:       os.Getenv(EnvToken),
		ServicesDir: DefaultServicesDir,
		User:        os.Getenv(EnvUser),
		Dir:         os.Getenv(EnvDir),
	}
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, envPrefix) {
			os.Unsetenv(k)
			continue
		}
		cfg.Env = append(cfg.Env, kv)
	}
	return cfg
}

func (cfg Config) logger() *slog.Logger {
	if cfg.Logger != nil {
		return cfg.Logger
	}
	return slog.Default()
}

// Run serves the agent on cfg.Listen until ctx is done, then returns nil. It
// starts the process's reaper first (see NewHandler). It returns an error if
// it cannot listen or serving fails; as PID 1 the sandbox ends with it.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Token == "" {
		return fmt.Errorf("starting agent: no token (set %s)", EnvToken)
	}
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	log := cfg.logger()
	keepSysAdminToSelf(log)
	h := newHandler(cfg)
	// This is the agent's start, a fresh boot: a restore from memory goes
	// on where the checkpoint was and never comes here again.
	h.services.load()

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("starting agent: %w", err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("agent serving", "addr", ln.Addr().String(), "pid", os.Getpid())

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving agent on %s: %w", cfg.Listen, err)
	case <-ctx.Done():
	}
	// Exec sockets are hijacked connections, which Shutdown neither waits
	// for nor closes; their processes go on until the sandbox stops.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	<-errc
	return nil
}

// NewHandler returns the agent's HTTP handler. It starts the process's
// reaper (once per process), which from then on collects every child of the
// process with wait4(-1): see reaper. It does not start the services kept
// in cfg.ServicesDir: Run does, at the agent's start.
func NewHandler(cfg Config) http.Handler { return newHandler(cfg) }

func newHandler(cfg Config) *handler {
	if cfg.User == "" {
		cfg.User = account.DefaultUser
	}
	h := &handler{
		log:         cfg.logger(),
		env:         cfg.Env,
		user:        cfg.User,
		dir:         cfg.Dir,
		passwdPath:  account.PasswdFile,
		groupPath:   account.GroupFile,
		identityDir: IdentityDir,
		prefixes:    interfacePrefixes,
		started:     time.Now(),
	}
	h.reaper = proc.StartReaper(h.log)
	h.sessions = newSessions(h.log, h.reaper)
	h.apiSocket = &apiSocket{log: h.log, allowed: h.sandboxUser}
	h.setToken(cfg.Token)
	h.services = newServices(h, cfg.ServicesDir)

	h.mux = http.NewServeMux()
	h.mux.HandleFunc("GET /healthz", h.serveHealth)
	h.mux.HandleFunc("GET /exec", h.serveExec)
	h.mux.HandleFunc("POST /token", h.serveToken)
	h.mux.HandleFunc("POST /identity", h.serveIdentity)
	h.mux.HandleFunc("POST /sync", h.serveSync)
	files.New(h.log, users{h}).Routes(h.mux)
	h.mux.HandleFunc("POST /sessions", h.serveSessionCreate)
	h.mux.HandleFunc("GET /sessions", h.serveSessionList)
	h.mux.HandleFunc("GET /sessions/{session}", h.serveSessionGet)
	h.mux.HandleFunc("GET /sessions/{session}/attach", h.serveSessionAttach)
	h.mux.HandleFunc("POST /sessions/{session}/wait", h.serveSessionWait)
	h.mux.HandleFunc("POST /sessions/{session}/signal", h.serveSessionSignal)
	h.mux.HandleFunc("DELETE /sessions/{session}", h.serveSessionDelete)
	h.serviceRoutes(h.mux)
	ports.New(h.log, listenPort(cfg.Listen)).Routes(h.mux)
	return h
}

// handler serves the agent's endpoints.
type handler struct {
	log *slog.Logger
	env []string
	// user and dir are the defaults of a request that names neither
	// (Config.User, Config.Dir).
	user, dir string
	reaper    *proc.Reaper
	// sessions is the registry of exec sessions.
	sessions *sessions
	// services is the registry of services.
	services *services
	// identity is the last identity the daemon sent (nil before any):
	// which sandbox this is (even in a fork of a memory checkpoint, whose
	// environment still names its source) and the sandbox's env, which
	// services get.
	identity atomic.Pointer[Identity]
	// The account databases users are looked up in; tests use others.
	passwdPath, groupPath string
	// identityDir is where POST /identity writes; tests use another.
	identityDir string
	started     time.Time
	mux         *http.ServeMux
	// tokenSum is the SHA-256 of the token, nil for none. Comparing sums in
	// constant time hides the token's length too.
	tokenSum atomic.Pointer[[sha256.Size]byte]
	// apiSocket serves the in-sandbox API to the sandbox's own processes.
	apiSocket *apiSocket
	// prefixes lists the sandbox's interface addresses (see onLink);
	// tests use others.
	prefixes func() ([]netip.Prefix, error)
}

// users is the sandbox's account database, read at each call from the
// files the handler names (tests name others once it is made).
type users struct{ h *handler }

// Default is the user of a request that names none.
func (u users) Default() string { return u.h.user }

// Lookup finds a user by name, or by uid.
func (u users) Lookup(name string) (account.Account, error) {
	return account.Lookup(u.h.passwdPath, u.h.groupPath, name)
}

func (h *handler) setToken(token string) {
	if token == "" {
		h.tokenSum.Store(nil)
		return
	}
	sum := sha256.Sum256([]byte(token))
	h.tokenSum.Store(&sum)
}

func (h *handler) authorized(r *http.Request) bool {
	want := h.tokenSum.Load()
	if want == nil {
		return false
	}
	token, ok := api.BearerToken(r.Header)
	if !ok {
		return false
	}
	got := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// ServeHTTP serves only requests over the sandbox's own link (see onLink),
// and of those only the ones that carry the token.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.fromOwnLink(r) {
		api.WriteError(w, api.Errorf(api.CodeForbidden, "the agent serves only its sandbox's host"))
		return
	}
	if !h.authorized(r) {
		api.WriteError(w, api.Errorf(api.CodeUnauthorized, "missing or wrong agent token"))
		return
	}
	h.mux.ServeHTTP(w, r)
}

// ProtocolVersion is the version of the daemon–agent protocol this agent
// speaks: what its endpoints are and what they take. A sandbox restored or
// forked from a checkpoint runs the agent that was in the checkpoint's
// memory, which may be older than the daemon, so the daemon asks (GET
// /healthz) and refuses, with a clear error, what an old agent cannot do.
//
// Versions: 1 is the first agent, which reported none (exec, token,
// identity); 2 adds the agent's own link check, the in-sandbox API socket
// and renaming forks; 3 adds exec sessions (detachable execs, the
// /sessions endpoints, the session id in "started"), the files protocol
// and file watches (package files), ports (GET /ports,
// /ports/watch and /ports/{port}/stream), and services (the /services
// endpoints, service.go); 4 adds secrets to the identity (SecretEnv,
// SecretFiles), which older agents ignore; 5 adds POST /sync.
const ProtocolVersion = 5

// Health is the body of GET /healthz.
type Health struct {
	OK bool `json:"ok"`
	// Version is the agent's ProtocolVersion; 0 (absent) means 1.
	Version int `json:"version,omitempty"`
	// PID is the agent's pid: 1 inside a sandbox.
	PID int `json:"pid"`
	// UptimeMS is how long the agent has been serving, in milliseconds.
	UptimeMS int64 `json:"uptime_ms"`
}

func (h *handler) serveHealth(w http.ResponseWriter, r *http.Request) {
	api.WriteJSON(w, http.StatusOK, Health{
		OK:       true,
		Version:  ProtocolVersion,
		PID:      os.Getpid(),
		UptimeMS: time.Since(h.started).Milliseconds(),
	})
}

// tokenRequest is the body of POST /token.
type tokenRequest struct {
	Token string `json:"token"`
}

func (h *handler) serveToken(w http.ResponseWriter, r *http.Request) {
	var req tokenRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil {
		api.WriteError(w, api.Errorf(api.CodeInvalid, `the body must be {"token":"…"}`))
		return
	}
	if req.Token == "" {
		api.WriteError(w, api.Errorf(api.CodeInvalid, "the new token is empty"))
		return
	}
	h.setToken(req.Token)
	h.log.Info("agent token rotated")
	w.WriteHeader(http.StatusNoContent)
}

// serveSync writes what the sandbox's kernel holds for the files of its
// root filesystem (the disk loam snapshots) back to them (syncfs(2)), so
// that a snapshot of the disk taken next, with the sandbox running, holds
// every write made before it. gVisor writes a regular file's data to the
// host file at once, except pages it caches in its own memory: writable
// shared mappings and writes to cached ranges of a file it holds no
// read-write host descriptor for.
func (h *handler) serveSync(w http.ResponseWriter, r *http.Request) {
	if err := syncRoot(); err != nil {
		h.log.Warn("syncing the root filesystem", "err", err)
		api.WriteError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// syncRoot is syncfs(2) of the filesystem mounted at /.
func syncRoot() error {
	fd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

// listenPort is the port of a listen address; DefaultPort when it names none.
func listenPort(addr string) int {
	if addr == "" {
		return DefaultPort
	}
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return DefaultPort
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		return DefaultPort
	}
	return n
}
