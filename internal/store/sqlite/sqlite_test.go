package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/storetest"
)

func openTemp(t *testing.T) *Store {
	t.Helper()
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "loam.db"))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func newTemp(t *testing.T) store.Store { return openTemp(t) }

// reopen opens the file of old, which is closed, again.
func reopen(t *testing.T, old store.Store) store.Store {
	s, err := Open(t.Context(), old.(*Store).Path())
	if err != nil {
		t.Fatalf("reopening: %v", err)
	}
	return s
}

func TestStore(t *testing.T) {
	storetest.Run(t, newTemp, storetest.WithReopen(reopen))
}

// TestSecrets: the suite of secrets and registry credentials, which
// package postgres passes too.
func TestSecrets(t *testing.T) {
	storetest.RunSecrets(t, newTemp, func(st store.Store) storetest.Secrets { return st.(*Store).RegistryCredentials() })
}

// TestAudit: the audit log's suite, which package postgres passes too.
func TestAudit(t *testing.T) {
	storetest.RunAudit(t, newTemp)
}

// TestConsoleSessions: the console sessions' suite, across a reopen;
// package postgres passes it too.
func TestConsoleSessions(t *testing.T) {
	storetest.RunConsoleSessions(t, newTemp, storetest.WithReopen(reopen))
}

// TestPragmas checks the settings durability and integrity rest on, on the
// connections that use them.
func TestPragmas(t *testing.T) {
	ctx := t.Context()
	s := openTemp(t)
	defer s.Close()
	tests := []struct {
		db     *sql.DB
		pragma string
		want   string
	}{
		{s.w, "journal_mode", "wal"},
		{s.w, "synchronous", "2"}, // FULL
		{s.w, "foreign_keys", "1"},
		{s.w, "busy_timeout", fmt.Sprint(busyTimeoutMS)},
		{s.w, "query_only", "0"},
		{s.r, "journal_mode", "wal"},
		{s.r, "foreign_keys", "1"},
		{s.r, "busy_timeout", fmt.Sprint(busyTimeoutMS)},
		{s.r, "query_only", "1"},
	}
	for _, tc := range tests {
		pool := "writer"
		if tc.db == s.r {
			pool = "reader"
		}
		var got string
		if err := tc.db.QueryRowContext(ctx, "PRAGMA "+tc.pragma).Scan(&got); err != nil {
			t.Fatalf("%s: PRAGMA %s: %v", pool, tc.pragma, err)
		}
		if got != tc.want {
			t.Errorf("%s: PRAGMA %s = %s, want %s", pool, tc.pragma, got, tc.want)
		}
	}
	if _, err := s.r.ExecContext(ctx, `DELETE FROM sandboxes`); err == nil {
		t.Errorf("a reader connection could write")
	}
}

// TestMigrate checks that a new file gets the current schema, and that
// migrating again, by Open or directly, changes nothing and keeps the data.
func TestMigrate(t *testing.T) {
	ctx := t.Context()
	s := openTemp(t)
	path := s.Path()
	checkVersion(t, s)
	sb := &store.Sandbox{Sandbox: api.Sandbox{ID: "sb-1", Name: "one", CreatedAt: store.Now()}}
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	schema := schemaOf(t, s)
	if err := migrate(ctx, s.w); err != nil {
		t.Fatalf("migrating a current database: %v", err)
	}
	checkVersion(t, s)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	for range 2 {
		s, err := Open(ctx, path)
		if err != nil {
			t.Fatalf("reopening: %v", err)
		}
		checkVersion(t, s)
		if got := schemaOf(t, s); got != schema {
			t.Errorf("schema changed on reopen:\n got %s\nwant %s", got, schema)
		}
		if _, err := s.GetSandbox(ctx, "", "one"); err != nil {
			t.Errorf("GetSandbox after reopen: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
}

// TestMigrateRefusesNewer: a file from a newer loam is left alone rather
// than misread.
func TestMigrateRefusesNewer(t *testing.T) {
	ctx := t.Context()
	s := openTemp(t)
	path := s.Path()
	newer := len(migrations) + 1
	if _, err := s.w.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", newer)); err != nil {
		t.Fatalf("setting user_version: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	_, err := Open(ctx, path)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("version %d", newer)) {
		t.Fatalf("Open of a version %d file: got %v, want an error naming the version", newer, err)
	}
}

// TestOddPath: the path is a file name, not a URI, whatever it holds.
func TestOddPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a dir?with#odd%20chars&_pragma=x")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "loam.db")
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open(%q): %v", path, err)
	}
	defer s.Close()
	if err := s.CreateSandbox(t.Context(), &store.Sandbox{Sandbox: api.Sandbox{ID: "sb-1", Name: "one"}}); err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("database file not at the path given: %v", err)
	}
}

func TestOpenMissingDir(t *testing.T) {
	_, err := Open(t.Context(), filepath.Join(t.TempDir(), "missing", "loam.db"))
	if err == nil {
		t.Fatal("Open in a missing directory succeeded")
	}
}

