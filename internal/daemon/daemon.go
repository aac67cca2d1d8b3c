// Package daemon wires loam's daemon together (loam serve): configuration,
// the admin token, the store, the disk pool, the runtime, the network, the
// sandbox manager and the HTTP server, and the recovery of sandboxes left
// running by a previous daemon.
package daemon

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/atomicfile"
	"loam.dev/loam/internal/conns"
	"loam.dev/loam/internal/console"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/image"
	"loam.dev/loam/internal/network"
	"loam.dev/loam/internal/proxy"
	"loam.dev/loam/internal/runtime/gvisor"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/server"
	"loam.dev/loam/internal/store/sqlite"
	"loam.dev/loam/internal/tlsconfig"
)

// Config is the daemon's configuration; every field has a flag and an
// environment variable (see Command).
type Config struct {
	Listen  string // address of the API
	DataDir string // where everything is kept
	Domain  string // sandbox URLs are http://NAME--ORG.DOMAIN
	Org     string
	// TLSCert and TLSKey, both or neither, are PEM files: with them the
	// listener serves TLS, and URLs are https://.
	TLSCert, TLSKey string
	TokenFile       string // file holding the admin token; DataDir/token by default
	Token           string // the admin token itself, overriding TokenFile
	Runsc           string // the runsc binary
	// AgentBinary is the static loam binary run inside sandboxes; this
	// binary by default.
	AgentBinary string
	// Subnet is the private range sandboxes get addresses from, a /30 each.
	Subnet string
	// DNSUpstream lists, comma-separated, the DNS servers the sandboxes'
	// resolver forwards to; empty means the host's /etc/resolv.conf.
	DNSUpstream string
	// TemplateCache is where built templates are cached, shared by daemons.
	TemplateCache string
	// DefaultTemplate is the template of a create that names none.
	DefaultTemplate string
	// DebianMirror is the Debian archive the base template is built
	// from; "" is the host's apt mirror, or deb.debian.org.
	DebianMirror string
	// CheckpointLimit is how many checkpoints the owner may take per
	// sandbox; InsideCheckpointLimit how many a sandbox may take of
	// itself, apart from those.
	CheckpointLimit       int
	InsideCheckpointLimit int
	// PoolReserveMiB is the host memory warm pools leave to sandboxes.
	PoolReserveMiB int
	// DebugListen, when set, is a loopback address where the daemon
	// serves Go's profiles (net/http/pprof): goroutines, heap, CPU. They
	// need no token, so only loopback addresses are taken.
	DebugListen string
	// WriteTimeout is how long a client may take nothing of a stream, or
	// send nothing of an upload, before it is cut off.
	WriteTimeout time.Duration
	// MaxConns and MaxConnsPerClient cap the API listener's connections,
	// in all and from one client address (see package conns); MaxConns
	// is held to a quarter of the open-file limit. ConnIdleTimeout is how
	// long a connection may wait for its next request (or, at most 10 s,
	// for the header of its first).
	MaxConns, MaxConnsPerClient int
	ConnIdleTimeout             time.Duration
	// MaxSandboxes and MaxHeavy are the daemon's caps (see
	// sandbox.Config); 0 is none.
	MaxSandboxes int
	MaxHeavy     int
	// DiskSize is the size of the loop file the btrfs pool lives on, when
	// the data dir is not on btrfs.
	DiskSize int64
	// Idle is the idle of a sandbox created without one: how long it may
	// go without activity before it sleeps; 0 is never.
	Idle time.Duration
	// IdleEvery and IdleMin are for tests only: how often idle sandboxes
	// are looked for (10 s by default) and the shortest idle a sandbox may
	// ask for (1m by default).
	IdleEvery, IdleMin time.Duration
	// Out is where the start-up banner goes (the token and how to use it).
	Out *os.File
}

// Daemon is a running loam daemon.
type Daemon struct {
	cfg     Config
	log     *slog.Logger
	Manager *sandbox.Manager
	Token   string
	URL     string
	closers []func() error
	srv     *http.Server
	ln      net.Listener
	inside  *server.Inside
	// madeToken is the file of an admin token made by this start, if any.
	madeToken string
	// tokenFile is the file the admin token is kept in; empty when it
	// was given (Config.Token).
	tokenFile string
}

