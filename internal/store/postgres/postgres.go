// Package postgres is the store.Store of a loam that spans many machines:
// every record in one PostgreSQL database (15 or newer), reached through
// github.com/jackc/pgx/v5's pool. It keeps what package sqlite keeps, in
// the same shapes and with the same errors, and passes the same suite
// (storetest); nothing above the store can tell the two apart.
//
// Every write is durable when the call returns: PostgreSQL's commit waits
// for its WAL to reach disk (synchronous_commit on, the server's default,
// which the store does not turn off). The schema is versioned (table
// loam_schema); Open applies the missing versions in one transaction under
// an advisory lock, so several daemons starting at once against one
// database migrate it once.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/netdial"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/columns"
)

// Store is a store.Store kept in a PostgreSQL database. It is safe for
// concurrent use, also by several daemons at once. Records it returns are
// fresh copies the caller may change.
type Store struct {
	pool *pgxpool.Pool

	mu sync.Mutex
	// held, when set, is the connection whose session holds the database
	// for this daemon (see Hold).
	held *pgx.Conn
	// heldShared is true when held holds it as a node (HoldAsNode).
	heldShared bool

	// fence, when set, is the node whose lease every change to a sandbox
	// or checkpoint record is conditional on (see SetFence).
	fence atomic.Pointer[fence]
}

var _ store.Store = (*Store)(nil)

// Open connects to the database url names (a postgres:// URL or a
// key=value connection string, as libpq takes) and migrates its schema to
// the current version. Close it when done.
func Open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx's message may quote the URL, password included.
		return nil, errors.New("opening the store: the database URL is not a PostgreSQL connection string")
	}
	bound(&cfg.ConnConfig.Config)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening the store at %s: %w", where(cfg), err)
	}
	s := &Store{pool: pool}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("opening the store at %s: %w", where(cfg), unavailable(err))
	}
	if err := migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("opening the store at %s: %w", where(cfg), err)
	}
	return s, nil
}

// bound makes cfg's connections give up on a database gone silent (see
// netdial), where its URL did not choose its own connect_timeout: a call
// that needs it then answers unavailable instead of hanging.
//
// It bounds the server's side too. A node whose link drops part-way
// through a transaction leaves its session open on the server, idle in
// that transaction, holding its locks until the server notices the peer
// is gone: with the kernel's defaults, hours. One such transaction held
// auditLock, and every audited call of every node waited on it (seen in
// CI: TestClusterCutOff, calls through node a hung until b's link came
// back). So the server ends a session idle in a transaction after
// idleInTx (loam's transactions run statement after statement, never
// waiting on anything else), and drops a connection whose data stays
// unacknowledged, or whose peer stops answering keepalives, as the client
// does (netdial). Parameters the URL sets win.
func bound(cfg *pgconn.Config) {
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = netdial.ConnectTimeout
	}
	cfg.DialFunc = netdial.Dialer().DialContext
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	for k, v := range map[string]string{
		"idle_in_transaction_session_timeout": strconv.FormatInt(idleInTx.Milliseconds(), 10),
		"tcp_user_timeout":                    strconv.FormatInt(netdial.UserTimeout.Milliseconds(), 10),
		"tcp_keepalives_idle":                 strconv.Itoa(int(netdial.KeepAlive.Seconds())),
		"tcp_keepalives_interval":             strconv.Itoa(int(netdial.KeepAlive.Seconds())),
		"tcp_keepalives_count":                "2",
	} {
		if _, set := cfg.RuntimeParams[k]; !set {
			cfg.RuntimeParams[k] = v
		}
	}
}

// idleInTx is how long the server lets a session sit idle in a
// transaction before it ends the session (see bound).
const idleInTx = 10 * time.Second

// where names the database of cfg for a message: host and database, never
// the user's password.
func where(cfg *pgxpool.Config) string {
	return fmt.Sprintf("%s:%d/%s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
}

// Close closes the pool's connections and lets go of the database (see
// Hold).
func (s *Store) Close() error {
	s.mu.Lock()
	held := s.held
	s.held = nil
	s.mu.Unlock()
	var err error
	if held != nil {
		err = held.Close(context.Background())
	}
	s.pool.Close()
	return err
}

// exec runs a statement that writes. When ctx carries an API call's audit
// record not yet written, the statement and the record commit in one
// transaction (see store.AuditCall): a change the store keeps is never
// missing from the audit log. A statement that changes no row writes no
// record.
func (s *Store) exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	var tag pgconn.CommandTag
	err := s.execTx(ctx, func(tx pgx.Tx) (bool, error) {
		var err error
		tag, err = tx.Exec(ctx, query, args...)
		return err == nil && tag.RowsAffected() > 0, err
	})
	return tag, err
}

