// Package daemon wires loam's daemon together (loam serve): configuration,
// the admin token, the store, the disk pool, the runtime, the network, the
// sandbox manager and the HTTP server, and the recovery of sandboxes left
// running by a previous daemon.
package daemon

import (
	"context"
	"crypto/tls"
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

	"golang.org/x/sync/errgroup"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/atomicfile"
	"loam.dev/loam/internal/audit"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/checkpoints"
	"loam.dev/loam/internal/cluster"
	"loam.dev/loam/internal/conns"
	"loam.dev/loam/internal/console"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/guest"
	"loam.dev/loam/internal/image"
	"loam.dev/loam/internal/network"
	"loam.dev/loam/internal/proxy"
	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/internal/runtime/gvisor"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/secret"
	"loam.dev/loam/internal/server"
	"loam.dev/loam/internal/sleep"
	"loam.dev/loam/internal/store/postgres"
	"loam.dev/loam/internal/template"
	"loam.dev/loam/internal/tlsconfig"
	"loam.dev/loam/internal/warmpool"
)

// Config is the daemon's configuration; every field has a flag and an
// environment variable (see Command).
type Config struct {
	Listen  string // address of the API
	DataDir string // where everything is kept
	// Database, when set, is the PostgreSQL database (a postgres:// URL)
	// that keeps the records instead of SQLite in the data dir.
	Database string
	// Objects, when set, is the object store (s3://…, file://…) that
	// keeps the checkpoints off the node too (see internal/objects).
	Objects string
	// CacheSize caps the node's cache of what it fetched from the object
	// store, in bytes.
	CacheSize int64
	// CPUFeatures, when set, pins the CPU features sandboxes see to this
	// comma-separated list (gVisor's names); else a cluster's nodes pin
	// them to what they all have.
	CPUFeatures string
	// Node, with Database, makes the daemon node Node of the cluster that
	// shares the database (see internal/cluster); Advertise is the URL
	// the other nodes reach its API at; Lease, for tests, its lease.
	Node, Advertise string
	Lease           time.Duration
	// Role is the node's: cluster.RoleNode (runs sandboxes) or
	// cluster.RoleAPI (a front end that runs none).
	Role   string
	Domain string // sandbox URLs are http://NAME--ORG.DOMAIN
	Org    string
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
	// NoFastPath turns gVisor's systrap fast path off (see
	// gvisor.Config.DisableFastPath): for hosts with more busy sandboxes
	// than cores.
	NoFastPath bool
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
	// AuditRetention is how long the audit log keeps a record; 0 keeps
	// them all.
	AuditRetention time.Duration
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
	cfg Config
	log *slog.Logger
	// cpuPin says which CPU features a sandbox booted now may see (see
	// pinFeatures); nil for all the host's. runscVersion is runsc's
	// build and hostFeatures this host's CPU features as gVisor names
	// them, read once at start (pinFeatures).
	cpuPin       func() []string
	runscVersion string
	hostFeatures []string
	Manager      *sandbox.Manager
	// guest is the guest data plane over Manager: exec, sessions,
	// services, files and ports relayed to sandboxes' agents.
	guest *guest.Guest
	Token string
	URL   string
	// closers release what start set up, last first, once the components
	// have ended.
	closers []func() error
	srv     *http.Server
	ln      net.Listener
	inside  *server.Inside
	// pools are the warm pools, made with the Manager.
	pools *warmpool.Pools
	// checkpoints take, restore and fork from checkpoints, made with the
	// Manager.
	checkpoints *checkpoints.Service
	// sleep is the sleep capability (images, idle sleep), made with the
	// Manager.
	sleep *sleep.Sleeper
	// madeToken is the file of an admin token made by this start, if any.
	madeToken string
	// tokenFile is the file the admin token is kept in; empty when it
	// was given (Config.Token).
	tokenFile string
	// adminHash is the admin token's hash (auth.AdminHash): a node of a
	// cluster has it from the cluster, and may not know the token.
	adminHash []byte
	// secretsKey is the key secrets are sealed with: the data dir's, or
	// the cluster's.
	secretsKey []byte
	// member is the daemon's membership of its cluster (--node), nil on
	// one machine.
	member *cluster.Member
	// load reports what the node has with each renewal of its lease, nil
	// on one machine.
	load *loadReporter
	// nodeKey is the cluster's key for the calls nodes pass each other.
	nodeKey []byte
	// adopt is set when the data dir's sandboxes were the database's
	// before this start: a node takes those of no node as its own.
	adopt bool

	// group runs the components (see component); running is their ctx,
	// ended by stopComponents (Close) or by the first to fail.
	group          *errgroup.Group
	running        context.Context
	stopComponents context.CancelCauseFunc
}

