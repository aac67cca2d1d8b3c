// Package cluster makes a daemon a node of a cluster of loam daemons that
// share one PostgreSQL database (loam serve --node): it joins under its
// name, renews its lease while it runs, stops accepting changes once it
// cannot, and knows which other nodes answer. The records are the
// database's; a node's own sandboxes are the ones whose record names it.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// Records is what a node keeps in the database (store/postgres has them).
type Records interface {
	// JoinNode joins n under its name with a lease; it returns the epoch.
	JoinNode(ctx context.Context, n store.Node, lease time.Duration) (int64, error)
	// RenewNode renews the lease at epoch; an error wrapping ErrFenced
	// when the node no longer holds the epoch (a later start, a removal).
	RenewNode(ctx context.Context, name string, epoch int64, lease time.Duration, load api.NodeLoad) error
	// ListNodes lists the nodes and the database's time now.
	ListNodes(ctx context.Context) ([]*store.Node, time.Time, error)
	// SetFence makes every later change of the store's to a sandbox or
	// checkpoint record conditional on node holding its lease at epoch.
	SetFence(node string, epoch int64)
}

// DefaultLease is how long a lease runs from its last renewal: a node that
// cannot renew for that long stops accepting changes, and the others
// show its sandboxes as unknown. It is renewed every third of it.
const DefaultLease = 6 * time.Second

// Roles a node joins with (api.NodeLoad.Role).
const (
	// RoleNode runs sandboxes.
	RoleNode = "node"
	// RoleAPI is a front end: it answers calls and runs no sandboxes.
	RoleAPI = "api"
)

// Config is a node's configuration.
type Config struct {
	// Name is the node's name (--node), Address where the other nodes
	// reach its API (--advertise).
	Name, Address string
	// Lease is how long a lease runs; DefaultLease for 0.
	Lease time.Duration
	// Load is what the node reports of itself with each renewal; its Role
	// is the node's role. Called from the renewing goroutine.
	Load func(ctx context.Context) api.NodeLoad
	// Fenced is the error a renewal fails with when the node no longer
	// holds its epoch (postgres.ErrFenced): the daemon then stops.
	Fenced error
}

// Member is this daemon's membership of the cluster: its lease, and the
// nodes it last read.
type Member struct {
	recs  Records
	cfg   Config
	log   *slog.Logger
	epoch int64

	mu sync.Mutex
	// until is when this node must consider its lease gone, on its own
	// clock: the start of the last renewal that succeeded, plus the
	// lease. The database's lease_until is later (its now() came after
	// that start), so the node stops acting before the others take its
	// lease for gone.
	until time.Time
	// lapsedAt is when the lease was seen gone, zero while it holds.
	lapsedAt time.Time
	// nodes are the nodes at the last reading, by name; read is the
	// database's time of it, readAt the local time of it.
	nodes  map[string]*store.Node
	read   time.Time
	readAt time.Time
}

// Join joins the cluster as cfg.Name and fences recs (SetFence) at the
// epoch it got: from then on no change of this daemon's lands unless it
// holds its lease. Run renews it.
func Join(ctx context.Context, recs Records, cfg Config, log *slog.Logger) (*Member, error) {
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	m := &Member{recs: recs, cfg: cfg, log: log, nodes: map[string]*store.Node{}}
	began := time.Now()
	epoch, err := recs.JoinNode(ctx, store.Node{Name: cfg.Name, Address: cfg.Address, Load: cfg.Load(ctx)}, cfg.Lease)
	if err != nil {
		return nil, err
	}
	m.epoch = epoch
	recs.SetFence(cfg.Name, epoch)
	m.until = began.Add(cfg.Lease)
	if err := m.readNodes(ctx); err != nil {
		log.Warn("reading the cluster's nodes", "err", err)
	}
	log.Info("joined the cluster", "node", cfg.Name, "address", cfg.Address, "epoch", epoch, "lease_ms", cfg.Lease.Milliseconds())
	return m, nil
}

// Name is this node's name.
func (m *Member) Name() string { return m.cfg.Name }

// Epoch is the epoch this start of the node joined at.
func (m *Member) Epoch() int64 { return m.epoch }

// Run renews the lease every third of it until ctx ends (nil), and reads
// the other nodes with it. A renewal that fails is tried again at the next
// tick; once the lease has run out meanwhile, the node is lapsed (Live
// false) until a renewal succeeds again. It returns an error, which stops
// the daemon, when the node no longer holds its epoch: a later start of
// it joined, or an operator removed it.
func (m *Member) Run(ctx context.Context) error {
	t := time.NewTicker(m.cfg.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := m.renew(ctx); err != nil {
			return err
		}
	}
}