// execTx runs change in one transaction, with the call's audit record
// (store.AuditFrom) when it changed something: a change of several
// statements, as exec is of one. change reports whether it changed
// anything; its error rolls everything back.
func (s *Store) execTx(ctx context.Context, change func(tx pgx.Tx) (changed bool, err error)) error {
	run := func(ev *api.AuditEvent) (int64, error) {
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		changed, err := change(tx)
		if err != nil {
			return 0, err
		}
		var seq int64
		if changed && ev != nil {
			if seq, err = insertAudit(ctx, tx, *ev); err != nil {
				return 0, err
			}
		}
		return seq, tx.Commit(ctx)
	}
	var err error
	if call := store.AuditFrom(ctx); call != nil {
		err = call.Attach(run)
	} else {
		_, err = run(nil)
	}
	return unavailable(err)
}

// auditLock is the advisory lock an audit record's transaction holds
// from taking its seq to its commit. ("audit" in ASCII.)
const auditLock = 0x6175646974

// insertAudit writes ev in tx and returns its sequence number.
//
// It first takes auditLock, which tx holds until it ends, so records
// commit in the order of their seqs, as SQLite's single writer commits
// them. Without it, of two transactions the one with the later seq may
// commit first: a reader paging with since_seq that saw it would never
// see the other, a record missing from the log it read. The record is a
// transaction's last statement: the holder has only its commit left, so
// the wait is short and cannot deadlock.
func insertAudit(ctx context.Context, tx pgx.Tx, ev api.AuditEvent) (int64, error) {
	at, err := columns.FormatTime(ev.Time)
	if err != nil {
		return 0, fmt.Errorf("writing audit record: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, auditLock); err != nil {
		return 0, fmt.Errorf("writing audit record: %w", err)
	}
	var seq int64
	err = tx.QueryRow(ctx, `INSERT INTO audit (time, org, key, action, target, outcome, client)
		VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING seq`,
		at, ev.Org, ev.Key, ev.Action, ev.Target, ev.Outcome, ev.Client).Scan(&seq)
	if err != nil {
		return 0, fmt.Errorf("writing audit record: %w", err)
	}
	return seq, nil
}

// PostgreSQL's error codes (SQLSTATE) the store tells apart.
const (
	codeUniqueViolation     = "23505"
	codeForeignKeyViolation = "23503"
)

// sqlState is the SQLSTATE of a PostgreSQL error, or "" for another error.
func sqlState(err error) string {
	var e *pgconn.PgError
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// isUniqueViolation tells whether err is a UNIQUE or PRIMARY KEY
// constraint failing, that is, an id or name already in use.
func isUniqueViolation(err error) bool { return sqlState(err) == codeUniqueViolation }

// isForeignKeyViolation tells whether err is a FOREIGN KEY constraint
// failing: a checkpoint for a sandbox that does not exist.
func isForeignKeyViolation(err error) bool { return sqlState(err) == codeForeignKeyViolation }

// unavailable marks an error of reaching the database (no server, a
// connection lost, the server shutting down) as the API's unavailable, so
// a call that needs the database while it is away says so clearly; the
// server's own answers (a constraint, a syntax error) and a caller's
// cancellation stay as they are.
func unavailable(err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if code := sqlState(err); code != "" && !serverGoingAway(code) {
		return err
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	if sqlState(err) != "" || errors.As(err, &ce) || errors.As(err, &ne) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, pgconn.ErrConnClosed) || pgconn.SafeToRetry(err) {
		return fmt.Errorf("%w: %w", api.Errorf(api.CodeUnavailable,
			"the database is not reachable; try again when it is back"), err)
	}
	return err
}

// serverGoingAway tells whether a SQLSTATE is the server's own "I am
// stopping or cannot take you": class 57P (admin or crash shutdown,
// cannot connect now) and class 08 (connection exceptions).
func serverGoingAway(code string) bool {
	return len(code) == 5 && (code[:3] == "57P" || code[:2] == "08")
}

// collect reads every row of rows with scan, closing rows; an empty list
// is empty, never nil, as the API shows [].
func collect[T any](rows pgx.Rows, scan func(pgx.Row) (*T, error)) ([]*T, error) {
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*T, error) { return scan(r) })
	if err != nil {
		return nil, unavailable(err)
	}
	if list == nil {
		list = []*T{}
	}
	return list, nil
}

// oneRow turns a statement that touched no row into store.ErrNotFound.
func oneRow(tag pgconn.CommandTag) error {
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}
