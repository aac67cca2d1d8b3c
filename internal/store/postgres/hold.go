package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// holdLock is the advisory lock a daemon holds on its database for as long
// as it runs ("loamd" in ASCII, beside migrateLock).
const holdLock = 0x6c6f616d64

// ErrHeld is Hold's error when another daemon holds the database.
var ErrHeld = errors.New("another loam daemon holds this database")

// Hold makes s the database's only daemon until Close: until nodes share
// one database (each acting on its own sandboxes alone), a second daemon
// on it would take the first's sandboxes for its own, and its recovery
// would delete those its host does not run. It takes a session advisory
// lock on a connection of its own, outside the pool, which Close ends;
// ErrHeld if another daemon has it. A lost connection loses the lock with
// it (PostgreSQL ends the session): the daemon does not notice until its
// next start.
//
// A database a cluster's nodes have joined (JoinNode) is theirs: Hold
// refuses it with ErrClustered, even while none of them runs, since every
// sandbox recorded there is a node's.
func (s *Store) Hold(ctx context.Context) error {
	return s.hold(ctx, false)
}

// HoldAsNode holds the database as one node of a cluster among others:
// nodes share it (each acts on its own sandboxes alone), while a daemon
// without --node holding it (Hold) keeps them out, and they it.
func (s *Store) HoldAsNode(ctx context.Context) error {
	return s.hold(ctx, true)
}

// ErrClustered is Hold's error on a database that a cluster's nodes use.
var ErrClustered = errors.New("this database is a cluster's: its nodes keep their sandboxes' records in it")

func (s *Store) hold(ctx context.Context, shared bool) error {
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("holding the database: %w", unavailable(err))
	}
	take := `SELECT pg_try_advisory_lock($1)`
	if shared {
		take = `SELECT pg_try_advisory_lock_shared($1)`
	}
	var got bool
	if err := conn.QueryRow(ctx, take, holdLock).Scan(&got); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return fmt.Errorf("holding the database: %w", unavailable(err))
	}
	if !got {
		conn.Close(context.WithoutCancel(ctx))
		if shared {
			return fmt.Errorf("holding the database: %w without --node (stop it first: a cluster's nodes cannot share a database with it)", ErrHeld)
		}
		return fmt.Errorf("holding the database: %w (stop it, or give this one a database of its own)", ErrHeld)
	}
	if !shared {
		var nodes int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM nodes WHERE NOT removed`).Scan(&nodes); err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return fmt.Errorf("holding the database: %w", unavailable(err))
		}
		if nodes > 0 {
			conn.Close(context.WithoutCancel(ctx))
			return fmt.Errorf("holding the database: %w (%d nodes joined it): start this daemon with --node NAME --advertise URL to join them", ErrClustered, nodes)
		}
	}
	s.mu.Lock()
	s.held, s.heldShared = conn, shared
	s.mu.Unlock()
	return nil
}

// heldEvery is how often KeepHeld looks at the held connection.
const heldEvery = 2 * time.Second

// KeepHeld keeps the hold Hold took until ctx ends: the lock lives as long
// as its session, which a restart of the server or a cut connection ends,
// and another daemon could then take the database. Every heldEvery it
// looks at the held connection; when that is gone it holds the database
// again on a new one, as soon as the server answers. It returns ErrHeld
// (the daemon must stop: another holds the database now) or, when ctx
// ends, nil. Run it as one of the daemon's components, after Hold.
func (s *Store) KeepHeld(ctx context.Context) error {
	t := time.NewTicker(heldEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		s.mu.Lock()
		conn, shared := s.held, s.heldShared
		s.mu.Unlock()
		if conn == nil {
			return errors.New("keeping the database held: it is not held (Hold first)")
		}
		if conn.Ping(ctx) == nil {
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		conn.Close(context.WithoutCancel(ctx))
		err := s.hold(ctx, shared)
		if errors.Is(err, ErrHeld) || errors.Is(err, ErrClustered) {
			return fmt.Errorf("the database's hold was lost with its connection, and another daemon holds it now: this one stops, so that two never act on its sandboxes: %w", ErrHeld)
		}
		// Unreachable: calls answer unavailable meanwhile; look again.
	}
}

// ID names the database for a data dir to remember: its name and when
// loam first made its schema there, which no other database shares. A
// data dir records whose records it keeps (see internal/daemon), so that a
// daemon started on it with another database, or with none, refuses
// rather than take its sandboxes for leftovers.
func (s *Store) ID(ctx context.Context) (string, error) {
	var name, made string
	err := s.pool.QueryRow(ctx, `SELECT current_database(),
		to_char(applied_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
		FROM loam_schema WHERE version = 1`).Scan(&name, &made)
	if err != nil {
		return "", fmt.Errorf("naming the database: %w", unavailable(err))
	}
	return name + "@" + made, nil
}