// parts are what the steps of start make for the steps after them.
type parts struct {
	tls     *tls.Config // nil: plain http
	secret  []byte      // the daemon's own key (sandboxes' tokens)
	runsc   string
	store   Records
	secrets *secret.Sealed
	pool    disk.Pool
	rt      runtime.Runtime
	nets    sandbox.Networks
	// builtins are the built-in templates built here: nil on a front
	// end, which lists the nodes' (template.NodeBuiltins).
	builtins   *template.Builtins
	templates  *template.Store
	catalog    *template.Catalog
	images     *image.Service
	registries *image.Credentials
	// uploads keeps checkpoints in the object store; nil without one.
	uploads *checkpoints.Uploader
}

// Start sets the daemon up and starts serving; Wait tells when a component
// fails, Close ends it.
func Start(ctx context.Context, cfg Config, log *slog.Logger) (*Daemon, error) {
	d := &Daemon{cfg: cfg, log: log}
	if err := d.start(ctx); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// start sets the daemon up, step by step. The order matters: the data dir
// is locked before anything in it is touched, the port is taken before
// anything is recovered, the firewall is installed before a sandbox is
// taken back, and the components run before the API is served.
func (d *Daemon) start(ctx context.Context) error {
	var p parts
	steps := []struct {
		name string
		run  func(context.Context, *parts) error
	}{
		{"checking the host", d.checkHost},
		{"locking the data dir", d.claimDataDir},
		{"listening", d.listen},
		{"loading keys", d.loadKeys},
		{"finding binaries", d.findBinaries},
		{"pinning CPU features", d.pinFeatures},
		{"opening storage", d.openStorage},
		{"setting up sandboxing", d.setUpSandboxing},
		{"preparing templates", d.prepareTemplates},
		{"opening images", d.openImages},
		{"opening the object store", d.openObjects},
		{"taking sandboxes back", d.startManager},
		{"starting components", d.startComponents},
		{"serving", d.serve},
	}
	began := time.Now()
	d.log.Info("loam daemon starting", "pid", os.Getpid(), "data_dir", d.cfg.DataDir)
	for _, step := range steps {
		t := time.Now()
		if err := step.run(ctx, &p); err != nil {
			return err
		}
		// A start that takes long says where: a host too busy, a pool
		// slow to mount, many sandboxes to take back.
		if took := time.Since(t); took >= slowStep {
			d.log.Info("a start step was slow", "step", step.name, "ms", took.Milliseconds())
		}
	}
	d.announce(p, time.Since(began))
	return nil
}

// slowStep is how long a step of start may take before it is logged.
const slowStep = 2 * time.Second

// checkHost refuses to run without root (but as a front end, which makes
// no sandbox) or with a bad --org, and raises the open-file limit.
func (d *Daemon) checkHost(context.Context, *parts) error {
	if err := checkNode(&d.cfg); err != nil {
		return err
	}
	if os.Geteuid() != 0 && !d.frontEnd() {
		return errors.New("loam serve must run as root (it makes network namespaces, mounts and gVisor sandboxes); a cluster's front end (--role api) need not")
	}
	raiseFileLimit(d.log)
	if err := sandbox.CheckOrg(d.cfg.Org); err != nil {
		return fmt.Errorf("--org: %w", err)
	}
	return nil
}

// claimDataDir takes the data dir's lock first: nothing in it may be
// touched (the store opened, the pools' leftovers cleared, sandboxes taken
// back) while another daemon owns it.
func (d *Daemon) claimDataDir(context.Context, *parts) error {
	unlock, err := lockDataDir(d.cfg.DataDir, d.log)
	if err != nil {
		return err
	}
	d.closers = append(d.closers, unlock)
	// One name for the data dir, whichever way it was reached: runsc keeps
	// the paths it was given in its state, so a daemon reaching it through
	// a symlink one day and directly the next would lose its containers.
	d.cfg.DataDir, err = canonicalDir(d.cfg.DataDir)
	return err
}

// listen takes the API's port (and the debug one), before anything is
// recovered: a second daemon that cannot serve must fail before it changes
// anything.
func (d *Daemon) listen(ctx context.Context, p *parts) error {
	cfg := &d.cfg
	tlsConfig, err := tlsconfig.Load(cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return err
	}
	if tlsConfig != nil {
		tlsConfig.NextProtos = []string{"h2", "http/1.1"}
	}
	p.tls = tlsConfig
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
	d.URL = "http://" + ln.Addr().String()
	if tlsConfig != nil {
		d.URL = "https://" + ln.Addr().String()
	}
	return d.serveDebug(ctx)
}

// loadKeys loads the admin token and the daemon's secret.
func (d *Daemon) loadKeys(_ context.Context, p *parts) error {
	if err := d.loadToken(); err != nil {
		return err
	}
	var err error
	p.secret, err = loadSecret(d.cfg.DataDir, d.log)
	return err
}

// findBinaries finds the agent binary, kept in the data dir, and runsc;
// a front end needs neither.
func (d *Daemon) findBinaries(_ context.Context, p *parts) error {
	cfg := &d.cfg
	if d.frontEnd() {
		return nil
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
	var err error
	if cfg.AgentBinary, err = keepAgentBinary(cfg.DataDir, cfg.AgentBinary); err != nil {
		return err
	}
	p.runsc, err = findRunsc(cfg.Runsc)
	return err
}

// openStorage opens the store, the sealed secrets and the disk pool (none
// on a front end).
func (d *Daemon) openStorage(ctx context.Context, p *parts) error {
	st, err := d.openRecords(ctx)
	if err != nil {
		return err
	}
	p.store = st
	d.closers = append(d.closers, st.Close)
	if pg, ok := st.(*postgres.Store); ok {
		// The hold on the database lives as long as its session; kept
		// while the daemon runs, which stops if another daemon took it.
		d.runComponents(ctx, component{"database hold", pg.KeepHeld})
		if d.cfg.Node != "" {
			if err := d.joinCluster(ctx, p, pg, d.adopt); err != nil {
				return err
			}
		}
	}
	if d.adminHash == nil && d.Token != "" {
		d.adminHash = auth.AdminHash(d.Token)
	}
	if d.secretsKey == nil {
		if d.secretsKey, err = loadSecretsKey(d.cfg.DataDir, d.log); err != nil {
			return err
		}
	}
	// The daemon's own org owns what an older data dir had (and, until
	// there are others, everything made with the admin token).
	if err := st.EnsureOrg(ctx, d.cfg.Org); err != nil {
		return fmt.Errorf("opening store: %w", err)
	}
	if p.secrets, err = secret.NewSealed(st, d.secretsKey); err != nil {
		return err
	}
	if d.frontEnd() {
		// No loop device, no btrfs: it keeps no sandbox's disk.
		p.pool = frontEndPool{d.cfg.Node}
		return nil
	}
	pool, err := disk.Open(ctx, filepath.Join(d.cfg.DataDir, "disk"), d.cfg.DiskSize)
	if err != nil {
		return fmt.Errorf("opening disk pool: %w", err)
	}
	p.pool = pool
	d.closers = append(d.closers, pool.Close)
	d.log.Info("disk pool", "kind", pool.Kind())
	return nil
}

// setUpSandboxing sets up gVisor and the network: the sandboxes' subnet,
// their DNS, the firewall. A front end sets up none of them.
func (d *Daemon) setUpSandboxing(ctx context.Context, p *parts) error {
	cfg := &d.cfg
	if d.frontEnd() {
		p.rt, p.nets = frontEndRuntime{cfg.Node}, frontEndNetworks{cfg.Node}
		return nil
	}
	var err error
	p.rt, err = gvisor.New(gvisor.Config{Runsc: p.runsc, Root: filepath.Join(cfg.DataDir, "runsc"), DisableFastPath: cfg.NoFastPath, Logger: d.log})
	if err != nil {
		return fmt.Errorf("setting up gVisor: %w", err)
	}
	if cfg.NoFastPath {
		d.log.Info("gVisor's systrap fast path is off")
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
		DNSUpstreams: upstreams, Node: cfg.Node, Log: d.log,
	})
	if err != nil {
		return fmt.Errorf("setting up networking: %w", err)
	}
	p.nets = nets
	d.closers = append(d.closers, nets.Close)
	// Before any sandbox is taken back, and never removed: sandboxes keep
	// running while the daemon is down.
	if err := nets.Firewall().Install(ctx); err != nil {
		return fmt.Errorf("setting up networking: %w", err)
	}
	if err := network.EnableForwarding(); err != nil {
		return fmt.Errorf("setting up networking: %w", err)
	}
	return nil
}

// prepareTemplates checks the default template and sets up the templates
// of this host: the built-in ones and the checkpoint templates (on a front
// end, the nodes').
func (d *Daemon) prepareTemplates(_ context.Context, p *parts) error {
	cfg := &d.cfg
	if cfg.TemplateCache == "" {
		cfg.TemplateCache = filepath.Join(cfg.DataDir, "templates")
	}
	tplOpts := disk.TemplateOptions{DebianMirror: disk.ChooseDebianMirror(cfg.DebianMirror, "/etc/apt")}
	d.log.Debug("the base template is built from", "mirror", tplOpts.DebianMirror)
	if _, err := disk.FindTemplate(cfg.DefaultTemplate, tplOpts); err != nil {
		return fmt.Errorf("--default-template: %w", err)
	}
	var builtins template.Builder
	if d.frontEnd() {
		// It builds none: the nodes build them, and it lists theirs.
		builtins = template.NewNodeBuiltins(d.member, cfg.DefaultTemplate, tplOpts)
	} else {
		p.builtins = template.NewBuiltins(p.pool, cfg.TemplateCache, cfg.DefaultTemplate, tplOpts, d.log)
		builtins = p.builtins
	}
	p.templates = template.NewStore(cfg.DataDir, d.cfg.Org, builtins, p.pool, d.log)
	if d.load != nil {
		// From the next renewal on, the lease tells of them.
		d.load.templates.Store(p.templates)
	}
	return nil
}

// openImages makes the image service. Images are unpacked beside the
// built-in templates, and pulled with the credentials of `loam image
// login`, then the Docker config's.
func (d *Daemon) openImages(ctx context.Context, p *parts) error {
	regSecrets, err := secret.NewSealed(p.store.RegistryCredentials(), d.secretsKey)
	if err != nil {
		return err
	}
	p.registries = image.NewCredentials(regSecrets, d.cfg.Org)
	p.images = image.New(image.Config{
		Records: p.store, Sandboxes: p.store, Pool: p.pool, CacheDir: filepath.Join(d.cfg.TemplateCache, "images"),
		Org: d.cfg.Org, Keychain: p.registries.For, Log: d.log,
	})
	if d.frontEnd() {
		return nil // it has no pool to sweep
	}
	if err := p.images.Sweep(ctx); err != nil {
		d.log.Error("removing the templates of images that are gone", "err", err)
	}
	return nil
}

// sandboxAPI is what the API, the in-sandbox API and the URL front door
// serve: the core's calls (life cycle, sleep, …) answered by the Manager,
// the checkpoints' by their capability, and the calls into a running
// sandbox by the guest data plane directly, never through the core.
type sandboxAPI struct {
	*sandbox.Manager
	*guest.Guest
	*checkpoints.Service
}

// startManager makes the sandbox manager, takes back the sandboxes a
// previous daemon left, and reads the warm pools' sizes.
func (d *Daemon) startManager(ctx context.Context, p *parts) error {
	cfg := &d.cfg
	// With a certificate, URLs are https. Without one, a domain with a
	// port, or localhost, is this listener's own, plain http; any other is
	// taken to be behind a proxy that serves TLS.
	scheme := "https"
	if _, _, err := net.SplitHostPort(cfg.Domain); p.tls == nil && (err == nil || strings.HasPrefix(cfg.Domain, "localhost")) {
		scheme = "http"
	}
	d.Manager = sandbox.New(sandbox.Config{
		DataDir:         cfg.DataDir,
		AgentBinary:     cfg.AgentBinary,
		Domain:          cfg.Domain,
		Org:             cfg.Org,
		Node:            cfg.Node,
		FrontEnd:        cfg.Role == cluster.RoleAPI,
		Leases:          d.leases(),
		Scheme:          scheme,
		DefaultTemplate: cfg.DefaultTemplate,
		Defaults:        api.Resources{CPUs: 1, MemoryMiB: 512, DiskMiB: 4096},
		MaxSandboxes:    cfg.MaxSandboxes,
		MaxHeavy:        cfg.MaxHeavy,
		Secret:          p.secret,
		Secrets:         p.secrets,
		Images:          p.images,
		Orgs:            p.store,
		InsidePort:      network.DefaultInsidePort,
		IdleMin:         cfg.IdleMin,
		// Made before Inside, which serves them too.
		Forks: func(m *sandbox.Manager) sandbox.Forks {
			ccfg := checkpoints.Config{
				DataDir: cfg.DataDir,
				Node:    cfg.Node,
				Limits:  checkpoint.Limits{Owner: cfg.CheckpointLimit, Inside: cfg.InsideCheckpointLimit},
			}
			if p.uploads != nil {
				ccfg.Uploads, ccfg.Fetch = p.uploads, p.uploads
			}
			d.checkpoints = checkpoints.New(sandbox.NewCheckpointCore(m), ccfg, p.store, p.rt, p.pool, d.log)
			return d.checkpoints
		},
		Inside: func(m *sandbox.Manager) sandbox.Insiders {
			d.guest = guest.New(sandbox.NewGuestCore(m), d.log)
			d.inside = server.NewInside(sandboxAPI{m, d.guest, d.checkpoints}, p.secret, d.log)
			return d.inside
		},
		Pools:       d.poolsOf(p),
		Sleep:       d.sleepOf(p),
		Stored:      d.stored(p),
		Takeover:    d.takeover(p),
		SleepStore:  d.sleepStore(p),
		CPUFeatures: d.cpuPin,
	}, p.store, p.rt, p.pool, p.nets, p.templates, d.log)
	// The catalog the API serves, over the Manager's template side:
	// templates of checkpoints are made of its sandboxes' checkpoints.
	p.catalog = template.New(template.Config{
		Store: p.templates, Core: sandbox.NewTemplateCore(d.Manager), Pools: d.templatePools(), Sandboxes: p.store,
		Images: p.images, Cluster: d.templateCluster(), Log: d.log,
	})
	// Its spare dials and death watches end before the store closes.
	d.closers = append(d.closers, d.Manager.Close)
	if d.frontEnd() {
		// Nothing to take back, and no warm pool to keep.
		return nil
	}
	if err := d.Manager.Recover(ctx); err != nil {
		d.log.Error("recovery left some things behind", "err", err)
	}
	// After Recover deleted the members the last daemon left; before the
	// API, whose changes to the pools are kept, not read over.
	return d.pools.Load()
}

// startComponents runs the daemon's background work (see component): a
// front end has none of a sandbox host's.
func (d *Daemon) startComponents(ctx context.Context, p *parts) error {
	if d.frontEnd() {
		return nil
	}
	// Sandboxes write their init logs on the host: cap and rotate them.
	logs := &gvisor.LogKeeper{
		Bundles: filepath.Join(d.cfg.DataDir, "sandboxes", "*", "bundle"),
		Logger:  d.log,
	}
	d.runComponents(ctx,
		component{"image pulls", p.images.Run},
		// Filled in the background, after recovery (startManager).
		component{"warm pools", d.pools.Run},
		component{"sandbox logs", logs.Run},
		// Sandboxes whose idle time has passed go to sleep.
		component{"idle sleep", d.sleep.Run},
		// The default template is prepared in the background, so that
		// the first sandbox does not wait for a build; a failure is
		// logged, and the first create tries again.
		component{"default template", p.builtins.Run},
	)
	if d.member != nil {
		d.runComponents(ctx, component{"stale copies", d.dropStale})
	}
	if r := d.recovery(p); r != nil {
		d.runComponents(ctx, component{"lost nodes' sandboxes", r.Run})
	}
	d.runComponents(ctx, d.runObjects(p)...)
	return nil
}

// serve serves the API, the web console and sandboxes' URLs on the
// listener, as a component: Close shuts it down first.
func (d *Daemon) serve(ctx context.Context, p *parts) error {
	cfg := &d.cfg
	if err := atomicfile.WriteFile(filepath.Join(cfg.DataDir, "api_url"), []byte(d.URL+"\n"), 0o644); err != nil {
		return err
	}
	// API keys and the audit log live in the store; the admin token is
	// the operator's, and an admin of the daemon's org.
	keys := auth.NewKeysForHash(cfg.Org, d.adminHash, p.store, d.log)
	d.runComponents(ctx,
		component{"API keys", keys.Run},
		component{"audit retention", (&audit.Retention{Store: p.store, Keep: cfg.AuditRetention, Log: d.log}).Run},
	)
	// In a cluster, a call for a sandbox of another node goes there.
	var router *cluster.Router
	routed := func(*server.Server) {}
	frontCfg := proxy.Config{
		Domain: cfg.Domain, Org: cfg.Org, Keys: keys, TLS: p.tls != nil,
		BodyTimeout: cfg.WriteTimeout,
	}
	if d.member != nil {
		router = cluster.NewRouter(d.member, p.store, d.nodeKey, d.log)
		if p.uploads != nil {
			// A fork of a stored checkpoint may go to any node.
			router.SetStored(p.uploads)
		}
		routed = server.WithRouter(router)
		frontCfg.Forward, frontCfg.Reforward = router.ForwardURL, router.ReforwardURL
	}
	moves := d.withMoves(p, router)
	// Sandboxes' URLs (by Host) go to the front door, the rest to the API.
	front := proxy.New(sandboxAPI{d.Manager, d.guest, d.checkpoints}, frontCfg, d.log)
	// The web console shares the API's listener (not sandboxes' URLs,
	// which the front door takes first): its page at /, its sessions
	// authorizing API calls from that page.
	con, err := console.New(ctx, console.Config{Keys: keys, Audit: p.store, TLS: p.tls != nil, Sessions: p.store, TokenFile: d.tokenFile, Idle: cfg.Idle, Shared: cfg.Node != ""}, d.log)
	if err != nil {
		return fmt.Errorf("loading the web console: %w", err)
	}
	var apiServer http.Handler = server.New(sandboxAPI{d.Manager, d.guest, d.checkpoints}, "", d.log, server.WithWriteTimeout(cfg.WriteTimeout), server.WithBrowserSessions(con),
		server.WithKeys(keys), server.WithAudit(p.store),
		d.withCatalog(p), server.WithSecrets(secret.NewKeeper(p.secrets, p.store, d.log)), d.withPools(),
		server.WithOrgs(sandbox.NewOrgs(d.Manager)), d.withNodes(p), routed, moves)
	if d.member != nil {
		// A node without its lease changes nothing (see cluster.Gate).
		apiServer = d.member.Gate(apiServer)
	}
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
		TLSConfig:      p.tls,
	}
	srv, ln := d.srv, limits.Listener(d.ln)
	d.runComponents(ctx, component{"API server", func(context.Context) error {
		// Not stopped by its ctx: Close shuts it down before it ends the
		// other components, so that no request finds them gone.
		var err error
		if p.tls != nil {
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}})
	return nil
}

// announce logs that the daemon serves, and shows a token it made.
func (d *Daemon) announce(p parts, took time.Duration) {
	d.log.Info("loam daemon serving", "url", d.URL, "data_dir", d.cfg.DataDir, "role", d.cfg.Role, "runsc", p.runsc, "start_ms", took.Milliseconds())
	if d.madeToken != "" {
		out := d.cfg.Out
		if out == nil {
			out = os.Stderr
		}
		fmt.Fprintf(out, "\nloam: made an admin token in %s. To use the API and the CLI:\n\n"+
			"  export LOAM_API_URL=%s LOAM_TOKEN=%s\n\n", d.madeToken, d.URL, d.Token)
	}
}

// Close stops serving, ends the components and waits for them, and
// releases the store, the pool and the rest. Sandboxes keep running: the
// next daemon takes them back.
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
	d.closeComponents()
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
	if cfg.Node != "" {
		// A node takes the cluster's, which only its first node makes
		// (see clusterSecrets).
		return nil
	}
	return d.makeToken()
}

