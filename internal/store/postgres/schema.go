package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migrations are the schema's versions: migrations[i] brings version i to
// i+1. Never change one that has shipped; add another.
//
// Version 1 is the records of package sqlite's latest schema, in
// PostgreSQL's types: times as text to the nanosecond (see timeLayout),
// JSON as text, but a sandbox's labels as jsonb, which a list filters on
// (@>).
var migrations = []string{
	`
CREATE TABLE sandboxes (
	id             TEXT    NOT NULL PRIMARY KEY,
	org            TEXT    NOT NULL,
	name           TEXT    NOT NULL,
	state          TEXT    NOT NULL,
	template       TEXT    NOT NULL,
	image          TEXT    NOT NULL,
	resources      TEXT    NOT NULL,
	env            TEXT    NOT NULL,
	labels         JSONB   NOT NULL,
	idle           TEXT    NOT NULL,
	http_port      INTEGER NOT NULL,
	url            TEXT    NOT NULL,
	from_source    TEXT,
	created_at     TEXT    NOT NULL,
	net_index      INTEGER NOT NULL,
	agent_token    TEXT    NOT NULL,
	checkpoint_seq INTEGER NOT NULL,
	auto_seq       INTEGER NOT NULL,
	error          TEXT    NOT NULL,
	agent_gen      INTEGER NOT NULL,
	restore_target TEXT    NOT NULL,
	secrets        TEXT    NOT NULL,
	secret_files   TEXT    NOT NULL,
	public         BOOLEAN NOT NULL,
	network        TEXT    NOT NULL,
	pool           TEXT    NOT NULL,
	UNIQUE (org, name)
);
CREATE INDEX sandboxes_by_age ON sandboxes (created_at, id);
CREATE INDEX sandboxes_by_org ON sandboxes (org);
CREATE INDEX sandboxes_by_labels ON sandboxes USING GIN (labels);

CREATE TABLE checkpoints (
	seq          BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	sandbox_id   TEXT    NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
	id           TEXT    NOT NULL,
	name         TEXT,
	comment      TEXT    NOT NULL,
	memory       BOOLEAN NOT NULL,
	auto         BOOLEAN NOT NULL,
	created_at   TEXT    NOT NULL,
	sandbox_name TEXT    NOT NULL,
	template     TEXT    NOT NULL,
	image        TEXT    NOT NULL,
	resources    TEXT    NOT NULL,
	agent_token  TEXT    NOT NULL,
	agent_gen    INTEGER NOT NULL,
	inside       BOOLEAN NOT NULL,
	UNIQUE (sandbox_id, id),
	UNIQUE (sandbox_id, name)
);

CREATE TABLE audit (
	seq     BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	time    TEXT   NOT NULL,
	org     TEXT   NOT NULL,
	key     TEXT   NOT NULL,
	action  TEXT   NOT NULL,
	target  TEXT   NOT NULL,
	outcome TEXT   NOT NULL,
	client  TEXT   NOT NULL
);
CREATE INDEX audit_by_time ON audit (time);
CREATE INDEX audit_by_org ON audit (org, seq);

CREATE TABLE images (
	org          TEXT    NOT NULL,
	id           TEXT    NOT NULL,
	ref          TEXT    NOT NULL,
	digest       TEXT    NOT NULL,
	state        TEXT    NOT NULL,
	error        TEXT    NOT NULL,
	size         BIGINT  NOT NULL,
	config       TEXT    NOT NULL,
	template     TEXT    NOT NULL,
	user_missing BOOLEAN NOT NULL,
	created_at   TEXT    NOT NULL,
	PRIMARY KEY (org, id),
	UNIQUE (org, ref)
);

-- API keys, by the sha256 of their secret (never the secret), and orgs
-- with their quotas (api.Quota as JSON).
CREATE TABLE api_keys (
	id           TEXT  NOT NULL PRIMARY KEY,
	org          TEXT  NOT NULL,
	name         TEXT  NOT NULL,
	scope        TEXT  NOT NULL,
	labels       TEXT  NOT NULL,
	hash         BYTEA NOT NULL UNIQUE,
	created_by   TEXT  NOT NULL,
	created_at   TEXT  NOT NULL,
	expires_at   TEXT,
	last_used_at TEXT
);
CREATE INDEX api_keys_by_org ON api_keys (org, created_at, id);

CREATE TABLE orgs (
	name       TEXT NOT NULL PRIMARY KEY,
	quota      TEXT NOT NULL,
	created_at TEXT NOT NULL
);

-- web console sessions, by the sha256 of their cookie
CREATE TABLE console_sessions (
	key        TEXT NOT NULL PRIMARY KEY,
	csrf_token TEXT NOT NULL,
	expires_at TEXT NOT NULL,
	org        TEXT NOT NULL,
	api_key    TEXT NOT NULL
);

-- secrets and registry credentials (sealed by internal/secret)
CREATE TABLE secrets (
	org        TEXT  NOT NULL,
	name       TEXT  NOT NULL,
	sealed     BYTEA NOT NULL,
	created_at TEXT  NOT NULL,
	updated_at TEXT  NOT NULL,
	PRIMARY KEY (org, name)
);
CREATE TABLE registry_credentials (
	org        TEXT  NOT NULL,
	name       TEXT  NOT NULL,
	sealed     BYTEA NOT NULL,
	created_at TEXT  NOT NULL,
	updated_at TEXT  NOT NULL,
	PRIMARY KEY (org, name)
);
`,
	// 2: a sandbox's record has a version, which every update checks and
	// bumps (store.Sandbox.Version), and the node that owns it; the nodes
	// of a cluster, each with its lease (see Nodes); the cluster's own
	// secrets, made by the first node.
	`
ALTER TABLE sandboxes ADD COLUMN version BIGINT NOT NULL DEFAULT 1;
ALTER TABLE sandboxes ADD COLUMN node TEXT NOT NULL DEFAULT '';
CREATE INDEX sandboxes_by_node ON sandboxes (node);

CREATE TABLE nodes (
	name        TEXT        NOT NULL PRIMARY KEY,
	address     TEXT        NOT NULL,
	role        TEXT        NOT NULL,
	epoch       BIGINT      NOT NULL,
	lease_until TIMESTAMPTZ NOT NULL,
	cordoned    BOOLEAN     NOT NULL,
	removed     BOOLEAN     NOT NULL,
	info        TEXT        NOT NULL,
	joined_at   TIMESTAMPTZ NOT NULL,
	renewed_at  TIMESTAMPTZ NOT NULL
);

CREATE TABLE cluster_secrets (
	name       TEXT        NOT NULL PRIMARY KEY,
	value      BYTEA       NOT NULL,
	created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
`,
	// 3: what brings a sandbox back when its node is lost
	// (api.Sandbox.Recover: '' none), and the node a move hands it to
	// (store.Sandbox.Handover: '' none).
	`
ALTER TABLE sandboxes ADD COLUMN recover TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN handover TEXT NOT NULL DEFAULT '';
`,
}

