package postgres

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/columns"
	"loam.dev/loam/internal/store/postgres/pgtest"
	"loam.dev/loam/internal/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// urls remembers the database of each store a test opened, for Reopen.
var urls sync.Map // *Store -> string

func openNew(t *testing.T) *Store {
	t.Helper()
	url := pgtest.NewDatabase(t)
	s, err := Open(t.Context(), url)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	urls.Store(s, url)
	return s
}

// TestStore: the store suite package sqlite passes, on a real PostgreSQL.
func TestStore(t *testing.T) {
	storetest.Run(t,
		func(t *testing.T) store.Store { return openNew(t) },
		storetest.WithReopen(func(t *testing.T, old store.Store) store.Store {
			url, _ := urls.Load(old.(*Store))
			s, err := Open(t.Context(), url.(string))
			if err != nil {
				t.Fatalf("reopening: %v", err)
			}
			return s
		}))
}

// TestImages: the image records' suite package sqlite passes.
func TestImages(t *testing.T) {
	storetest.RunImages(t, func(t *testing.T) store.Store { return openNew(t) })
}

// TestKeys: the API keys' suite package sqlite passes.
func TestKeys(t *testing.T) {
	storetest.RunKeys(t, func(t *testing.T) store.Store { return openNew(t) })
}

// TestOrgs: the orgs' suite package sqlite passes.
func TestOrgs(t *testing.T) {
	storetest.RunOrgs(t, func(t *testing.T) store.Store { return openNew(t) }, sealedTables)
}

// TestOrgsByBytes: orgs are listed by the bytes of their names, as
// SQLite lists them, also in a database whose collation orders text
// otherwise (glibc's en_US.UTF-8 skips '-', putting "ab" before "a-c"):
// here the column's collation is ICU's with punctuation skipped, which
// orders as that one does.
func TestOrgsByBytes(t *testing.T) {
	s := openNew(t)
	defer s.Close()
	ctx := t.Context()
	for _, q := range []string{
		`CREATE COLLATION skip_punct (provider = icu, locale = 'en-US-u-ka-shifted')`,
		`ALTER TABLE orgs ALTER COLUMN name TYPE TEXT COLLATE skip_punct`,
	} {
		if _, err := s.pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, org := range []string{"ab", "a-c", "a9"} {
		if err := s.CreateOrg(ctx, org); err != nil {
			t.Fatal(err)
		}
	}
	list, err := s.ListOrgs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range list {
		got = append(got, o.Name)
	}
	if want := []string{"a-c", "a9", "ab"}; !slices.Equal(got, want) {
		t.Errorf("ListOrgs: %v, want %v", got, want)
	}
}

// sealedTables reaches the secrets and registry credentials in SQL: the
// store has no methods of its own for them yet.
var sealedTables = storetest.Sealed{
	Put: func(ctx context.Context, st store.Store, table, org, name string) error {
		at, err := columns.FormatTime(store.Now())
		if err != nil {
			return err
		}
		// table is one of the suite's two names, never input.
		_, err = st.(*Store).pool.Exec(ctx, `INSERT INTO `+table+` (org, name, sealed, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $4)`, org, name, []byte("sealed "+name), at)
		return err
	},
	Names: func(ctx context.Context, st store.Store, table, org string) ([]string, error) {
		rows, err := st.(*Store).pool.Query(ctx, `SELECT name FROM `+table+` WHERE org = $1 ORDER BY name`, org)
		if err != nil {
			return nil, err
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if names == nil {
			names = []string{}
		}
		return names, err
	},
}

// TestMigrateAtOnce: daemons starting at once against one new database
// migrate it once: every Open succeeds and the schema's versions are
// recorded once each.
func TestMigrateAtOnce(t *testing.T) {
	url := pgtest.NewDatabase(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := Open(context.Background(), url)
			if err == nil {
				s.Close()
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("an Open racing others: %v", err)
		}
	}
	s, err := Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var rows, newest int
	if err := s.pool.QueryRow(t.Context(), `SELECT count(*), max(version) FROM loam_schema`).Scan(&rows, &newest); err != nil {
		t.Fatal(err)
	}
	if rows != len(migrations) || newest != len(migrations) {
		t.Errorf("loam_schema holds %d versions, the newest %d; want each of %d once", rows, newest, len(migrations))
	}
}

// TestMigrateRefusesNewer: a database a newer loam migrated is refused,
// untouched, with a message that says so.
func TestMigrateRefusesNewer(t *testing.T) {
	url := pgtest.NewDatabase(t)
	s, err := Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(t.Context(), `INSERT INTO loam_schema (version) VALUES ($1)`, len(migrations)+1); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := Open(t.Context(), url); err == nil || !strings.Contains(err.Error(), "newer than this loam knows") {
		t.Errorf("Open of a newer database: %v, want it refused", err)
	}
}

// TestUnavailable: while the server is away, the store's calls answer the
// API's unavailable, saying the database is not reachable, and nothing
// else; once it is back they work again, and no acknowledged write is
// lost.
func TestUnavailable(t *testing.T) {
	s := openNew(t)
	ctx := t.Context()
	sb := &store.Sandbox{}
	sb.ID, sb.Name, sb.Org, sb.State, sb.CreatedAt = "sb-1", "one", "default", api.StateRunning, store.Now()
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	srv := pgtest.Shared()
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			if err := srv.Start(); err != nil {
				t.Errorf("starting the server again: %v", err)
			}
		}
	}()
	_, getErr := s.GetSandbox(ctx, "", "sb-1")
	sb2 := *sb
	sb2.ID, sb2.Name = "sb-2", "two"
	createErr := s.CreateSandbox(ctx, &sb2)
	for what, err := range map[string]error{"get": getErr, "create": createErr} {
		if !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "the database is not reachable") {
			t.Errorf("a %s with the database away: %v, want unavailable", what, err)
		}
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	got, err := s.GetSandbox(ctx, "", "sb-1")
	if err != nil || got.Name != "one" {
		t.Fatalf("the sandbox written before the restart: %+v, %v", got, err)
	}
	if err := s.CreateSandbox(ctx, &sb2); err != nil {
		t.Errorf("a create once the database is back: %v", err)
	}
}

