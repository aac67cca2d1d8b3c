package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/columns"
)

// The nodes of a cluster. Every daemon of a cluster joins it under its
// name (JoinNode), which hands it the next epoch and a lease, and renews
// the lease every few seconds (RenewNode). Time is the database's own
// (now()), never a node's clock: two nodes whose clocks disagree still
// agree on whose lease has run out.

// Nodes are the records of the cluster's nodes and its secrets, apart from
// the sandboxes' (Store.Nodes).
type Nodes struct {
	s *Store
}

// Nodes is the nodes' side of the store.
func (s *Store) Nodes() *Nodes { return &Nodes{s: s} }

// SetFence is Store.SetFence, for the node that joined through ns.
func (ns *Nodes) SetFence(node string, epoch int64) { ns.s.SetFence(node, epoch) }

// Errors of the nodes' records.
var (
	// ErrFenced: the store is fenced (SetFence) and its node no longer
	// holds its lease at that epoch (it ran out, a later start of the node
	// joined, or the node was removed), or the record is another node's:
	// the write changed nothing.
	ErrFenced = errors.New("this node may not change the record")
	// ErrNodeRemoved: the node was removed for good (RemoveNode); it
	// cannot join again under that name.
	ErrNodeRemoved = errors.New("the node was removed")
	// ErrNodeTaken: another daemon, at another address, holds a live lease
	// under that name.
	ErrNodeTaken = errors.New("another daemon holds the node's name")
)

// JoinNode makes n.Name a node of the cluster at n.Address, or takes the
// name again (a restart), with the next epoch and a lease of lease from
// now; it returns the epoch. A node cordoned stays cordoned. It fails with
// ErrNodeRemoved for a node removed, and with ErrNodeTaken while a daemon
// at another address holds a live lease under the name: two daemons never
// share one name by mistake, and a restart (the same address) takes its
// name back at once.
func (ns *Nodes) JoinNode(ctx context.Context, n store.Node, lease time.Duration) (int64, error) {
	s := ns.s
	load, err := json.Marshal(n.Load)
	if err != nil {
		return 0, fmt.Errorf("joining as node %s: %w", n.Name, err)
	}
	var epoch int64
	var removed, taken bool
	err = s.execTx(ctx, func(tx pgx.Tx) (bool, error) {
		err := tx.QueryRow(ctx, `SELECT removed, lease_until > now() AND address <> $2 FROM nodes WHERE name = $1 FOR UPDATE`,
			n.Name, n.Address).Scan(&removed, &taken)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return false, err
		}
		if removed || taken {
			return false, nil
		}
		err = tx.QueryRow(ctx, `INSERT INTO nodes (name, address, role, epoch, lease_until, cordoned, removed, info, joined_at, renewed_at)
			VALUES ($1, $2, $3, 1, now() + $4 * interval '1 millisecond', false, false, $5, now(), now())
			ON CONFLICT (name) DO UPDATE SET address = EXCLUDED.address, role = EXCLUDED.role,
				epoch = nodes.epoch + 1, lease_until = EXCLUDED.lease_until, info = EXCLUDED.info,
				joined_at = now(), renewed_at = now()
			RETURNING epoch`, n.Name, n.Address, n.Load.Role, lease.Milliseconds(), string(load)).Scan(&epoch)
		return true, err
	})
	switch {
	case err != nil:
		return 0, fmt.Errorf("joining as node %s: %w", n.Name, err)
	case removed:
		return 0, fmt.Errorf("joining as node %s: %w for good (loam nodes remove); start this daemon under another name", n.Name, ErrNodeRemoved)
	case taken:
		return 0, fmt.Errorf("joining as node %s at %s: %w (at another address, its lease still running); give this daemon another name", n.Name, n.Address, ErrNodeTaken)
	}
	return epoch, nil
}