// migrateLock is the advisory lock under which a daemon migrates: the
// others starting at once wait for it, then find nothing left to do.
// (Its value is loam's own: "loam" in ASCII.)
const migrateLock = 0x6c6f616d

// migrate brings the database's schema to len(migrations), in one
// transaction under migrateLock, recording each version applied in
// loam_schema. A database of a newer loam (a version this one does not
// know) is refused, untouched.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrating the schema: %w", unavailable(err))
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrateLock); err != nil {
		return fmt.Errorf("migrating the schema: taking the lock: %w", unavailable(err))
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS loam_schema (
		version    INTEGER NOT NULL PRIMARY KEY,
		applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("migrating the schema: %w", err)
	}
	version, err := schemaVersion(ctx, tx)
	if err != nil {
		return err
	}
	if version > len(migrations) {
		return fmt.Errorf("migrating the schema: the database is at version %d, newer than this loam knows (%d): run a newer loam", version, len(migrations))
	}
	for v := version; v < len(migrations); v++ {
		if _, err := tx.Exec(ctx, migrations[v]); err != nil {
			return fmt.Errorf("migrating the schema to version %d: %w", v+1, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO loam_schema (version) VALUES ($1)`, v+1); err != nil {
			return fmt.Errorf("migrating the schema to version %d: %w", v+1, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrating the schema: %w", unavailable(err))
	}
	return nil
}

// schemaVersion is the newest version loam_schema records, 0 for none.
func schemaVersion(ctx context.Context, q pgx.Tx) (int, error) {
	var v int
	if err := q.QueryRow(ctx, `SELECT COALESCE(max(version), 0) FROM loam_schema`).Scan(&v); err != nil {
		return 0, fmt.Errorf("reading the schema's version: %w", err)
	}
	return v, nil
}