// TestCrash kills a process that wrote to the store without closing it: every
// write whose call had returned must be there for the next Open. (Power loss
// cannot be tested here; TestPragmas checks synchronous=FULL, which covers
// it.)
func TestCrash(t *testing.T) {
	if os.Getenv("LOAM_STORE_CRASH_PATH") != "" {
		crashHelper()
		return
	}
	path := filepath.Join(t.TempDir(), "loam.db")
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestCrash$")
	cmd.Env = append(os.Environ(), "LOAM_STORE_CRASH_PATH="+path)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("helper: got %v, want death by SIGKILL; output:\n%s", err, out)
	}

	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open after crash: %v", err)
	}
	defer s.Close()
	list, err := s.ListSandboxes(t.Context(), store.Filter{})
	if err != nil || len(list) != crashSandboxes {
		t.Fatalf("ListSandboxes after crash: %d sandboxes, %v; want %d", len(list), err, crashSandboxes)
	}
	for _, sb := range list {
		cps, err := s.ListCheckpoints(t.Context(), sb.ID)
		if err != nil || len(cps) != 1 {
			t.Errorf("ListCheckpoints(%s) after crash: %d, %v; want 1", sb.ID, len(cps), err)
		}
	}
}

const crashSandboxes = 5

// crashHelper is the process TestCrash kills: it writes, then dies without
// closing anything.
func crashHelper() {
	ctx := context.Background()
	s, err := Open(ctx, os.Getenv("LOAM_STORE_CRASH_PATH"))
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	for i := range crashSandboxes {
		sb := &store.Sandbox{Sandbox: api.Sandbox{ID: fmt.Sprint("sb-", i), Name: fmt.Sprint("box-", i), CreatedAt: time.Now()}}
		if err := s.CreateSandbox(ctx, sb); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		cp := &store.Checkpoint{Checkpoint: api.Checkpoint{ID: "v1", Sandbox: sb.ID}, AgentGen: 1}
		if err := s.CreateCheckpoint(ctx, cp); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
	}
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

func checkVersion(t *testing.T, s *Store) {
	t.Helper()
	var v int
	if err := s.w.QueryRowContext(t.Context(), "PRAGMA user_version").Scan(&v); err != nil {
		t.Fatalf("reading user_version: %v", err)
	}
	if v != len(migrations) {
		t.Errorf("user_version = %d, want %d", v, len(migrations))
	}
}

// schemaOf is the database's schema as SQLite keeps it, one line per object.
func schemaOf(t *testing.T, s *Store) string {
	t.Helper()
	rows, err := s.r.QueryContext(t.Context(), `SELECT type, name, coalesce(sql, '') FROM sqlite_schema ORDER BY type, name`)
	if err != nil {
		t.Fatalf("reading schema: %v", err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var typ, name, text string
		if err := rows.Scan(&typ, &name, &text); err != nil {
			t.Fatalf("reading schema: %v", err)
		}
		fmt.Fprintf(&b, "%s %s %s\n", typ, name, text)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("reading schema: %v", err)
	}
	return b.String()
}

// TestFileModes: the database and its WAL are the owner's alone, also when
// an older loam left them readable by all.
func TestFileModes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "loam.db")
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.WriteFile(path+suffix, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(path); err != nil { // a fresh file, but WAL leftovers
		t.Fatal(err)
	}
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	if err := s.CreateSandbox(t.Context(), &store.Sandbox{Sandbox: api.Sandbox{ID: "sb-1", Name: "a", CreatedAt: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"", "-wal", "-shm"} {
		st, err := os.Stat(path + suffix)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", filepath.Base(path+suffix), st.Mode().Perm())
		}
	}
}

// TestMigrateFromVersion1: records written by schema version 1, which kept
// agent tokens in clear and checkpoint paths, come back with the token as
// the legacy one, generation 0, and no restore in progress.
func TestMigrateFromVersion1(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "loam.db")
	db, err := sql.Open("sqlite", dsn(path, false))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{migrations[0], "PRAGMA user_version = 1",
		`INSERT INTO sandboxes VALUES ('sb-1', 'old', 'running', 'base', '', '{}', '{}', '{}', '', 8080, '', NULL,
			'2026-01-01T00:00:00.000000000Z', 3, 'clear-token', 1, 0, '')`,
		`INSERT INTO checkpoints (sandbox_id, id, name, comment, memory, auto, created_at, sandbox_name, template,
			image, resources, agent_token, dir) VALUES ('sb-1', 'v1', NULL, '', 1, 0, '2026-01-01T00:00:00.000000000Z',
			'old', 'base', '', '{}', 'cp-token', '/var/lib/loam/checkpoints/sb-1/v1')`,
	} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	checkVersion(t, s)
	sb, err := s.GetSandbox(ctx, "", "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if sb.LegacyAgentToken != "clear-token" || sb.AgentGen != 0 || sb.RestoreTarget != "" || sb.NetIndex != 3 {
		t.Errorf("migrated sandbox = %+v", sb)
	}
	cp, err := s.GetCheckpoint(ctx, "sb-1", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if cp.LegacyAgentToken != "cp-token" || cp.AgentGen != 0 || cp.Inside {
		t.Errorf("migrated checkpoint = %+v", cp)
	}
}

func TestImages(t *testing.T) {
	storetest.RunImages(t, newTemp)
}

func TestKeys(t *testing.T) {
	storetest.RunKeys(t, func(t *testing.T) store.Store { return openTemp(t) })
}

func TestOrgs(t *testing.T) {
	storetest.RunOrgs(t, func(t *testing.T) store.Store { return openTemp(t) }, storetest.SealedByMethods)
}
