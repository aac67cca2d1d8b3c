package postgres

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
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

func newStore(t *testing.T) store.Store { return openNew(t) }

// openAgain opens the database of st (open or closed) again: a reopen,
// or a second node's store on it.
func openAgain(t *testing.T, st *Store) *Store {
	t.Helper()
	u, _ := urls.Load(st)
	s, err := Open(t.Context(), u.(string))
	if err != nil {
		t.Fatalf("opening the database again: %v", err)
	}
	return s
}

// reopen opens the database of old, which is closed, again.
func reopen(t *testing.T, old store.Store) store.Store { return openAgain(t, old.(*Store)) }

// TestStore: the store suite package sqlite passes, on a real PostgreSQL.
func TestStore(t *testing.T) {
	storetest.Run(t, newStore, storetest.WithReopen(reopen), storetest.WithPeer(peer))
}

// peer opens a second store on the database of st, as a second node does.
func peer(t *testing.T, st store.Store) store.Store { return openAgain(t, st.(*Store)) }

// TestImages: the image records' suite package sqlite passes.
func TestImages(t *testing.T) {
	storetest.RunImages(t, newStore)
}

// credentials is the registry credentials' table of st.
func credentials(st store.Store) storetest.Secrets { return st.(*Store).RegistryCredentials() }

// TestSecrets: the suite of secrets and registry credentials package
// sqlite passes.
func TestSecrets(t *testing.T) {
	storetest.RunSecrets(t, newStore, credentials)
}

// TestAudit: the audit log's suite package sqlite passes.
func TestAudit(t *testing.T) {
	storetest.RunAudit(t, newStore)
}

// TestConsoleSessions: the console sessions' suite package sqlite
// passes, across a reopen.
func TestConsoleSessions(t *testing.T) {
	storetest.RunConsoleSessions(t, newStore, storetest.WithReopen(reopen))
}

// TestKeys: the API keys' suite package sqlite passes.
func TestKeys(t *testing.T) {
	storetest.RunKeys(t, func(t *testing.T) store.Store { return openNew(t) })
}

// TestOrgs: the orgs' suite package sqlite passes.
func TestOrgs(t *testing.T) {
	storetest.RunOrgs(t, func(t *testing.T) store.Store { return openNew(t) }, storetest.SealedByMethods)
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
	errs := map[string]error{"get": getErr, "create": createErr}
	_, errs["secret get"] = s.GetSecret(ctx, "default", "tok")
	_, errs["credentials list"] = s.RegistryCredentials().ListSecrets(ctx, "default")
	errs["secret put"] = s.PutSecret(ctx, &store.Secret{Org: "default", Name: "tok", Sealed: []byte{1}, CreatedAt: store.Now(), UpdatedAt: store.Now()})
	_, errs["audit list"] = s.ListAudit(ctx, store.AuditFilter{})
	errs["audit append"] = s.AppendAudit(ctx, api.AuditEvent{Time: store.Now(), Org: "default", Action: "sandbox.exec"})
	errs["audit outcome"] = s.SetAuditOutcome(ctx, 1, "internal")
	_, errs["audit prune"] = s.PruneAudit(ctx, store.Now())
	_, errs["console list"] = s.ListConsoleSessions(ctx, store.Now())
	for what, err := range errs {
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

// icuStores returns a newStore whose stores are each on a new database
// whose collation is ICU's en-US, not the byte order of the test server's
// C.UTF-8: in en-US "a" sorts before "B", and "_" before "-" (ASCII has
// them the other way). The databases are made and dropped from one of
// pgtest's, which t keeps until its end.
func icuStores(t *testing.T) func(t *testing.T) store.Store {
	u, err := url.Parse(pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	base, prefix := u.String(), strings.TrimPrefix(u.Path, "/")
	// admin runs sql on the base database; CREATE and DROP DATABASE run
	// outside a transaction, as a statement of its own.
	admin := func(ctx context.Context, sql string) error {
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			return err
		}
		defer c.Close(context.WithoutCancel(ctx))
		_, err = c.Exec(ctx, sql)
		return err
	}
	var n int
	return func(t *testing.T) store.Store {
		t.Helper()
		ctx := t.Context()
		n++
		name := fmt.Sprintf("%s_icu%d", prefix, n)
		if err := admin(ctx, `CREATE DATABASE `+name+` TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'`); err != nil {
			t.Fatalf("making a database of ICU's en-US: %v", err)
		}
		t.Cleanup(func() {
			if err := admin(context.Background(), `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`); err != nil {
				t.Errorf("dropping %s: %v", name, err)
			}
		})
		dbURL := *u
		dbURL.Path = "/" + name
		s, err := Open(ctx, dbURL.String())
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		// Else the tests on it would prove nothing.
		var bytewise bool
		if err := s.pool.QueryRow(ctx, `SELECT 'B' < 'a' AND '-' < '_'`).Scan(&bytewise); err != nil || bytewise {
			s.Close()
			t.Fatalf("the en-US database compares as bytes do (%v, %v)", bytewise, err)
		}
		return s
	}
}

// TestCollation: every list comes in SQLite's order (the bytes of its
// names, ids and times) whatever the database's own collation; the audit
// log's filters on times hold too.
func TestCollation(t *testing.T) {
	newStore := icuStores(t)
	t.Run("Sandboxes", func(t *testing.T) { storetest.Run(t, newStore) })
	t.Run("Images", func(t *testing.T) { storetest.RunImages(t, newStore) })
	t.Run("Keys", func(t *testing.T) { storetest.RunKeys(t, newStore) })
	t.Run("Orgs", func(t *testing.T) { storetest.RunOrgs(t, newStore, storetest.SealedByMethods) })
	t.Run("Secrets", func(t *testing.T) { storetest.RunSecrets(t, newStore, credentials) })
	t.Run("Audit", func(t *testing.T) { storetest.RunAudit(t, newStore) })
	t.Run("ConsoleSessions", func(t *testing.T) { storetest.RunConsoleSessions(t, newStore) })
}

// TestAuditCommitOrder: audit records commit in the order of their seqs,
// as SQLite's do. While a transaction holds a record not yet committed, a
// later record waits for it; were it committed first, a reader paging
// with since_seq past its seq would never see the earlier one.
func TestAuditCommitOrder(t *testing.T) {
	s := openNew(t)
	ctx := t.Context()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	first, err := insertAudit(ctx, tx, api.AuditEvent{Time: store.Now(), Org: "default", Action: "first"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- s.AppendAudit(ctx, api.AuditEvent{Time: store.Now(), Org: "default", Action: "second"})
	}()
	select {
	case err := <-done:
		t.Fatalf("a record committed (%v) while one before it had not", err)
	case <-time.After(300 * time.Millisecond):
	}
	if list, err := s.ListAudit(ctx, store.AuditFilter{}); err != nil || len(list) != 0 {
		t.Errorf("the log while its first record is not committed: %+v, %v; want none", list, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the second record: %v", err)
	}
	list, err := s.ListAudit(ctx, store.AuditFilter{})
	if err != nil || len(list) != 2 || list[0].Seq != first || list[0].Action != "first" || list[1].Seq <= first {
		t.Errorf("the log: %+v, %v; want first (seq %d), then second", list, err, first)
	}
}
