package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"loam.dev/loam/internal/atomicfile"
	"loam.dev/loam/internal/audit"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/console"
	"loam.dev/loam/internal/image"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/secret"
	"loam.dev/loam/internal/server"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/postgres"
	"loam.dev/loam/internal/store/sqlite"
)

// Records is every record the daemon keeps, in one store: SQLite in the
// data dir (the default, one machine), or PostgreSQL (--database). Each
// part is the interface of the package that uses it, so the daemon asks of
// a store exactly what its parts do.
type Records interface {
	store.Store
	image.Records
	sandbox.OrgStore
	auth.KeyStore
	audit.Pruner
	console.SessionStore
	server.AuditLog
	secret.Records
	// RegistryCredentials is the table of sealed registry credentials.
	RegistryCredentials() store.Sealed
}

var (
	_ Records = (*sqlite.Store)(nil)
	_ Records = (*postgres.Store)(nil)
)

// recordsFile, in the data dir, says whose records its sandboxes are:
// "sqlite" (in storeFile beside it) or "postgres ID" (a database's
// postgres.Store.ID). A data dir's disks and sandbox directories are only
// as good as the records that name them: a daemon that finds none (given
// another database, or none) would take them for leftovers and remove
// them, so it refuses to start instead.
const recordsFile = "records"

// openRecords opens the daemon's store: PostgreSQL when --database names
// one, else SQLite in the data dir; and checks that the data dir's
// sandboxes are that store's (recordsFile).
func (d *Daemon) openRecords(ctx context.Context) (Records, error) {
	dir := d.cfg.DataDir
	if d.cfg.Database == "" {
		if err := checkRecords(dir, "sqlite"); err != nil {
			return nil, err
		}
		st, err := sqlite.Open(ctx, filepath.Join(dir, storeFile))
		if err != nil {
			return nil, fmt.Errorf("opening store: %w", err)
		}
		return st, nil
	}
	st, id, err := openHeld(ctx, d.cfg.Database, d.cfg.Node != "")
	if err != nil {
		return nil, fmt.Errorf("opening store: %w", err)
	}
	had, _, err := recordedStore(dir)
	if err == nil {
		err = checkRecords(dir, "postgres "+id)
	}
	if err != nil {
		st.Close()
		return nil, err
	}
	// A data dir whose sandboxes this database kept already: the ones of
	// no node (from before --node) are this node's (see joinCluster).
	d.adopt = had == "postgres "+id
	return st, nil
}

// openHeld opens the PostgreSQL database url names and holds it (see
// postgres.Store.Hold: before anything reads or changes a record, one
// daemon a database; or, asNode, one of a cluster's nodes), and names it
// (postgres.Store.ID).
func openHeld(ctx context.Context, url string, asNode bool) (*postgres.Store, string, error) {
	st, err := postgres.Open(ctx, url)
	if err != nil {
		return nil, "", err
	}
	if asNode {
		err = st.HoldAsNode(ctx)
	} else {
		err = st.Hold(ctx)
	}
	var id string
	if err == nil {
		id, err = st.ID(ctx)
	}
	if err != nil {
		st.Close()
		return nil, "", err
	}
	return st, id, nil
}

// checkRecords refuses a data dir whose sandboxes are another store's
// than want (see recordsFile), and records want in a data dir that says
// nothing yet. A data dir from before the file, with storeFile in it, is
// SQLite's.
func checkRecords(dir, want string) error {
	had, recorded, err := recordedStore(dir)
	if err != nil {
		return err
	}
	if had != "" && had != want {
		return fmt.Errorf("data dir %s keeps its sandboxes' records in %s, and this daemon was given %s: "+
			"it would find none of them and remove their disks as leftovers, so it does not start. "+
			"Start it with the store it had (--database, or none for SQLite), or give it another data dir",
			dir, describeRecords(had), describeRecords(want))
	}
	if had == want && recorded {
		return nil
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, recordsFile), []byte(want+"\n"), 0o600); err != nil {
		return fmt.Errorf("recording the data dir's store: %w", err)
	}
	return nil
}

// recordedStore is the recordsFile line of dir: "sqlite", "postgres ID",
// or "" for a data dir that says nothing yet; recorded tells whether the
// file says it. A data dir from before the file, with storeFile in it, is
// SQLite's.
func recordedStore(dir string) (line string, recorded bool, err error) {
	path := filepath.Join(dir, recordsFile)
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, serr := os.Stat(filepath.Join(dir, storeFile)); serr == nil {
			return "sqlite", false, nil
		}
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("reading %s: %w", path, err)
	}
	return strings.TrimSpace(string(b)), true, nil
}

// describeRecords says in words what a recordsFile line names.
func describeRecords(line string) string {
	if id, ok := strings.CutPrefix(line, "postgres "); ok {
		return "PostgreSQL database " + id
	}
	return "SQLite (" + storeFile + " in the data dir)"
}

// teardownRecords is the store a teardown of cfg's data dir deletes its
// sandboxes' records from: nil for SQLite (its file goes with the data
// dir), or the PostgreSQL database the data dir records, which --database
// must name.
func teardownRecords(ctx context.Context, cfg Config) (*postgres.Store, error) {
	line, _, err := recordedStore(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	id, ok := strings.CutPrefix(line, "postgres ")
	if !ok {
		return nil, nil
	}
	if cfg.Database == "" {
		return nil, fmt.Errorf("its sandboxes' records are in PostgreSQL database %s: pass --database to delete them with it", id)
	}
	// Held: no daemon may run on the database meanwhile; or, for a node
	// of a cluster (--node), as one node among the others, its data dir
	// locked against its own daemon.
	st, given, err := openHeld(ctx, cfg.Database, cfg.Node != "")
	if err != nil {
		return nil, err
	}
	if given != id {
		st.Close()
		return nil, fmt.Errorf("its sandboxes' records are in PostgreSQL database %s, and --database names %s", id, given)
	}
	return st, nil
}
