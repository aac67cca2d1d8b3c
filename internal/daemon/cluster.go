package daemon

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/cluster"
	"loam.dev/loam/internal/host"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/secret"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/postgres"
	"loam.dev/loam/internal/template"
)

// The cluster's secrets (postgres.Store.ClusterSecret), made by the first
// node from its own and the same for every node: an admin token works on
// every node, a sandbox's tokens on whichever node serves it, and a secret
// sealed by one node opens on another.
const (
	clusterAdminHash  = "admin-token-sha256"
	clusterSecret     = "daemon-secret"
	clusterSecretsKey = "secrets-key"
	// clusterNodeKey signs the calls one node passes to another.
	clusterNodeKey = "node-key"
)

// checkNode checks the flags of a node (--node, --advertise): both, with
// --database, or none.
func checkNode(cfg *Config) error {
	if cfg.Role == "" {
		cfg.Role = cluster.RoleNode
	}
	if cfg.Role != cluster.RoleNode && cfg.Role != cluster.RoleAPI {
		return fmt.Errorf("--role %q: want node (runs sandboxes) or api (a front end)", cfg.Role)
	}
	if cfg.Node == "" {
		if cfg.Role == cluster.RoleAPI {
			return errors.New("--role api is for a node of a cluster: give --node, --advertise and --database")
		}
		if cfg.Advertise != "" {
			return errors.New("--advertise is for a node of a cluster: give --node too")
		}
		return nil
	}
	if cfg.Database == "" {
		return errors.New("--node: a cluster's nodes share a PostgreSQL database; give it with --database")
	}
	if err := sandbox.CheckOrg(cfg.Node); err != nil {
		return fmt.Errorf("--node: %w", err)
	}
	if cfg.Advertise == "" {
		return errors.New("--node needs --advertise, the URL the other nodes reach this one's API at (such as http://10.0.0.2:7070)")
	}
	u, err := url.Parse(cfg.Advertise)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" && u.Path != "/" {
		return fmt.Errorf("--advertise %q: want the URL of this node's API, such as http://10.0.0.2:7070", cfg.Advertise)
	}
	cfg.Advertise = strings.TrimSuffix(cfg.Advertise, "/")
	return nil
}

// joinCluster joins the cluster as --node, fences the store at the epoch
// it got, renews the lease as a component, and takes the cluster's
// secrets.
func (d *Daemon) joinCluster(ctx context.Context, p *parts, pg *postgres.Store, adopt bool) error {
	load := newLoadReporter(d, p, pg)
	d.load = load
	m, err := cluster.Join(ctx, pg.Nodes(), cluster.Config{
		Name: d.cfg.Node, Address: d.cfg.Advertise, Lease: d.cfg.Lease,
		Load: load.report, Fenced: postgres.ErrFenced,
	}, d.log)
	if err != nil {
		return err
	}
	d.member = m
	d.runComponents(ctx, component{"node lease", m.Run})
	if adopt {
		// The sandboxes of this data dir, kept in this database before
		// the daemon was a node: they are this node's.
		n, err := pg.Nodes().AdoptSandboxes(ctx, d.cfg.Node)
		if err != nil {
			return err
		}
		if n > 0 {
			d.log.Info("took the sandboxes the database kept for no node", "node", d.cfg.Node, "sandboxes", n)
		}
	}
	return d.clusterSecrets(ctx, p, pg)
}