// Start sets the daemon up and starts serving; Wait or Close end it.
func Start(ctx context.Context, cfg Config, log *slog.Logger) (*Daemon, error) {
	d := &Daemon{cfg: cfg, log: log}
	if err := d.start(ctx); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

func (d *Daemon) start(ctx context.Context) error {
	cfg := &d.cfg
	if os.Geteuid() != 0 {
		return errors.New("loam serve must run as root (it makes network namespaces, mounts and gVisor sandboxes)")
	}
	raiseFileLimit(d.log)
	if err := sandbox.CheckOrg(cfg.Org); err != nil {
		return fmt.Errorf("--org: %w", err)
	}
	// First the data dir's lock: nothing in it may be touched (the store
	// opened, the pools' leftovers cleared, sandboxes taken back) while
	// another daemon owns it.
	unlock, err := lockDataDir(cfg.DataDir, d.log)
	if err != nil {
		return err
	}
	d.closers = append(d.closers, unlock)
	// One name for the data dir, whichever way it was reached: runsc keeps
	// the paths it was given in its state, so a daemon reaching it through
	// a symlink one day and directly the next would lose its containers.
	if cfg.DataDir, err = canonicalDir(cfg.DataDir); err != nil {
		return err
	}
	// Then the port, before anything is recovered: a second daemon that
	// cannot serve must fail before it changes anything.
	tlsConfig, err := tlsconfig.Load(cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return err
	}
	if tlsConfig != nil {
		tlsConfig.NextProtos = []string{"h2", "http/1.1"}
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", cfg.Listen, err)
	}
	d.ln = ln
	d.closers = append(d.closers, func() error {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			return err
		}
		return nil
	})
	if err := d.serveDebug(); err != nil {
		return err
	}
	if err := d.loadToken(); err != nil {
		return err
	}
	secret, err := loadSecret(cfg.DataDir, d.log)
	if err != nil {
		return err
	}
	if cfg.AgentBinary == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		cfg.AgentBinary = exe
	}
	// Sandboxes run a copy kept by its content, which an upgrade of the
	// binary does not change under them (see keepAgentBinary).
	if cfg.AgentBinary, err = keepAgentBinary(cfg.DataDir, cfg.AgentBinary); err != nil {
		return err
	}
	runsc, err := findRunsc(cfg.Runsc)
	if err != nil {
		return err
	}

	st, err := sqlite.Open(ctx, filepath.Join(cfg.DataDir, "loam.db"))
	if err != nil {
		return fmt.Errorf("opening store: %w", err)
	}
	d.closers = append(d.closers, st.Close)
	secrets, err := openSecrets(cfg.DataDir, st, d.log)
	if err != nil {
		return err
	}

	pool, err := disk.Open(ctx, filepath.Join(cfg.DataDir, "disk"), cfg.DiskSize)
	if err != nil {
		return fmt.Errorf("opening disk pool: %w", err)
	}
	d.closers = append(d.closers, pool.Close)
	d.log.Info("disk pool", "kind", pool.Kind())

	rt, err := gvisor.New(gvisor.Config{Runsc: runsc, Root: filepath.Join(cfg.DataDir, "runsc"), Logger: d.log})
	if err != nil {
		return fmt.Errorf("setting up gVisor: %w", err)
	}
	subnet, err := netip.ParsePrefix(cfg.Subnet)
	if err != nil {
		return fmt.Errorf("--subnet %q: %w", cfg.Subnet, err)
	}
	// For a teardown, which must drop this daemon's firewall table, never
	// another's (see Teardown).
	if err := atomicfile.WriteFile(filepath.Join(cfg.DataDir, subnetFile), []byte(subnet.Masked().String()+"\n"), 0o644); err != nil {
		return fmt.Errorf("recording the subnet: %w", err)
	}
	var upstreams []string
	for _, u := range strings.Split(cfg.DNSUpstream, ",") {
		if u = strings.TrimSpace(u); u != "" {
			upstreams = append(upstreams, u)
		}
	}
	if len(upstreams) == 0 {
		if upstreams, err = network.HostUpstreams(); err != nil {
			return fmt.Errorf("setting up networking: %w (give --dns-upstream)", err)
		}
	}
	nets, err := network.New(network.Config{
		Subnet: subnet, InsidePort: network.DefaultInsidePort,
		DNSUpstreams: upstreams, Log: d.log,
	})
	if err != nil {
		return fmt.Errorf("setting up networking: %w", err)
	}
	d.closers = append(d.closers, nets.Close)
	// Before any sandbox is taken back, and never removed: sandboxes keep
	// running while the daemon is down.
	if err := nets.Firewall().Install(ctx); err != nil {
		return fmt.Errorf("setting up networking: %w", err)
	}
	if err := network.EnableForwarding(); err != nil {
		return fmt.Errorf("setting up networking: %w", err)
	}
	if cfg.TemplateCache == "" {
		cfg.TemplateCache = filepath.Join(cfg.DataDir, "templates")
	}
	tplOpts := disk.TemplateOptions{DebianMirror: disk.ChooseDebianMirror(cfg.DebianMirror, "/etc/apt")}
	d.log.Debug("the base template is built from", "mirror", tplOpts.DebianMirror)
	if _, err := disk.FindTemplate(cfg.DefaultTemplate, tplOpts); err != nil {
		return fmt.Errorf("--default-template: %w", err)
	}
	tpl := newTemplates(pool, cfg.TemplateCache, cfg.DefaultTemplate, tplOpts, d.log)
	tpl.warm(context.WithoutCancel(ctx))

	// Images are unpacked beside the built-in templates, and pulled with
	// the credentials of `loam image login`, then the Docker config's.
	regSecrets, err := openSecrets(cfg.DataDir, st.RegistryCredentials(), d.log)
	if err != nil {
		return err
	}
	registries := image.NewCredentials(regSecrets)
	images := image.New(image.Config{
		Records: st, Pool: pool, CacheDir: filepath.Join(cfg.TemplateCache, "images"),
		Keychain: authn.NewMultiKeychain(registries, authn.DefaultKeychain), Log: d.log,
	})
	if err := images.Sweep(ctx); err != nil {
		d.log.Error("removing the templates of images that are gone", "err", err)
	}
	go func() {
		if err := images.Run(context.WithoutCancel(ctx)); err != nil {
			d.log.Error("pulling images", "err", err)
		}
	}()
	d.closers = append(d.closers, images.Close)

	// With a certificate, URLs are https. Without one, a domain with a
	// port, or localhost, is this listener's own, plain http; any other is
	// taken to be behind a proxy that serves TLS.
	scheme := "https"
	if _, _, err := net.SplitHostPort(cfg.Domain); tlsConfig == nil && (err == nil || strings.HasPrefix(cfg.Domain, "localhost")) {
		scheme = "http"
	}
	d.Manager = sandbox.New(sandbox.Config{
		DataDir:               cfg.DataDir,
		AgentBinary:           cfg.AgentBinary,
		Domain:                cfg.Domain,
		Org:                   cfg.Org,
		Scheme:                scheme,
		DefaultTemplate:       cfg.DefaultTemplate,
		Defaults:              api.Resources{CPUs: 1, MemoryMiB: 512, DiskMiB: 4096},
		CheckpointLimit:       cfg.CheckpointLimit,
		InsideCheckpointLimit: cfg.InsideCheckpointLimit,
		PoolReserveMiB:        cfg.PoolReserveMiB,
		MaxSandboxes:          cfg.MaxSandboxes,
		MaxHeavy:              cfg.MaxHeavy,
		Secret:                secret,
		Secrets:               secrets,
		Images:                images,
		Registries:            registries,
		InsidePort:            network.DefaultInsidePort,
		Idle:                  cfg.Idle,
		IdleMin:               cfg.IdleMin,
		Inside: func(m *sandbox.Manager) sandbox.Insiders {
			d.inside = server.NewInside(m, secret, d.log)
			return d.inside
		},
	}, st, rt, pool, nets, tpl, d.log)
	if err := d.Manager.Recover(ctx); err != nil {
		d.log.Error("recovery left some things behind", "err", err)
	}
	// Warm pools fill in the background, after recovery deleted the
	// members the last daemon left.
	if err := d.Manager.StartPools(ctx); err != nil {
		return err
	}
	d.closers = append(d.closers, d.Manager.ClosePools)

	// Sandboxes write their init logs on the host: cap and rotate them.
	logs := &gvisor.LogKeeper{
		Bundles: filepath.Join(cfg.DataDir, "sandboxes", "*", "bundle"),
		Logger:  d.log,
	}
	go func() {
		if err := logs.Run(context.WithoutCancel(ctx)); err != nil {
			d.log.Error("keeping sandbox logs", "err", err)
		}
	}()
	d.closers = append(d.closers, logs.Close)

	// Sandboxes whose idle time has passed go to sleep.
	idle := sandbox.NewIdle(d.Manager, cfg.IdleEvery)
	go func() {
		if err := idle.Run(context.WithoutCancel(ctx)); err != nil {
			d.log.Error("putting idle sandboxes to sleep", "err", err)
		}
	}()
	d.closers = append(d.closers, idle.Close)

	d.URL = "http://" + ln.Addr().String()
	if tlsConfig != nil {
		d.URL = "https://" + ln.Addr().String()
	}
	if err := atomicfile.WriteFile(filepath.Join(cfg.DataDir, "api_url"), []byte(d.URL+"\n"), 0o644); err != nil {
		return err
	}
	// Sandboxes' URLs (by Host) go to the front door, the rest to the API.
	front := proxy.New(d.Manager, proxy.Config{
		Domain: cfg.Domain, Org: cfg.Org, Token: d.Token, TLS: tlsConfig != nil,
		BodyTimeout: cfg.WriteTimeout,
	}, d.log)
	// The web console shares the API's listener (not sandboxes' URLs,
	// which the front door takes first): its page at /, its sessions
	// authorizing API calls from that page.
	con, err := console.New(ctx, console.Config{Token: d.Token, TLS: tlsConfig != nil, Sessions: st, TokenFile: d.tokenFile, Idle: cfg.Idle}, d.log)
	if err != nil {
		return fmt.Errorf("loading the web console: %w", err)
	}
	apiServer := server.New(d.Manager, d.Token, d.log, server.WithWriteTimeout(cfg.WriteTimeout), server.WithBrowserSessions(con))
	limits := d.connLimits()
	connIdle := cfg.ConnIdleTimeout
	if connIdle <= 0 {
		connIdle = DefaultConnIdleTimeout
	}
	d.srv = &http.Server{
		Handler: limits.Handler(front.Mount(con.Mount(apiServer))),
		// A connection that has sent nothing yet is idle too.
		ReadHeaderTimeout: min(10*time.Second, connIdle),
		// A request's header and body (at most 1 MiB of JSON). Uploads,
		// and bodies passed to a sandbox's URL, renew their own read
		// deadline at every read (the write timeout); WebSockets and
		// other upgrades have none once hijacked.
		ReadTimeout:    time.Minute,
		IdleTimeout:    connIdle,
		MaxHeaderBytes: maxHeaderBytes,
		ConnContext:    limits.ConnContext,
		ErrorLog:       slog.NewLogLogger(d.log.Handler(), slog.LevelWarn),
		TLSConfig:      tlsConfig,
	}
	ln = limits.Listener(ln)
	go func() {
		serve := d.srv.Serve
		if tlsConfig != nil {
			serve = func(ln net.Listener) error { return d.srv.ServeTLS(ln, "", "") }
		}
		if err := serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("serving", "err", err)
		}
	}()
	d.log.Info("loam daemon serving", "url", d.URL, "data_dir", cfg.DataDir, "runsc", runsc)
	if d.madeToken != "" {
		out := cfg.Out
		if out == nil {
			out = os.Stderr
		}
		fmt.Fprintf(out, "\nloam: made an admin token in %s. To use the API and the CLI:\n\n"+
			"  export LOAM_API_URL=%s LOAM_TOKEN=%s\n\n", d.madeToken, d.URL, d.Token)
	}
	return nil
}

