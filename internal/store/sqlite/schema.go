package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"loam.dev/loam/internal/store/columns"
)

// migrations are the schema's steps: migrations[i] brings a database from
// user_version i to i+1. A step that has shipped is never edited, since files
// in the field already ran it; a change is a new step at the end.
var migrations = []string{
	// 1: sandboxes and their checkpoints.
	//
	// created_at is text in timeLayout: fixed width, so it sorts as it
	// compares, and nanosecond exact. Maps and structs of the API are JSON.
	// A checkpoint without a name has NULL there, since UNIQUE lets NULLs
	// repeat. checkpoints.seq is the rowid: it orders checkpoints as they
	// were created, even two created in the same nanosecond.
	`
CREATE TABLE sandboxes (
	id             TEXT    NOT NULL PRIMARY KEY,
	name           TEXT    NOT NULL UNIQUE,
	state          TEXT    NOT NULL,
	template       TEXT    NOT NULL,
	image          TEXT    NOT NULL,
	resources      TEXT    NOT NULL CHECK (json_valid(resources)),
	env            TEXT    NOT NULL CHECK (json_valid(env)),
	labels         TEXT    NOT NULL CHECK (json_valid(labels)),
	idle           TEXT    NOT NULL,
	http_port      INTEGER NOT NULL,
	url            TEXT    NOT NULL,
	from_source    TEXT             CHECK (from_source IS NULL OR json_valid(from_source)),
	created_at     TEXT    NOT NULL,
	net_index      INTEGER NOT NULL,
	agent_token    TEXT    NOT NULL,
	checkpoint_seq INTEGER NOT NULL,
	auto_seq       INTEGER NOT NULL,
	error          TEXT    NOT NULL
) STRICT;

CREATE INDEX sandboxes_by_age ON sandboxes (created_at, id);

CREATE TABLE checkpoints (
	seq          INTEGER NOT NULL PRIMARY KEY,
	sandbox_id   TEXT    NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
	id           TEXT    NOT NULL,
	name         TEXT,
	comment      TEXT    NOT NULL,
	memory       INTEGER NOT NULL,
	auto         INTEGER NOT NULL,
	created_at   TEXT    NOT NULL,
	sandbox_name TEXT    NOT NULL,
	template     TEXT    NOT NULL,
	image        TEXT    NOT NULL,
	resources    TEXT    NOT NULL CHECK (json_valid(resources)),
	agent_token  TEXT    NOT NULL,
	dir          TEXT    NOT NULL,
	UNIQUE (sandbox_id, id),
	UNIQUE (sandbox_id, name)
) STRICT;
`,
	// 2: agent tokens are derived, not stored; restores in progress are
	// recorded; checkpoints say whether the sandbox itself asked for them.
	//
	// agent_token stays for the sandboxes and checkpoints of version 1, whose
	// agents hold a stored token: it is read once, then cleared. dir stays
	// unread: a checkpoint's data is found from its ids, so the data dir can
	// move.
	`
ALTER TABLE sandboxes ADD COLUMN agent_gen INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN restore_target TEXT NOT NULL DEFAULT '';
ALTER TABLE checkpoints ADD COLUMN agent_gen INTEGER NOT NULL DEFAULT 0;
ALTER TABLE checkpoints ADD COLUMN inside INTEGER NOT NULL DEFAULT 0;
`,
	// 3: secrets: the sealed (AES-GCM) values of secrets, and which of them
	// each sandbox has, by name (JSON maps: env name or file path → secret
	// name), never their values.
	`
CREATE TABLE secrets (
	name       TEXT NOT NULL PRIMARY KEY,
	sealed     BLOB NOT NULL,
	created_at TEXT NOT NULL,
	updated_at TEXT NOT NULL
) STRICT;
ALTER TABLE sandboxes ADD COLUMN secrets TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(secrets));
ALTER TABLE sandboxes ADD COLUMN secret_files TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(secret_files));
`,
	// 4: a sandbox's URL may be public (open to anyone who reaches the
	// daemon); by default it is private.
	`
ALTER TABLE sandboxes ADD COLUMN public INTEGER NOT NULL DEFAULT 0;
`,
	// 5: each sandbox's network policy (api.NetworkPolicy as JSON); the
	// sandboxes of older versions get the default, egress to all.
	`
ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '{"egress":"all","allow":[],"deny":[]}' CHECK (json_valid(network));
`,
	// 6: OCI images (internal/image), one per reference, and registry
	// credentials sealed by internal/secret, kept apart from the secrets
	// sandboxes are given.
	`
CREATE TABLE images (
	id           TEXT    NOT NULL PRIMARY KEY,
	ref          TEXT    NOT NULL UNIQUE,
	digest       TEXT    NOT NULL,
	state        TEXT    NOT NULL,
	error        TEXT    NOT NULL,
	size         INTEGER NOT NULL,
	config       TEXT    NOT NULL CHECK (json_valid(config)),
	template     TEXT    NOT NULL,
	user_missing INTEGER NOT NULL,
	created_at   TEXT    NOT NULL
) STRICT;
CREATE TABLE registry_credentials (
	name       TEXT NOT NULL PRIMARY KEY,
	sealed     BLOB NOT NULL,
	created_at TEXT NOT NULL,
	updated_at TEXT NOT NULL
) STRICT;
`,
	// 7: members of warm pools are sandboxes the API does not show; pool
	// names the pool a member waits in, "" for a user's sandbox.
	`
ALTER TABLE sandboxes ADD COLUMN pool TEXT NOT NULL DEFAULT '';
`,
	// 8: web console sessions, by the sha256 of their cookie.
	`
CREATE TABLE console_sessions (
	key        TEXT NOT NULL PRIMARY KEY,
	csrf_token TEXT NOT NULL,
	expires_at TEXT NOT NULL
) STRICT;
`,
	// 9: API keys (by the sha256 of their secret, never the secret) and
	// the audit log. Both name an org: the daemon's own (--org) for every
	// key and event until there are orgs of their own.
	`
CREATE TABLE api_keys (
	id           TEXT NOT NULL PRIMARY KEY,
	org          TEXT NOT NULL,
	name         TEXT NOT NULL,
	scope        TEXT NOT NULL,
	labels       TEXT NOT NULL CHECK (json_valid(labels)),
	hash         BLOB NOT NULL UNIQUE,
	created_by   TEXT NOT NULL,
	created_at   TEXT NOT NULL,
	expires_at   TEXT,
	last_used_at TEXT
) STRICT;
CREATE INDEX api_keys_by_org ON api_keys (org, created_at, id);

CREATE TABLE audit (
	seq     INTEGER NOT NULL PRIMARY KEY,
	time    TEXT    NOT NULL,
	org     TEXT    NOT NULL,
	key     TEXT    NOT NULL,
	action  TEXT    NOT NULL,
	target  TEXT    NOT NULL,
	outcome TEXT    NOT NULL,
	client  TEXT    NOT NULL
) STRICT;
CREATE INDEX audit_by_time ON audit (time);
CREATE INDEX audit_by_org ON audit (org, seq);
`,
	// 10: orgs with their quotas (api.Quota as JSON), and the org that
	// owns each sandbox. The sandboxes of older versions have none (''):
	// the daemon gives them its own org (--org) when it starts
	// (EnsureOrg), which it cannot name here.
	`
CREATE TABLE orgs (
	name       TEXT NOT NULL PRIMARY KEY,
	quota      TEXT NOT NULL CHECK (json_valid(quota)),
	created_at TEXT NOT NULL
) STRICT;
ALTER TABLE sandboxes ADD COLUMN org TEXT NOT NULL DEFAULT '';
CREATE INDEX sandboxes_by_org ON sandboxes (org);
`,
	// 11: a sandbox's name is unique within its org, not the daemon: the
	// same name in two orgs is two sandboxes. SQLite cannot change a
	// constraint in place, so the table is made again (SQLite's own
	// twelve steps, https://sqlite.org/lang_altertable.html#otheralter):
	// migrate runs this step with foreign keys off, or dropping the old
	// table would delete every checkpoint by cascade, and checks them
	// before it commits.
	`
CREATE TABLE sandboxes_new (
	id             TEXT    NOT NULL PRIMARY KEY,
	name           TEXT    NOT NULL,
	state          TEXT    NOT NULL,
	template       TEXT    NOT NULL,
	image          TEXT    NOT NULL,
	resources      TEXT    NOT NULL CHECK (json_valid(resources)),
	env            TEXT    NOT NULL CHECK (json_valid(env)),
	labels         TEXT    NOT NULL CHECK (json_valid(labels)),
	idle           TEXT    NOT NULL,
	http_port      INTEGER NOT NULL,
	url            TEXT    NOT NULL,
	from_source    TEXT             CHECK (from_source IS NULL OR json_valid(from_source)),
	created_at     TEXT    NOT NULL,
	net_index      INTEGER NOT NULL,
	agent_token    TEXT    NOT NULL,
	checkpoint_seq INTEGER NOT NULL,
	auto_seq       INTEGER NOT NULL,
	error          TEXT    NOT NULL,
	agent_gen      INTEGER NOT NULL DEFAULT 0,
	restore_target TEXT    NOT NULL DEFAULT '',
	secrets        TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(secrets)),
	secret_files   TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(secret_files)),
	public         INTEGER NOT NULL DEFAULT 0,
	network        TEXT    NOT NULL DEFAULT '{"egress":"all","allow":[],"deny":[]}' CHECK (json_valid(network)),
	pool           TEXT    NOT NULL DEFAULT '',
	org            TEXT    NOT NULL DEFAULT '',
	UNIQUE (org, name)
) STRICT;
INSERT INTO sandboxes_new (id, name, state, template, image, resources, env, labels, idle,
	http_port, url, from_source, created_at, net_index, agent_token,
	checkpoint_seq, auto_seq, error, agent_gen, restore_target, secrets, secret_files, public, network, pool, org)
	SELECT id, name, state, template, image, resources, env, labels, idle,
	http_port, url, from_source, created_at, net_index, agent_token,
	checkpoint_seq, auto_seq, error, agent_gen, restore_target, secrets, secret_files, public, network, pool, org
	FROM sandboxes;
DROP TABLE sandboxes;
ALTER TABLE sandboxes_new RENAME TO sandboxes;
CREATE INDEX sandboxes_by_age ON sandboxes (created_at, id);
CREATE INDEX sandboxes_by_org ON sandboxes (org);
`,
	// 12: secrets and registry credentials belong to an org, and a name is
	// unique within it. Those of older versions have none (''): the
	// daemon gives them its own org when it starts (EnsureOrg), as it does
	// the sandboxes. Both tables are made again, their key being (org,
	// name) now; nothing refers to them.
	`
CREATE TABLE secrets_new (
	org        TEXT NOT NULL DEFAULT '',
	name       TEXT NOT NULL,
	sealed     BLOB NOT NULL,
	created_at TEXT NOT NULL,
	updated_at TEXT NOT NULL,
	PRIMARY KEY (org, name)
) STRICT;
INSERT INTO secrets_new (name, sealed, created_at, updated_at)
	SELECT name, sealed, created_at, updated_at FROM secrets;
DROP TABLE secrets;
ALTER TABLE secrets_new RENAME TO secrets;
CREATE TABLE registry_credentials_new (
	org        TEXT NOT NULL DEFAULT '',
	name       TEXT NOT NULL,
	sealed     BLOB NOT NULL,
	created_at TEXT NOT NULL,
	updated_at TEXT NOT NULL,
	PRIMARY KEY (org, name)
) STRICT;
INSERT INTO registry_credentials_new (name, sealed, created_at, updated_at)
	SELECT name, sealed, created_at, updated_at FROM registry_credentials;
DROP TABLE registry_credentials;
ALTER TABLE registry_credentials_new RENAME TO registry_credentials;
`,
	// 13: a console session is the session of the key that logged in;
	// the sessions of older versions were the admin token's ('admin').
	`
ALTER TABLE console_sessions ADD COLUMN org TEXT NOT NULL DEFAULT '';
ALTER TABLE console_sessions ADD COLUMN api_key TEXT NOT NULL DEFAULT 'admin';
`,
	// 14: an image belongs to the org that pulled it, with its own
	// registry credentials; a ref is unique within an org, and an id
	// (the ref's hash) too. Those of older versions have none (''): the
	// daemon gives them its own org when it starts (EnsureOrg). Nothing
	// refers to the table.
	`
CREATE TABLE images_new (
	org          TEXT    NOT NULL DEFAULT '',
	id           TEXT    NOT NULL,
	ref          TEXT    NOT NULL,
	digest       TEXT    NOT NULL,
	state        TEXT    NOT NULL,
	error        TEXT    NOT NULL,
	size         INTEGER NOT NULL,
	config       TEXT    NOT NULL CHECK (json_valid(config)),
	template     TEXT    NOT NULL,
	user_missing INTEGER NOT NULL,
	created_at   TEXT    NOT NULL,
	PRIMARY KEY (org, id),
	UNIQUE (org, ref)
) STRICT;
INSERT INTO images_new (id, ref, digest, state, error, size, config, template, user_missing, created_at)
	SELECT id, ref, digest, state, error, size, config, template, user_missing, created_at FROM images;
DROP TABLE images;
ALTER TABLE images_new RENAME TO images;
`,
	// 15: a sandbox's record has a version, which every update checks
	// and bumps (store.Sandbox.Version), and the name of the node that
	// owns it (store.Sandbox.Node: '' on one machine).
	`
ALTER TABLE sandboxes ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
ALTER TABLE sandboxes ADD COLUMN node TEXT NOT NULL DEFAULT '';
`,
	// 16: what brings a sandbox back when its node is lost
	// (api.Sandbox.Recover: '' none), and the node a move hands it to
	// (store.Sandbox.Handover: '' none).
	`
ALTER TABLE sandboxes ADD COLUMN recover TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN handover TEXT NOT NULL DEFAULT '';
`,
}

