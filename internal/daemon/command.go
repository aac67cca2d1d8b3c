package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/audit"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/server"
)

// env returns the environment variable's value, or def.
func env(key, def string) string {
	if v, ok := os.LookupEnv(key); ok && v != "" {
		return v
	}
	return def
}

func envInt(key string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(key)); err == nil {
		return v
	}
	return def
}

// envOff tells whether the environment variable turns something off
// (0, false, off, no).
func envOff(key string) bool {
	switch strings.ToLower(os.Getenv(key)) {
	case "0", "false", "off", "no":
		return true
	}
	return false
}

func envDuration(key string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(key)); err == nil {
		return v
	}
	return def
}

// Command is `loam serve`: it runs the daemon until SIGINT or SIGTERM.
// Sandboxes keep running when it stops; the next start takes them back.
func Command() *cobra.Command {
	var cfg Config
	var (
		debug    bool
		diskGiB  int
		teardown bool
		yes      bool
		fastPath bool
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the loam daemon (API server and sandbox host)",
		Long: "Run the loam daemon: the REST and WebSocket API and the host of the sandboxes.\n" +
			"Sandboxes keep running when it stops, and the next start takes them back; with the\n" +
			"daemon stopped, --teardown takes a data dir down completely (every sandbox, mount,\n" +
			"loop device, namespace and the firewall table) and removes it.\n" +
			"Every flag can also be set by the environment variable shown in its help.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			level := slog.LevelInfo
			if debug {
				level = slog.LevelDebug
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			slog.SetDefault(log)
			cfg.Out = os.Stderr
			cfg.DiskSize = int64(diskGiB) << 30
			cfg.NoFastPath = !fastPath
			if teardown {
				return Teardown(cmd.Context(), cfg, log, func(inv Inventory) error {
					return confirmTeardown(cmd, yes, inv)
				})
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			d, err := Start(ctx, cfg, log)
			if err != nil {
				return err
			}
			// Until a signal, or a component's failure: an exit with an
			// error for the supervisor to see (see component).
			failed := d.Wait(ctx)
			log.Info("stopping; sandboxes keep running")
			return errors.Join(failed, d.Close())
		},
	}
	f := cmd.Flags()
	f.BoolVar(&teardown, "teardown", false, "instead of serving, take the data dir down completely: delete every sandbox, destroy the disk pool (unmount, detach its loop device), drop the firewall table, remove the data dir; refused while a daemon runs on it; asks first on a terminal")
	f.BoolVarP(&yes, "yes", "y", false, "with --teardown, do not ask for confirmation")
	f.StringVar(&cfg.Listen, "listen", env("LOAM_LISTEN", "127.0.0.1:7070"), "address of the API (LOAM_LISTEN)")
	f.StringVar(&cfg.DataDir, "data-dir", env("LOAM_DATA_DIR", "/var/lib/loam"), "where loam keeps its data (LOAM_DATA_DIR)")
	f.StringVar(&cfg.Database, "database", env("LOAM_DATABASE", ""), "keep the records in this PostgreSQL database (postgres://USER@HOST/DB; PostgreSQL 15 or newer) instead of SQLite in the data dir; a daemon without --node holds it alone (LOAM_DATABASE)")
	f.StringVar(&cfg.Objects, "objects", env("LOAM_OBJECTS", ""), "keep every checkpoint in this object store too, uploaded in the background once taken: s3://BUCKET?region=R (an S3-compatible server: &endpoint=URL&use_path_style=true; &prefix=P) with the usual AWS credentials, or file:///DIR (LOAM_OBJECTS)")
	// As envDuration's: an environment value that does not parse leaves
	// the default.
	cfg.CacheSize = defaultCacheSize
	if v := os.Getenv("LOAM_CACHE_SIZE"); v != "" {
		_ = byteSize{&cfg.CacheSize}.Set(v)
	}
	f.Var(byteSize{&cfg.CacheSize}, "cache-size", "with --objects, the most the node keeps of what it fetched from the object store, least recently used out first (LOAM_CACHE_SIZE)")
	f.StringVar(&cfg.CPUFeatures, "cpu-features", env("LOAM_CPU_FEATURES", ""), "the CPU features sandboxes may see, at most, comma-separated, as runsc cpu-features prints this host's; default: all of the host's, or in a cluster those every node has, so that a memory checkpoint restores on any node (LOAM_CPU_FEATURES)")
	f.StringVar(&cfg.Node, "node", env("LOAM_NODE", ""), "join the cluster of --database as node NAME: nodes share the database, each running its own sandboxes (needs --advertise) (LOAM_NODE)")
	f.StringVar(&cfg.Advertise, "advertise", env("LOAM_ADVERTISE", ""), "with --node, the URL the other nodes reach this one's API at, such as http://10.0.0.2:7070 (LOAM_ADVERTISE)")
	f.StringVar(&cfg.Role, "role", env("LOAM_ROLE", "node"), "with --node: node (runs sandboxes) or api (a front end that runs none, needs neither root nor runsc, and passes every call to the nodes) (LOAM_ROLE)")
	f.DurationVar(&cfg.Lease, "test-lease", envDuration("LOAM_TEST_LEASE", 0), "tests only: a node's lease (LOAM_TEST_LEASE)")
	_ = f.MarkHidden("test-lease")
	f.StringVar(&cfg.Domain, "domain", env("LOAM_DOMAIN", "localhost:7070"), "domain of sandbox URLs, http://NAME--ORG.DOMAIN (LOAM_DOMAIN)")
	f.StringVar(&cfg.TLSCert, "tls-cert", env("LOAM_TLS_CERT", ""), "certificate (PEM) to serve the API and sandbox URLs over TLS, with --tls-key; URLs are then https:// (LOAM_TLS_CERT)")
	f.StringVar(&cfg.TLSKey, "tls-key", env("LOAM_TLS_KEY", ""), "private key (PEM) of --tls-cert (LOAM_TLS_KEY)")
	f.StringVar(&cfg.Org, "org", env("LOAM_ORG", "default"), "organisation, in sandbox URLs (LOAM_ORG)")
	f.StringVar(&cfg.TokenFile, "token-file", env("LOAM_TOKEN_FILE", ""), "file holding the admin token; default DATA_DIR/token, made on first start (LOAM_TOKEN_FILE)")
	f.StringVar(&cfg.Runsc, "runsc", env("LOAM_RUNSC", ""), "the runsc binary; default runsc in PATH (LOAM_RUNSC)")
	f.StringVar(&cfg.AgentBinary, "agent-binary", env("LOAM_AGENT_BINARY", ""), "static loam binary to run in sandboxes; default this one (LOAM_AGENT_BINARY)")
	f.StringVar(&cfg.Subnet, "subnet", env("LOAM_SUBNET", "10.88.0.0/16"), "private range for sandbox addresses, a /30 each (LOAM_SUBNET)")
	f.StringVar(&cfg.DNSUpstream, "dns-upstream", env("LOAM_DNS_UPSTREAM", ""), "comma-separated DNS servers (host or host:port) the sandboxes' resolver forwards to; default the host's /etc/resolv.conf (LOAM_DNS_UPSTREAM)")
	f.StringVar(&cfg.TemplateCache, "template-cache", env("LOAM_TEMPLATE_CACHE", ""), "where built templates are cached; default DATA_DIR/templates (LOAM_TEMPLATE_CACHE)")
	f.StringVar(&cfg.DebianMirror, "debian-mirror", env("LOAM_DEBIAN_MIRROR", ""), "Debian archive the base template is built from; default the host's apt mirror (/etc/apt), else "+disk.DefaultDebianMirror+" (LOAM_DEBIAN_MIRROR)")
	f.StringVar(&cfg.DefaultTemplate, "default-template", env("LOAM_DEFAULT_TEMPLATE", "base"), "template of a sandbox created without one (LOAM_DEFAULT_TEMPLATE)")
	f.IntVar(&cfg.PoolReserveMiB, "pool-reserve-mib", envInt("LOAM_POOL_RESERVE_MIB", 1024), "host memory warm pools leave to sandboxes: a pool fills only while more is available (LOAM_POOL_RESERVE_MIB)")
	f.BoolVar(&fastPath, "systrap-fast-path", !envOff("LOAM_SYSTRAP_FAST_PATH"), "let gVisor spin for a sandbox's next syscall while that pays (its default); off (=false) spends less CPU on a host with more busy sandboxes than cores, at a little latency on an idle one (LOAM_SYSTRAP_FAST_PATH=off)")
	f.IntVar(&cfg.MaxSandboxes, "max-sandboxes", envInt("LOAM_MAX_SANDBOXES", defaultMaxSandboxes()), "sandboxes the daemon keeps, sleeping and stopped ones included; a create beyond answers limit; 0 is no cap; default one per 8 MiB of the host's memory, at least 256 (LOAM_MAX_SANDBOXES)")
	f.IntVar(&cfg.MaxHeavy, "max-heavy", envInt("LOAM_MAX_HEAVY", defaultMaxHeavy()), "heavy operations (create, fork, checkpoint, restore, wake, template build) run at once; more wait up to 30 s for a slot, then answer limit; 0 is no cap; default 4 per CPU, at least 8 (LOAM_MAX_HEAVY)")
	f.IntVar(&cfg.CheckpointLimit, "checkpoint-limit", envInt("LOAM_CHECKPOINT_LIMIT", 10), "checkpoints the owner may take per sandbox; 0 is no limit (LOAM_CHECKPOINT_LIMIT)")
	f.IntVar(&cfg.InsideCheckpointLimit, "inside-checkpoint-limit", envInt("LOAM_INSIDE_CHECKPOINT_LIMIT", 10), "checkpoints a sandbox may take of itself from inside, a share apart from the owner's; 0 is no limit (LOAM_INSIDE_CHECKPOINT_LIMIT)")
	f.IntVar(&diskGiB, "disk-size-gib", envInt("LOAM_DISK_SIZE_GIB", 64), "size of the sparse file the btrfs pool lives on when the data dir is not btrfs, in GiB (LOAM_DISK_SIZE_GIB)")
	f.DurationVar(&cfg.WriteTimeout, "write-timeout", envDuration("LOAM_WRITE_TIMEOUT", server.DefaultWriteTimeout), "a client that takes nothing of a stream (exec, attach, logs, watch, port, download) or sends nothing of an upload for this long is cut off (LOAM_WRITE_TIMEOUT)")
	f.IntVar(&cfg.MaxConns, "max-conns", envInt("LOAM_MAX_CONNS", DefaultMaxConns), "connections the API listener keeps open, at most a quarter of the open-file limit; over it, the connection idle longest is closed, or the new one when none is idle (LOAM_MAX_CONNS)")
	f.IntVar(&cfg.MaxConnsPerClient, "max-conns-per-client", envInt("LOAM_MAX_CONNS_PER_CLIENT", 0), "connections one client address (an IPv6 /64) may keep open; 0 is a quarter of --max-conns (LOAM_MAX_CONNS_PER_CLIENT)")
	f.DurationVar(&cfg.ConnIdleTimeout, "conn-idle-timeout", envDuration("LOAM_CONN_IDLE_TIMEOUT", DefaultConnIdleTimeout), "an API connection waiting this long for its next request is closed (at most 10 s for its first); streams are not cut (LOAM_CONN_IDLE_TIMEOUT)")
	f.Var(newLifetimeValue(&cfg.AuditRetention, env("LOAM_AUDIT_RETENTION", "90d")), "audit-retention", "how long the audit log keeps a record, such as 90d or 720h; 0 keeps them all (LOAM_AUDIT_RETENTION)")
	f.DurationVar(&cfg.Idle, "idle", envDuration("LOAM_IDLE", 0), "a sandbox created without an idle of its own sleeps after this long without activity, such as 10m; 0 is never (LOAM_IDLE)")
	// For tests only: idle times shorter than a minute.
	f.DurationVar(&cfg.IdleEvery, "test-idle-every", envDuration("LOAM_TEST_IDLE_EVERY", 0), "tests only: how often idle sandboxes are looked for (LOAM_TEST_IDLE_EVERY)")
	f.DurationVar(&cfg.IdleMin, "test-idle-min", envDuration("LOAM_TEST_IDLE_MIN", 0), "tests only: the shortest idle a sandbox may have (LOAM_TEST_IDLE_MIN)")
	_ = f.MarkHidden("test-idle-every")
	_ = f.MarkHidden("test-idle-min")
	f.StringVar(&cfg.DebugListen, "debug-listen", env("LOAM_DEBUG_LISTEN", ""), "loopback address serving Go's profiles (net/http/pprof, no token): goroutines, heap, CPU; off by default (LOAM_DEBUG_LISTEN)")
	f.BoolVar(&debug, "debug", os.Getenv("LOAM_DEBUG") != "", "debug logs (LOAM_DEBUG)")
	cfg.Token = os.Getenv("LOAM_TOKEN")
	return cmd
}

// defaultMaxSandboxes is --max-sandboxes's default: one sandbox per 8 MiB
// of the host's memory (an idle running sandbox holds about 17 MiB, a
// sleeping one none, so the memory runs out before the cap when most run),
// at least 256.
func defaultMaxSandboxes() int {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 256
	}
	return max(256, int(uint64(si.Totalram)*uint64(si.Unit)>>23))
}