// Close stops serving and releases the store and the pool. Sandboxes keep
// running: the next daemon takes them back.
func (d *Daemon) Close() error {
	var errs []error
	if d.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, d.srv.Shutdown(ctx))
		cancel()
		d.srv.Close()
	}
	if d.inside != nil {
		d.inside.CloseAll()
	}
	for i := len(d.closers) - 1; i >= 0; i-- {
		errs = append(errs, d.closers[i]())
	}
	d.closers = nil
	return errors.Join(errs...)
}

// loadToken finds the admin token: given, in the token file, or made now.
func (d *Daemon) loadToken() error {
	cfg := &d.cfg
	if cfg.Token != "" {
		d.Token = cfg.Token
		return nil
	}
	path := cfg.TokenFile
	if path == "" {
		path = filepath.Join(cfg.DataDir, "token")
	}
	d.tokenFile = path
	b, err := os.ReadFile(path)
	if err == nil {
		if err := restrictMode(path, 0o600, d.log); err != nil {
			return err
		}
		d.Token = strings.TrimSpace(string(b))
		if d.Token == "" {
			return fmt.Errorf("token file %s is empty", path)
		}
		return nil
	}
	if !errors.Is(err, os.ErrNotExist) || cfg.TokenFile != "" {
		return fmt.Errorf("reading token: %w", err)
	}
	d.Token = "loam_" + rand.Text() + rand.Text()
	if err := atomicfile.WriteFile(path, []byte(d.Token+"\n"), 0o600); err != nil {
		return fmt.Errorf("storing the new admin token: %w", err)
	}
	d.madeToken = path
	return nil
}