// clusterSecrets takes the cluster's admin token hash, daemon secret and
// secrets key, making them of this node's own when it is the first.
func (d *Daemon) clusterSecrets(ctx context.Context, p *parts, pg *postgres.Store) error {
	made := false
	hash, err := pg.Nodes().ClusterSecret(ctx, clusterAdminHash, func() ([]byte, error) {
		made = true
		if d.Token == "" {
			if err := d.makeToken(); err != nil {
				return nil, err
			}
		}
		return auth.AdminHash(d.Token), nil
	})
	if err != nil {
		return err
	}
	if d.Token != "" && subtle.ConstantTimeCompare(auth.AdminHash(d.Token), hash) != 1 {
		if d.cfg.Token != "" {
			return errors.New("LOAM_TOKEN is not the admin token of this cluster (its first node made it): give that one, or none")
		}
		d.log.Warn("the admin token in the token file is not this cluster's: use the one its first node made", "file", d.tokenFile)
		d.Token = ""
	}
	if !made && d.Token == "" {
		d.log.Info("this node takes the cluster's admin token (made by its first node)")
	}
	d.adminHash = hash
	if p.secret, err = pg.Nodes().ClusterSecret(ctx, clusterSecret, func() ([]byte, error) { return p.secret, nil }); err != nil {
		return err
	}
	key, err := pg.Nodes().ClusterSecret(ctx, clusterSecretsKey, func() ([]byte, error) { return loadSecretsKey(d.cfg.DataDir, d.log) })
	if err != nil {
		return err
	}
	if len(key) != secret.KeySize {
		return fmt.Errorf("the cluster's secrets key is %d bytes, not %d", len(key), secret.KeySize)
	}
	d.secretsKey = key
	d.nodeKey, err = pg.Nodes().ClusterSecret(ctx, clusterNodeKey, func() ([]byte, error) {
		k := make([]byte, 32)
		_, _ = rand.Read(k) // never fails on Linux
		return k, nil
	})
	return err
}

// loadReporter makes what a node reports of itself with each renewal of
// its lease. What does not change while it runs (its runsc build, its CPU)
// is read once. A front end reports no runsc (it runs none), disk or
// templates, only its machine's CPUs and memory.
type loadReporter struct {
	d  *Daemon
	pg *postgres.Store

	once     sync.Once
	runsc    string
	features []string
	p        *parts
	// templates are the checkpoint templates of this node, set once
	// they are opened (after the node joined: see prepareTemplates).
	templates atomic.Pointer[template.Store]
}

func newLoadReporter(d *Daemon, p *parts, pg *postgres.Store) *loadReporter {
	return &loadReporter{d: d, p: p, pg: pg}
}

func (l *loadReporter) report(ctx context.Context) api.NodeLoad {
	l.once.Do(func() {
		l.runsc = l.d.runscVersion
		if !l.d.frontEnd() {
			// gVisor's names: what --cpu-features and the sandboxes'
			// annotation take, and what the common set is made of.
			l.features = l.d.hostFeatures
		}
	})
	load := api.NodeLoad{Role: l.d.cfg.Role, Runsc: l.runsc, CPUFeatures: l.features, CPUs: goruntime.NumCPU()}
	if total, avail, err := host.Memory(); err == nil {
		load.MemoryMiB, load.MemoryFreeMiB = total>>20, avail>>20
	}
	var fs unix.Statfs_t
	if unix.Statfs(filepath.Join(l.d.cfg.DataDir, "disk"), &fs) == nil {
		load.DiskMiB = int64(fs.Blocks) * fs.Bsize >> 20
		load.DiskFreeMiB = int64(fs.Bavail) * fs.Bsize >> 20
	}
	if sbs, err := l.pg.ListSandboxes(ctx, store.Filter{Node: l.d.cfg.Node}); err == nil {
		for _, sb := range sbs {
			if sb.Pool != "" {
				continue
			}
			load.Sandboxes++
			if sb.State == api.StateRunning {
				load.Running++
			}
		}
	}
	// A front end caches nothing: a template cache it shares with a node
	// on its host is that node's to report.
	if dir := l.d.cfg.TemplateCache; dir != "" && !l.d.frontEnd() {
		load.Templates = dirNames(dir, "images")
		load.Images = dirNames(filepath.Join(dir, "images"), "")
	}
	if t := l.templates.Load(); t != nil {
		load.CheckpointTemplates = t.Held()
	}
	return load
}

// runscBuild is runsc's version line ("runsc version release-…").
func runscBuild(ctx context.Context, runsc string) string {
	if runsc == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, runsc, "--version").Output()
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(strings.TrimPrefix(line, "runsc version "))
}

// dirNames are the names of dir's subdirectories but skip, sorted.
func dirNames(dir, skip string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range ents {
		if e.IsDir() && e.Name() != skip && !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	return names
}

// newToken is a new admin token.
func newToken() string {
	return "loam_" + rand.Text() + rand.Text()
}