// defaultMaxHeavy is --max-heavy's default: four heavy operations per CPU
// (most of one is waiting for disk or for runsc to start), at least 8.
func defaultMaxHeavy() int {
	return max(8, 4*goruntime.NumCPU())
}

// lifetimeValue is a flag of days ("90d") or a Go duration ("720h"); "0"
// is none.
type lifetimeValue struct {
	d   *time.Duration
	def string
}

func newLifetimeValue(d *time.Duration, def string) *lifetimeValue {
	v := &lifetimeValue{d: d, def: def}
	if err := v.Set(def); err != nil {
		// A bad LOAM_AUDIT_RETENTION: Validate reports it when flags are
		// parsed; fall back to the default meanwhile.
		*d = audit.DefaultRetention
	}
	return v
}

func (v *lifetimeValue) String() string {
	if v == nil || v.d == nil {
		return ""
	}
	if *v.d%(24*time.Hour) == 0 && *v.d > 0 {
		return fmt.Sprintf("%dd", *v.d/(24*time.Hour))
	}
	return v.d.String()
}

func (v *lifetimeValue) Set(s string) error {
	if s == "0" {
		*v.d = 0
		return nil
	}
	d, err := api.ParseLifetime(s)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}

func (v *lifetimeValue) Type() string { return "duration" }

// defaultCacheSize is --cache-size's default.
const defaultCacheSize = 10 << 30

// byteSize is a flag of a size in bytes, written as 10GiB, 500MB or a
// number of bytes.
type byteSize struct{ p *int64 }

func (b byteSize) String() string {
	if b.p == nil {
		return ""
	}
	return humanize.IBytes(uint64(*b.p))
}

func (b byteSize) Set(s string) error {
	n, err := humanize.ParseBytes(s)
	if err != nil {
		return fmt.Errorf("%q is not a size such as 10GiB", s)
	}
	*b.p = int64(n)
	return nil
}

func (b byteSize) Type() string { return "size" }
