package daemon

import (
	"context"
	"fmt"
	"path/filepath"

	"loam.dev/loam/internal/audit"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/console"
	"loam.dev/loam/internal/image"
	"loam.dev/loam/internal/sandbox"
	"loam.dev/loam/internal/secret"
	"loam.dev/loam/internal/server"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/sqlite"
)

// Records is every record the daemon keeps, in one store: SQLite in the
// data dir (the default, one machine). Each part is the interface of the
// package that uses it, so the daemon asks of a store exactly what its
// parts do.
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

var _ Records = (*sqlite.Store)(nil)

// openRecords opens the daemon's store: SQLite in the data dir.
func (d *Daemon) openRecords(ctx context.Context) (Records, error) {
	st, err := sqlite.Open(ctx, filepath.Join(d.cfg.DataDir, storeFile))
	if err != nil {
		return nil, fmt.Errorf("opening store: %w", err)
	}
	return st, nil
}