// findRunsc finds the runsc binary: the flag, then PATH.
func findRunsc(flag string) (string, error) {
	if flag != "" {
		if _, err := os.Stat(flag); err != nil {
			return "", fmt.Errorf("--runsc: %w", err)
		}
		return flag, nil
	}
	p, err := exec.LookPath("runsc")
	if err != nil {
		return "", errors.New("runsc not found: run scripts/setup (it builds the pinned gVisor) or pass --runsc")
	}
	return p, nil
}

// checkStatic refuses an agent binary (b, read from path) that needs a
// dynamic loader: inside a sandbox there may be none, or the wrong one.
func checkStatic(path string, b []byte) error {
	if strings.Contains(string(b[:min(len(b), 1<<16)]), "/lib64/ld-linux") {
		return fmt.Errorf("agent binary %s is dynamically linked; build loam with CGO_ENABLED=0", path)
	}
	return nil
}

func raiseFileLimit(log *slog.Logger) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		log.Warn("raising the open-file limit", "err", err)
	}
}

// Defaults of the API listener's limits.
const (
	// DefaultMaxConns is --max-conns's default.
	DefaultMaxConns = 4096
	// DefaultConnIdleTimeout is --conn-idle-timeout's default, near
	// nginx's 75 s. A client that keeps idle connections longer (Go's, 90
	// s) finds this one closed and retries on a new one.
	DefaultConnIdleTimeout = time.Minute
	// maxHeaderBytes bounds a request's header (net/http's default is 1
	// MiB, which each of thousands of connections could make the daemon
	// hold): a token, cookies and a sandbox app's own headers fit.
	maxHeaderBytes = 64 << 10
)

// connLimits makes the limiter of the API listener's connections. The caps
// stay within a quarter of the open-file limit: the rest is for sandboxes
// (their agents' sockets, logs, the store), so that a flood of connections
// can never take the descriptors the daemon needs to work.
func (d *Daemon) connLimits() *conns.Limiter {
	maxConns, perClient := d.cfg.MaxConns, d.cfg.MaxConnsPerClient
	if maxConns <= 0 {
		maxConns = DefaultMaxConns
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < 1<<40 {
		maxConns = min(maxConns, max(64, int(lim.Cur/4)))
	}
	if perClient <= 0 {
		perClient = max(1, maxConns/4)
	}
	perClient = min(perClient, maxConns)
	d.log.Info("API connections", "max", maxConns, "per_client", perClient, "open_file_limit", lim.Cur)
	return conns.New(maxConns, perClient, d.log)
}