// RenewNode extends the lease of node name at epoch to lease from now,
// and records what it reports (load). ErrFenced if the node no longer
// holds that epoch (a later start of it joined, or it was removed); a
// lease that ran out meanwhile is renewed, the node taking its sandboxes
// back.
func (ns *Nodes) RenewNode(ctx context.Context, name string, epoch int64, lease time.Duration, load api.NodeLoad) error {
	s := ns.s
	b, err := json.Marshal(load)
	if err != nil {
		return fmt.Errorf("renewing the lease of node %s: %w", name, err)
	}
	tag, err := s.exec(store.WithoutAudit(ctx), `UPDATE nodes SET lease_until = now() + $3 * interval '1 millisecond',
		renewed_at = now(), info = $4, role = $5
		WHERE name = $1 AND epoch = $2 AND NOT removed`, name, epoch, lease.Milliseconds(), string(b), load.Role)
	if err != nil {
		return fmt.Errorf("renewing the lease of node %s: %w", name, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("renewing the lease of node %s at epoch %d: %w: it was removed, or a later start of it joined", name, epoch, ErrFenced)
	}
	return nil
}

// ListNodes lists the nodes not removed, by name, and the database's time
// now, against which their leases are read.
func (ns *Nodes) ListNodes(ctx context.Context) ([]*store.Node, time.Time, error) {
	s := ns.s
	var now time.Time
	if err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return nil, now, fmt.Errorf("listing nodes: %w", unavailable(err))
	}
	rows, err := s.pool.Query(ctx, `SELECT name, address, epoch, cordoned, info, joined_at, renewed_at, lease_until
		FROM nodes WHERE NOT removed ORDER BY name COLLATE "C"`)
	if err != nil {
		return nil, now, fmt.Errorf("listing nodes: %w", unavailable(err))
	}
	list, err := collect(rows, scanNode)
	if err != nil {
		return nil, now, fmt.Errorf("listing nodes: %w", err)
	}
	return list, now.UTC(), nil
}

func scanNode(row pgx.Row) (*store.Node, error) {
	var n store.Node
	var load string
	if err := row.Scan(&n.Name, &n.Address, &n.Epoch, &n.Cordoned, &load, &n.JoinedAt, &n.RenewedAt, &n.LeaseUntil); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(load), &n.Load); err != nil {
		return nil, fmt.Errorf("node %s: reading its load: %w", n.Name, err)
	}
	n.JoinedAt, n.RenewedAt, n.LeaseUntil = n.JoinedAt.UTC(), n.RenewedAt.UTC(), n.LeaseUntil.UTC()
	return &n, nil
}