// makeToken makes an admin token, kept in the token file.
func (d *Daemon) makeToken() error {
	d.Token = newToken()
	if err := atomicfile.WriteFile(d.tokenFile, []byte(d.Token+"\n"), 0o600); err != nil {
		return fmt.Errorf("storing the new admin token: %w", err)
	}
	d.madeToken = d.tokenFile
	return nil
}

// withNodes serves the nodes' routes on a node of a cluster.
func (d *Daemon) withNodes(p *parts) server.Option {
	pg, ok := p.store.(*postgres.Store)
	if d.member == nil || !ok {
		return func(*server.Server) {}
	}
	return server.WithNodes(cluster.NewNodes(pg.Nodes()))
}

// withMoves serves moves and drains: on a node of a cluster with an
// object store, which moves sandboxes through it; on a front end, which
// passes them to the nodes (an operator's drain may come through the
// cluster's API service, as in Kubernetes).
func (d *Daemon) withMoves(p *parts, router *cluster.Router) server.Option {
	pg, ok := p.store.(*postgres.Store)
	front := d.frontEnd()
	if router == nil || !ok || !front && (p.uploads == nil || d.checkpoints == nil) {
		return func(*server.Server) {}
	}
	nodes := cluster.NewNodes(pg.Nodes())
	cordon := func(ctx context.Context, node string, on bool) error {
		_, err := nodes.Cordon(ctx, node, on)
		return err
	}
	var rel cluster.Releaser
	if !front {
		rel = d.checkpoints
	}
	return server.WithMoves(cluster.NewMoves(router, rel, p.store, cordon, d.log))
}

// templateCluster is the catalog's view of the cluster: none on one
// machine (a nil *cluster.Member in an interface would not be nil).
func (d *Daemon) templateCluster() template.Cluster {
	if d.member == nil {
		return nil
	}
	return d.member
}

// leases is the Manager's view of the cluster's leases: none on one
// machine (a nil *cluster.Member in an interface would not be nil).
func (d *Daemon) leases() sandbox.Leases {
	if d.member == nil {
		return nil
	}
	return d.member
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
