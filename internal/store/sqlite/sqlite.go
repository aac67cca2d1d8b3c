// Package sqlite is the embedded default store.Store: one SQLite database
// file, driven by the pure-Go modernc.org/sqlite driver so the daemon needs
// no C toolchain or system library.
//
// On disk the store is the database file plus SQLite's -wal file beside it,
// which must stay with it. The WAL's index lives in the daemon's memory, not
// in a -shm file (see dsn), so while a Store is open no other process can
// open the database. The schema's version is the file's
// PRAGMA user_version; Open brings an older file up to date and refuses a
// newer one.
//
// Every write is durable when the call returns (WAL with synchronous=FULL
// fsyncs the log on each commit). The checkpoint package relies on this: it
// writes a checkpoint's record last, after its data parts, so a crash can
// never leave a record pointing at a half-written checkpoint.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	sqlitedriver "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/atomicfile"
	"loam.dev/loam/internal/store"
)

const (
	// busyTimeoutMS is how long a statement waits for a lock held by another
	// process (a sqlite3 shell left open on a stopped daemon's database)
	// before failing with SQLITE_BUSY. Within one Store writers never
	// contend: they queue for the single write connection.
	busyTimeoutMS = 10000
	// readConns bounds the read pool. WAL lets readers run beside the writer;
	// a few are enough for a metadata store on a small machine.
	readConns = 4
)

// Store is a store.Store kept in one SQLite database file. It is safe for
// concurrent use. Records it returns are fresh copies the caller may change.
type Store struct {
	path string
	// w is the only connection that writes. SQLite admits one writer at a
	// time anyway; queueing writers in database/sql instead of in SQLite's
	// busy handler keeps them fair and free of SQLITE_BUSY.
	w *sql.DB
	// r serves reads; its connections are query_only.
	r *sql.DB
}

var _ store.Store = (*Store)(nil)

// Open opens the store at path, creating the database file (but not its
// directory) if it does not exist, and migrates its schema to the current
// version. Close it when done.
func Open(ctx context.Context, path string) (*Store, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("opening store %s: %w", path, err)
	}
	s := &Store{path: abs}
	if err := restrictFiles(abs); err != nil {
		return nil, fmt.Errorf("opening store %s: %w", abs, err)
	}
	s.w, err = sql.Open("sqlite", dsn(abs, false))
	if err != nil {
		return nil, fmt.Errorf("opening store %s: %w", abs, err)
	}
	s.w.SetMaxOpenConns(1)
	s.w.SetMaxIdleConns(1)
	// Pooled connections are never recycled: each one's pragmas are set
	// once, when the driver opens it.
	s.w.SetConnMaxLifetime(0)
	s.w.SetConnMaxIdleTime(0)

	if err := s.setUp(ctx); err != nil {
		s.w.Close()
		return nil, fmt.Errorf("opening store %s: %w", abs, err)
	}

	s.r, err = sql.Open("sqlite", dsn(abs, true))
	if err != nil {
		s.w.Close()
		return nil, fmt.Errorf("opening store %s: %w", abs, err)
	}
	s.r.SetMaxOpenConns(readConns)
	s.r.SetMaxIdleConns(readConns)
	s.r.SetConnMaxLifetime(0)
	s.r.SetConnMaxIdleTime(0)
	if err := s.r.PingContext(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("opening store %s: %w", abs, err)
	}
	return s, nil
}

// setUp checks the write connection's journal mode, migrates the schema and
// makes the new file's directory entry durable.
func (s *Store) setUp(ctx context.Context) error {
	// PRAGMA journal_mode=WAL does not fail where WAL is impossible (some
	// network file systems): it leaves the old mode, so ask what we got.
	var mode string
	if err := s.w.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return fmt.Errorf("reading journal mode: %w", err)
	}
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("setting journal mode: got %q, want wal (is %s on a file system without shared memory?)", mode, filepath.Dir(s.path))
	}
	if err := migrate(ctx, s.w); err != nil {
		return err
	}
	// The WAL and its index exist now; SQLite gives them the database's
	// mode, but a file left by an older loam may have kept a wider one.
	if err := restrictFiles(s.path); err != nil {
		return err
	}
	// SQLite syncs the directory when it creates the -wal file, but not when
	// it creates the database file itself: without this a crash just after
	// the first Open could lose the file and, with it, every record.
	if err := atomicfile.SyncDir(filepath.Dir(s.path)); err != nil {
		return fmt.Errorf("syncing directory of database: %w", err)
	}
	return nil
}