// noWriter is an AuditWriter that must not be asked: the store writes the
// call's record with its change.
type noWriter struct{ t *testing.T }

func (w noWriter) AppendAudit(context.Context, api.AuditEvent) error {
	w.t.Error("AppendAudit called: the record should have gone with the change")
	return nil
}
func (w noWriter) SetAuditOutcome(context.Context, int64, string) error { return nil }

// TestAuditWithTheChange: a call's audit record is written in the
// transaction of its change, once; a write that fails (a name in use)
// writes none and leaves the record to the call.
func TestAuditWithTheChange(t *testing.T) {
	s := openNew(t)
	ctx := t.Context()
	count := func() int {
		t.Helper()
		var n int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM audit WHERE action = 'sandbox.create'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	ev := api.AuditEvent{Time: store.Now(), Org: "default", Key: "admin", Action: "sandbox.create", Target: "sandboxes/one", Outcome: "ok"}
	call := store.NewAuditCall(ev, noWriter{t})
	sb := &store.Sandbox{}
	sb.ID, sb.Name, sb.Org, sb.State, sb.CreatedAt = "sb-1", "one", "default", api.StateRunning, store.Now()
	if err := s.CreateSandbox(store.WithAudit(ctx, call), sb); err != nil {
		t.Fatal(err)
	}
	sb.State = api.StateSleeping
	if err := s.UpdateSandbox(store.WithAudit(ctx, call), sb); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 1 {
		t.Errorf("%d records of the create, want 1 (written once, with the first change)", n)
	}
	again := store.NewAuditCall(ev, nil)
	dup := *sb
	dup.ID = "sb-2"
	if err := s.CreateSandbox(store.WithAudit(ctx, again), &dup); !errors.Is(err, store.ErrExists) {
		t.Fatalf("a create of a name in use: %v", err)
	}
	if n := count(); n != 1 {
		t.Errorf("%d records after a create that failed, want still 1", n)
	}
}