// migrate applies the steps the database has not run yet, each in its own
// transaction with the user_version that records it, so a crash mid-step
// leaves the previous version whole. The write connection's transactions
// begin IMMEDIATE: two processes opening a new file at once cannot both run
// a step.
func migrate(ctx context.Context, db *sql.DB) error {
	for {
		done, err := migrateStep(ctx, db)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
	}
}

// migrateStep applies the next step, if any; done is true when the schema
// is already current.
//
// A step runs with foreign keys off, which SQLite allows to change only
// outside a transaction: a step that makes a table again (11) drops the
// old one, which would otherwise delete the rows that refer to it. The
// references are checked before the step commits, and foreign keys are on
// again before the connection goes back to the pool.
func migrateStep(ctx context.Context, db *sql.DB) (done bool, err error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return false, fmt.Errorf("migrating schema: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "PRAGMA foreign_keys = OFF"); err != nil {
		return false, fmt.Errorf("migrating schema: %w", err)
	}
	defer func() {
		if _, onErr := conn.ExecContext(context.WithoutCancel(ctx), "PRAGMA foreign_keys = ON"); onErr != nil && err == nil {
			err = fmt.Errorf("migrating schema: turning foreign keys on again: %w", onErr)
		}
	}()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("migrating schema: %w", err)
	}
	defer tx.Rollback()

	var version int
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return false, fmt.Errorf("reading schema version: %w", err)
	}
	switch {
	case version == len(migrations):
		return true, nil
	case version > len(migrations) || version < 0:
		return false, fmt.Errorf("reading schema version: database is at version %d, this loam knows up to %d", version, len(migrations))
	}
	next := version + 1
	if _, err := tx.ExecContext(ctx, migrations[version]); err != nil {
		return false, fmt.Errorf("migrating schema to version %d: %w", next, err)
	}
	rows, err := tx.QueryContext(ctx, "PRAGMA foreign_key_check")
	if err != nil {
		return false, fmt.Errorf("migrating schema to version %d: checking references: %w", next, err)
	}
	broken := rows.Next()
	rows.Close()
	if broken {
		return false, fmt.Errorf("migrating schema to version %d: a row refers to one that is gone", next)
	}
	// PRAGMA takes no bound parameters; next is an int we made.
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", next)); err != nil {
		return false, fmt.Errorf("migrating schema to version %d: %w", next, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("migrating schema to version %d: %w", next, err)
	}
	return false, nil
}

// formatTime and parseTime keep times as every SQL store does (package
// columns: UTC, to the nanosecond, fixed width so the text sorts as the
// time does).
func formatTime(t time.Time) (string, error) { return columns.FormatTime(t) }

func parseTime(s string) (time.Time, error) { return columns.ParseTime(s) }