// CordonNode stops (on) or resumes placements on node name;
// store.ErrNotFound if there is no such node.
func (ns *Nodes) CordonNode(ctx context.Context, name string, on bool) error {
	s := ns.s
	tag, err := s.exec(ctx, `UPDATE nodes SET cordoned = $2 WHERE name = $1 AND NOT removed AND cordoned <> $2`, name, on)
	if err != nil {
		return fmt.Errorf("cordoning node %s: %w", name, err)
	}
	if tag.RowsAffected() == 0 {
		var found bool
		if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM nodes WHERE name = $1 AND NOT removed)`, name).Scan(&found); err != nil {
			return fmt.Errorf("cordoning node %s: %w", name, unavailable(err))
		}
		if !found {
			return fmt.Errorf("cordoning node %s: %w", name, store.ErrNotFound)
		}
	}
	return nil
}

// RemoveNodeReason is the reason a removed node's sandboxes are in state
// error with.
const RemoveNodeReason = api.NodeRemovedReason

// RemoveNode declares node name gone for good: its lease ends now, it can
// never renew it or join again, and each of its sandboxes is in state
// error ("node removed"), in one transaction. It returns how many
// sandboxes it marked; store.ErrNotFound if there is no such node.
func (ns *Nodes) RemoveNode(ctx context.Context, name string) (int, error) {
	s := ns.s
	var marked int64
	var found bool
	err := s.execTx(ctx, func(tx pgx.Tx) (bool, error) {
		tag, err := tx.Exec(ctx, `UPDATE nodes SET removed = true, lease_until = now() WHERE name = $1 AND NOT removed`, name)
		if err != nil || tag.RowsAffected() == 0 {
			return false, err
		}
		found = true
		tag, err = tx.Exec(ctx, `UPDATE sandboxes SET state = $2, error = $3, restore_target = '', version = version + 1
			WHERE node = $1`, name, string(api.StateError), RemoveNodeReason)
		marked = tag.RowsAffected()
		return true, err
	})
	if err != nil {
		return 0, fmt.Errorf("removing node %s: %w", name, err)
	}
	if !found {
		return 0, fmt.Errorf("removing node %s: %w", name, store.ErrNotFound)
	}
	return int(marked), nil
}

// ClusterSecret is the cluster's secret called name: made by make and
// kept on first use, the kept one from then on, also when several nodes
// ask at once (one make wins, every node gets its value).
func (ns *Nodes) ClusterSecret(ctx context.Context, name string, make func() ([]byte, error)) ([]byte, error) {
	s := ns.s
	var v []byte
	err := s.pool.QueryRow(ctx, `SELECT value FROM cluster_secrets WHERE name = $1`, name).Scan(&v)
	if err == nil {
		return v, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("reading the cluster's %s: %w", name, unavailable(err))
	}
	made, err := make()
	if err != nil {
		return nil, fmt.Errorf("making the cluster's %s: %w", name, err)
	}
	if _, err := s.exec(store.WithoutAudit(ctx), `INSERT INTO cluster_secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`, name, made); err != nil {
		return nil, fmt.Errorf("keeping the cluster's %s: %w", name, err)
	}
	if err := s.pool.QueryRow(ctx, `SELECT value FROM cluster_secrets WHERE name = $1`, name).Scan(&v); err != nil {
		return nil, fmt.Errorf("reading the cluster's %s: %w", name, unavailable(err))
	}
	return v, nil
}

// fence is the node a fenced store writes for (SetFence).
type fence struct {
	node  string
	epoch int64
}

// SetFence makes every change s makes to a sandbox or checkpoint record
// conditional on node holding a live lease at epoch, checked in the
// change's own transaction (the node's row locked against a join or a
// removal meanwhile), and, for a record that exists, on the record being
// node's: otherwise the change is refused with ErrFenced (the API's
// unavailable) and nothing lands. A node sets it after it joins (and
// again after each join); a store of one machine has none.
func (s *Store) SetFence(node string, epoch int64) {
	s.fence.Store(&fence{node: node, epoch: epoch})
}

// checkFence is the fence's check in tx, the transaction of a change to a
// record of sandbox id (its owner checked when it exists; "" for a new
// one).
func (s *Store) checkFence(ctx context.Context, tx pgx.Tx, id string) error {
	f := s.fence.Load()
	if f == nil {
		return nil
	}
	var one int
	err := tx.QueryRow(ctx, `SELECT 1 FROM nodes WHERE name = $1 AND epoch = $2 AND NOT removed AND lease_until > now() FOR SHARE`,
		f.node, f.epoch).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %w", api.Errorf(api.CodeUnavailable,
			"node %s does not hold its lease (cut off from the database, replaced by a later start, or removed): it changes nothing until it renews it", f.node), ErrFenced)
	}
	if err != nil || id == "" {
		return err
	}
	var owner string
	var gone bool
	// A removed node's sandboxes are anyone's: their records are all that
	// is left of them (the node never acts again), for a live node to
	// delete, or (next) to bring back.
	err = tx.QueryRow(ctx, `SELECT s.node, COALESCE(n.removed, false) FROM sandboxes s
		LEFT JOIN nodes n ON n.name = s.node WHERE s.id = $1 FOR UPDATE OF s`, id).Scan(&owner, &gone)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // the change finds no record, and says so
	}
	if err != nil {
		return err
	}
	// An unpinned sandbox (store.AnyNode: asleep, its image stored, tied
	// to no node) is anyone's as well.
	if owner != f.node && !gone && owner != "" {
		return fmt.Errorf("%w: %w", api.Errorf(api.CodeUnavailable,
			"sandbox %s belongs to node %s, not to this node (%s): only its owner changes it", id, owner, f.node), ErrFenced)
	}
	return nil
}

// execOwned is exec for a change to the records of sandbox id, behind the
// fence (SetFence).
func (s *Store) execOwned(ctx context.Context, id, query string, args ...any) (pgconn.CommandTag, error) {
	var tag pgconn.CommandTag
	err := s.execTx(ctx, func(tx pgx.Tx) (bool, error) {
		if err := s.checkFence(ctx, tx, id); err != nil {
			return false, err
		}
		var err error
		tag, err = tx.Exec(ctx, query, args...)
		return err == nil && tag.RowsAffected() > 0, err
	})
	return tag, err
}

// AdoptSandboxes makes node the owner of every sandbox that has none: the
// records a daemon without --node kept in the database, when it starts
// again as the cluster's first node on the same data dir (whose sandboxes
// they are). It returns how many it adopted. Behind the fence, as every
// change of a node's.
func (ns *Nodes) AdoptSandboxes(ctx context.Context, node string) (int, error) {
	s := ns.s
	var n int64
	err := s.execTx(ctx, func(tx pgx.Tx) (bool, error) {
		if err := s.checkFence(ctx, tx, ""); err != nil {
			return false, err
		}
		// Not an unpinned one (store.AnyNode): those are any node's
		// to take over when it is woken, with its image.
		tag, err := tx.Exec(ctx, `UPDATE sandboxes SET node = $1, version = version + 1 WHERE node = '' AND handover <> $2`, node, store.AnyNode)
		n = tag.RowsAffected()
		return err == nil && n > 0, err
	})
	if err != nil {
		return 0, fmt.Errorf("adopting the sandboxes of no node: %w", err)
	}
	return int(n), nil
}

// TakeOverSleeping makes node "to" the owner of sleeping sandbox id, to
// wake it there from its stored sleep image (see sandbox's adopt): one
// whose node from stopped answering or was removed, or that is tied to no
// node (from "", store.AnyNode). It stays asleep, with the network slot
// netIndex of to's range, and only while its record says it sleeps with
// token generation gen, the image's: a sandbox woken since (which moves
// the generation on) is never taken over from an older image. In one
// transaction, behind the fence: of two nodes that try at once, one alone
// wins; the other gets store.ErrStale.
func (ns *Nodes) TakeOverSleeping(ctx context.Context, id, from, to string, netIndex, gen int) (*store.Sandbox, error) {
	s := ns.s
	var sb *store.Sandbox
	err := s.execTx(ctx, func(tx pgx.Tx) (bool, error) {
		if err := s.checkFence(ctx, tx, ""); err != nil {
			return false, err
		}
		row := tx.QueryRow(ctx, `UPDATE sandboxes SET node = $3, net_index = $4, handover = '', version = version + 1
			WHERE id = $1 AND node = $2 AND node <> $3 AND state = 'sleeping' AND agent_gen = $5 AND (
				($2 = '' AND handover = $6) OR EXISTS (
				SELECT 1 FROM nodes WHERE name = $2 AND (removed OR lease_until <= now()) FOR UPDATE))
			RETURNING `+columns.SandboxNames, id, from, to, netIndex, gen, store.AnyNode)
		var err error
		sb, err = scanSandbox(row)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, fmt.Errorf("sandbox %s is not asleep on node %q with token generation %d, or that node holds its lease again: %w", id, from, gen, store.ErrStale)
		}
		return err == nil, err
	})
	if err != nil {
		return nil, fmt.Errorf("taking over sleeping sandbox %s from node %q: %w", id, from, err)
	}
	return sb, nil
}

// TakeOverSandbox makes node "to" the owner of sandbox id, whose node from
// stopped answering (its lease ran out) or was removed, or that its
// owner hands to "to" (store.Sandbox.Handover, a move): the one step that
// brings a sandbox back on another node, from a stored checkpoint. It gives the record the network slot netIndex of
// to's range and state error with reason (no machine runs it on to yet),
// and answers the record as it now is. In one transaction, behind the
// fence, and only while from's lease is still out: of two nodes that try
// at once, or a node that took it while from came back, one alone wins;
// the other gets store.ErrStale. From then on from changes nothing of it
// (the fence's owner check), and finds it another node's when it acts
// again (see sandbox's stale copies).
func (ns *Nodes) TakeOverSandbox(ctx context.Context, id, from, to string, netIndex int, reason string) (*store.Sandbox, error) {
	s := ns.s
	var sb *store.Sandbox
	err := s.execTx(ctx, func(tx pgx.Tx) (bool, error) {
		if err := s.checkFence(ctx, tx, ""); err != nil {
			return false, err
		}
		row := tx.QueryRow(ctx, `UPDATE sandboxes SET node = $3, net_index = $4, state = 'error', error = $5,
			restore_target = '', version = version + 1
			WHERE id = $1 AND node = $2 AND node <> $3 AND (handover = $3 OR EXISTS (
				SELECT 1 FROM nodes WHERE name = $2 AND (removed OR lease_until <= now()) FOR UPDATE))
			RETURNING `+columns.SandboxNames, id, from, to, netIndex, reason)
		var err error
		sb, err = scanSandbox(row)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, fmt.Errorf("sandbox %s is not on node %s, or node %s holds its lease again: %w", id, from, from, store.ErrStale)
		}
		return err == nil, err
	})
	if err != nil {
		return nil, fmt.Errorf("taking over sandbox %s from node %s: %w", id, from, err)
	}
	return sb, nil
}