// dsn is the driver's name for the database at abs. The file: URI form
// escapes the path, so a '?' or '#' in it cannot be taken for parameters.
// The _pragma parameters run on every new connection of the pool: pragmas
// like synchronous and foreign_keys belong to a connection, not the file.
func dsn(abs string, readOnly bool) string {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeoutMS))
	q.Add("_pragma", "foreign_keys(1)")
	if readOnly {
		q.Add("_pragma", "query_only(1)")
	} else {
		q.Add("_pragma", "journal_mode(WAL)")
		// FULL: every commit fsyncs the WAL, so a call that returned is on
		// disk. NORMAL (the usual WAL setting) may lose the last commits
		// on power loss, which a checkpoint record must never be.
		q.Add("_pragma", "synchronous(FULL)")
		// BEGIN IMMEDIATE takes the write lock up front, so a transaction
		// that reads before it writes cannot fail halfway with
		// SQLITE_BUSY because another process wrote in between.
		q.Set("_txlock", "immediate")
	}
	// unix-excl keeps the WAL's index (the -shm file) in this process's
	// heap instead of a shared mapping of a file beside the database. On a
	// full copy-on-write filesystem (btrfs, where the data dir usually is)
	// a store into a mapped page can find no room: the kernel answers with
	// SIGBUS, which made every read fail with SQLITE_IOERR_IN_PAGE and, once
	// in CI, killed the daemon. The price: while the daemon runs it holds
	// the file's lock alone, so no other process (a second daemon, the
	// sqlite3 shell) can open it; the data dir's own lock already keeps a
	// second daemon out.
	q.Set("vfs", "unix-excl")
	u := url.URL{Scheme: "file", Path: abs, RawQuery: q.Encode()}
	return u.String()
}

// Path is the absolute path of the database file.
func (s *Store) Path() string { return s.path }

// Close closes the store. The last connection to close folds the WAL back
// into the database file.
func (s *Store) Close() error {
	var errs []error
	if s.r != nil {
		if err := s.r.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.w.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("closing store %s: %w", s.path, err)
	}
	return nil
}

// exec runs a statement that writes on the write connection. A write the
// filesystem has no room for fails as insufficient_storage, which the API
// answers with 507 and its message, instead of an internal error: the
// caller learns that freeing space in the data dir is the cure.
//
// When ctx carries an API call's audit record not yet written, the
// statement and the record commit in one transaction (see store.AuditCall):
// a change the store keeps is never missing from the audit log. A
// statement that changes no row writes no record.
func (s *Store) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	var res sql.Result
	var err error
	if call := store.AuditFrom(ctx); call != nil {
		err = call.Attach(func(ev *api.AuditEvent) (int64, error) {
			if ev == nil {
				res, err = s.w.ExecContext(ctx, query, args...)
				return 0, err
			}
			return s.execAudited(ctx, ev, &res, query, args)
		})
	} else {
		res, err = s.w.ExecContext(ctx, query, args...)
	}
	return res, storageError(err)
}

// execTx runs change in one write transaction, with the call's audit
// record (store.AuditFrom) when it changed something: a change of several
// statements, as exec is of one. change reports whether it changed
// anything; its error rolls everything back.
func (s *Store) execTx(ctx context.Context, change func(tx *sql.Tx) (changed bool, err error)) error {
	run := func(ev *api.AuditEvent) (int64, error) {
		tx, err := s.w.BeginTx(ctx, nil)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback()
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
		return seq, tx.Commit()
	}
	var err error
	if call := store.AuditFrom(ctx); call != nil {
		err = call.Attach(run)
	} else {
		_, err = run(nil)
	}
	return storageError(err)
}

// execAudited runs query and writes ev in one transaction; the record's
// seq, or 0 when query changed nothing (and so no record was written).
func (s *Store) execAudited(ctx context.Context, ev *api.AuditEvent, res *sql.Result, query string, args []any) (int64, error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	r, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	*res = r
	if n, err := r.RowsAffected(); err != nil || n == 0 {
		return 0, tx.Commit()
	}
	seq, err := insertAudit(ctx, tx, *ev)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	return seq, nil
}

// storageError turns a write the filesystem had no room for into
// insufficient_storage.
func storageError(err error) error {
	if sqliteCode(err)&0xff == sqlite3.SQLITE_FULL {
		return fmt.Errorf("%w: %w", api.Errorf(api.CodeInsufficientStorage,
			"the data dir is full: the daemon cannot record the change in its database; free space in the data dir and try again"), err)
	}
	return err
}

// sqliteCode is the extended result code of a SQLite error, or 0 for
// another error. The driver turns extended codes on for every connection.
func sqliteCode(err error) int {
	var e *sqlitedriver.Error
	if errors.As(err, &e) {
		return e.Code()
	}
	return 0
}

// isUniqueViolation tells whether err is a UNIQUE or PRIMARY KEY constraint
// failing, that is, an id or name already in use.
func isUniqueViolation(err error) bool {
	switch sqliteCode(err) {
	case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
		return true
	}
	return false
}

// isForeignKeyViolation tells whether err is a FOREIGN KEY constraint
// failing: a checkpoint for a sandbox that does not exist.
func isForeignKeyViolation(err error) bool {
	return sqliteCode(err) == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY
}

// scanner is a *sql.Row or *sql.Rows.
type scanner interface {
	Scan(dest ...any) error
}

// fileMode is the mode of the database and its WAL files: the records name
// every sandbox and checkpoint, which are no one else's business.
const fileMode = 0o600

// restrictFiles makes the database file (creating it empty if missing, so
// that SQLite never creates it with the umask's mode) and any WAL files
// readable by their owner only.
func restrictFiles(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, fileMode)
	if err != nil {
		return err
	}
	err = f.Chmod(fileMode)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	for _, suffix := range []string{"-wal", "-shm", "-journal"} {
		if err := os.Chmod(path+suffix, fileMode); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