// renew is one renewal and one reading of the nodes.
func (m *Member) renew(ctx context.Context) error {
	began := time.Now()
	// A renewal must not outlive the lease it renews.
	rctx, cancel := context.WithTimeout(ctx, m.cfg.Lease/2)
	err := m.recs.RenewNode(rctx, m.cfg.Name, m.epoch, m.cfg.Lease, m.cfg.Load(rctx))
	cancel()
	if ctx.Err() != nil {
		return nil
	}
	if m.cfg.Fenced != nil && errors.Is(err, m.cfg.Fenced) {
		return fmt.Errorf("node %s lost its place in the cluster: %w; this daemon stops so that it never acts on sandboxes it no longer owns", m.cfg.Name, err)
	}
	m.mu.Lock()
	if err == nil {
		// Lapsed since a failed renewal saw it, or since the lease ran
		// out between two renewals.
		lapsed := m.lapsedAt
		if lapsed.IsZero() && began.After(m.until) {
			lapsed = m.until
		}
		m.until = began.Add(m.cfg.Lease)
		if !lapsed.IsZero() {
			m.log.Warn("the node holds its lease again: it accepts changes to its sandboxes again",
				"node", m.cfg.Name, "lapsed_for_ms", time.Since(lapsed).Milliseconds())
			m.lapsedAt = time.Time{}
		}
	} else if !time.Now().Before(m.until) && m.lapsedAt.IsZero() {
		m.lapsedAt = time.Now()
		m.log.Error("the node's lease ran out: it refuses changes to its sandboxes until it renews it", "node", m.cfg.Name, "err", err)
	} else {
		m.log.Warn("renewing the node's lease", "node", m.cfg.Name, "err", err)
	}
	m.mu.Unlock()
	if err == nil {
		if err := m.readNodes(ctx); err != nil {
			m.log.Warn("reading the cluster's nodes", "err", err)
		}
	}
	return nil
}

// readNodes reads the nodes, for Lapsed and Nodes.
func (m *Member) readNodes(ctx context.Context) error {
	list, now, err := m.recs.ListNodes(ctx)
	if err != nil {
		return err
	}
	nodes := make(map[string]*store.Node, len(list))
	for _, n := range list {
		nodes[n.Name] = n
	}
	m.mu.Lock()
	m.nodes, m.read, m.readAt = nodes, now, time.Now()
	m.mu.Unlock()
	return nil
}

// Live reports whether the node holds its lease: while it does not, it
// must change nothing of its sandboxes.
func (m *Member) Live() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return time.Now().Before(m.until)
}

// Lapsed tells whether node's lease ran out at the last reading (and
// when): its sandboxes are shown unknown, calls to them refused. A node
// the reading does not know (removed) is not lapsed: its sandboxes say
// why themselves (error, "node removed").
func (m *Member) Lapsed(node string) (since time.Time, lapsed bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.nodes[node]
	if !ok || n.State(m.now()) == api.NodeReady {
		return time.Time{}, false
	}
	return n.LeaseUntil, true
}

// now is the database's time now as the last reading gives it: its time,
// moved on by the local time since. The caller holds m.mu.
func (m *Member) now() time.Time {
	return m.read.Add(time.Since(m.readAt))
}

// Nodes are the nodes at the last reading, by name, and the database's
// time now to read their leases against.
func (m *Member) Nodes() ([]*store.Node, time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	list := slices.SortedFunc(maps.Values(m.nodes), func(a, b *store.Node) int { return strings.Compare(a.Name, b.Name) })
	return list, m.now()
}

// Node is the node called name at the last reading, or nil.
func (m *Member) Node(name string) *store.Node {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.nodes[name]
}

// Gate refuses, while the node does not hold its lease, every call that
// would change something (any method but GET and HEAD, and every
// WebSocket, which runs commands and writes files): unavailable, saying
// why. Reads pass: the records are the database's.
func (m *Member) Gate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.Live() || (r.Method == http.MethodGet || r.Method == http.MethodHead) && r.Header.Get("Upgrade") == "" {
			next.ServeHTTP(w, r)
			return
		}
		api.WriteError(w, api.Errorf(api.CodeUnavailable,
			"node %s cannot reach the cluster's database to renew its lease: it accepts no changes until it can; try again, or through another node", m.cfg.Name))
	})
}

// Now is the database's time now, as the last reading of the nodes gives
// it (see Nodes).
func (m *Member) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now()
}
