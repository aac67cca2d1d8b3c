package storetest

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// Secrets is what a store that keeps sealed values has (store/sqlite
// does), for its secrets (secret.Records) and alike for its registry
// credentials (its RegistryCredentials table).
type Secrets interface {
	PutSecret(ctx context.Context, sec *store.Secret) error
	GetSecret(ctx context.Context, org, name string) (*store.Secret, error)
	ListSecrets(ctx context.Context, org string) ([]*store.Secret, error)
	DeleteSecret(ctx context.Context, org, name string) error
}

// RunSecrets runs the suite of sealed records on a store's secrets and on
// the registry credentials credentials gives of it (its
// RegistryCredentials(), whose type is each store's own), and checks that
// the two are kept apart. newStore must return a new, empty store that is
// also an Audit, which RunSecrets closes.
func RunSecrets(t *testing.T, newStore func(t *testing.T) store.Store, credentials func(st store.Store) Secrets) {
	tables := []struct {
		name  string
		table func(st store.Store) Secrets
	}{
		{"Secrets", func(st store.Store) Secrets { return st.(Secrets) }},
		{"RegistryCredentials", credentials},
	}
	tests := []struct {
		name string
		fn   func(ctx context.Context, t *testing.T, tab Secrets, log Audit)
	}{
		{"RoundTrip", testSecretRoundTrip},
		{"Replace", testSecretReplace},
		{"ListByName", testSecretListByName},
		{"NotFound", testSecretNotFound},
		{"Orgs", testSecretOrgs},
		{"Audited", testSecretAudited},
	}
	c := &config{newStore: newStore}
	sealed := func(t *testing.T) (store.Store, Audit) {
		t.Helper()
		st := c.open(t)
		if _, ok := st.(Secrets); !ok {
			t.Fatal("the store keeps no secrets")
		}
		log, ok := st.(Audit)
		if !ok {
			t.Fatal("the store keeps no audit log")
		}
		return st, log
	}
	for _, tab := range tables {
		t.Run(tab.name, func(t *testing.T) {
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					st, log := sealed(t)
					tc.fn(t.Context(), t, tab.table(st), log)
				})
			}
		})
	}
	t.Run("Apart", func(t *testing.T) {
		st, _ := sealed(t)
		testSecretsApart(t.Context(), t, st.(Secrets), credentials(st))
	})
}

// newSecret is a record of org with every field set; its sealed bytes are
// not text (a NUL, bytes that are no UTF-8), as AES-GCM's are not.
func newSecret(org, name string, n int) *store.Secret {
	return &store.Secret{
		Org:       org,
		Name:      name,
		Sealed:    []byte{0, 0xff, 0xfe, byte(n), 'x', 0},
		CreatedAt: t0.Add(time.Duration(n) * time.Second),
		UpdatedAt: t0.Add(time.Duration(n)*time.Second + time.Nanosecond),
	}
}

func mustPutSecret(ctx context.Context, t *testing.T, tab Secrets, sec *store.Secret) {
	t.Helper()
	if err := tab.PutSecret(ctx, sec); err != nil {
		t.Fatalf("PutSecret(%s, %s): %v", sec.Org, sec.Name, err)
	}
}

// checkSecret fails t unless got is want: times the same instants, in
// UTC.
func checkSecret(t *testing.T, what string, got, want *store.Secret) {
	t.Helper()
	if got == nil {
		t.Errorf("%s: got nil secret, want %s", what, want.Name)
		return
	}
	if got.Org != want.Org || got.Name != want.Name || !bytes.Equal(got.Sealed, want.Sealed) {
		t.Errorf("%s: got %s/%s sealed %x, want %s/%s sealed %x", what, got.Org, got.Name, got.Sealed, want.Org, want.Name, want.Sealed)
	}
	checkTime(t, what+": created_at", got.CreatedAt, want.CreatedAt)
	checkTime(t, what+": updated_at", got.UpdatedAt, want.UpdatedAt)
}

func secretNames(list []*store.Secret) []string {
	names := []string{}
	for _, sec := range list {
		names = append(names, sec.Name)
	}
	return names
}

func testSecretRoundTrip(ctx context.Context, t *testing.T, tab Secrets, _ Audit) {
	want := newSecret("docs", "db-pass", 1)
	// A time not in UTC comes back as the same instant in UTC.
	want.CreatedAt = want.CreatedAt.In(time.FixedZone("CET", 3600))
	mustPutSecret(ctx, t, tab, want)
	got, err := tab.GetSecret(ctx, "docs", "db-pass")
	if err != nil {
		t.Fatalf("GetSecret: %v", err)
	}
	checkSecret(t, "GetSecret", got, want)
	list, err := tab.ListSecrets(ctx, "docs")
	if err != nil || len(list) != 1 {
		t.Fatalf("ListSecrets: %v, %v; want the one", secretNames(list), err)
	}
	checkSecret(t, "ListSecrets", list[0], want)
	// The records are copies: changing one changes nothing stored.
	got.Sealed[0], list[0].Sealed[0] = 'z', 'z'
	if again, err := tab.GetSecret(ctx, "docs", "db-pass"); err != nil || again.Sealed[0] != 0 {
		t.Errorf("GetSecret after changing a returned record: %+v, %v", again, err)
	}
}

// testSecretReplace: a put of a name in use replaces its sealed value and
// its updated_at, and keeps the created_at it had, whatever the new record
// says.
func testSecretReplace(ctx context.Context, t *testing.T, tab Secrets, _ Audit) {
	first := newSecret("docs", "tok", 1)
	mustPutSecret(ctx, t, tab, first)
	second := newSecret("docs", "tok", 5)
	second.Sealed = []byte("another sealed value")
	mustPutSecret(ctx, t, tab, second)
	got, err := tab.GetSecret(ctx, "docs", "tok")
	if err != nil {
		t.Fatal(err)
	}
	want := *second
	want.CreatedAt = first.CreatedAt
	checkSecret(t, "after a replace", got, &want)
	if list, err := tab.ListSecrets(ctx, "docs"); err != nil || len(list) != 1 {
		t.Errorf("ListSecrets after a replace: %v, %v; want the one", secretNames(list), err)
	}
}

// testSecretListByName: a list is by name, in the order of the names'
// bytes (upper case before lower, "-" before "." before digits before
// "_"), whatever order they were put in; an org without any lists none,
// as an empty list.
func testSecretListByName(ctx context.Context, t *testing.T, tab Secrets, _ Audit) {
	names := []string{"b", "_x", "a_1", "B", "a-1", "a.1", "A", "a1", "a"}
	for i, name := range names {
		mustPutSecret(ctx, t, tab, newSecret("docs", name, i))
	}
	mustPutSecret(ctx, t, tab, newSecret("ops", "other", 0))
	list, err := tab.ListSecrets(ctx, "docs")
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(names)
	slices.Sort(want)
	if got := secretNames(list); !slices.Equal(got, want) {
		t.Errorf("ListSecrets = %v, want %v", got, want)
	}
	for _, sec := range list {
		if sec.Org != "docs" {
			t.Errorf("ListSecrets of docs has %s's %s", sec.Org, sec.Name)
		}
	}
	list, err = tab.ListSecrets(ctx, "none")
	if err != nil || list == nil || len(list) != 0 {
		t.Errorf("ListSecrets of an org without any: %v (nil %v), %v; want an empty list", secretNames(list), list == nil, err)
	}
}

func testSecretNotFound(ctx context.Context, t *testing.T, tab Secrets, _ Audit) {
	_, err := tab.GetSecret(ctx, "docs", "nope")
	wantErr(t, "GetSecret of a missing name", err, store.ErrNotFound)
	wantErr(t, "DeleteSecret of a missing name", tab.DeleteSecret(ctx, "docs", "nope"), store.ErrNotFound)
	mustPutSecret(ctx, t, tab, newSecret("docs", "tok", 1))
	if err := tab.DeleteSecret(ctx, "docs", "tok"); err != nil {
		t.Fatalf("DeleteSecret: %v", err)
	}
	_, err = tab.GetSecret(ctx, "docs", "tok")
	wantErr(t, "GetSecret after a delete", err, store.ErrNotFound)
	wantErr(t, "DeleteSecret again", tab.DeleteSecret(ctx, "docs", "tok"), store.ErrNotFound)
	if list, err := tab.ListSecrets(ctx, "docs"); err != nil || len(list) != 0 {
		t.Errorf("ListSecrets after a delete: %v, %v; want none", secretNames(list), err)
	}
}

// testSecretOrgs: the same name in two orgs is two records, each found,
// listed, replaced and deleted in its own org alone.
func testSecretOrgs(ctx context.Context, t *testing.T, tab Secrets, _ Audit) {
	docs, ops := newSecret("docs", "db", 1), newSecret("ops", "db", 2)
	mustPutSecret(ctx, t, tab, docs)
	mustPutSecret(ctx, t, tab, ops)
	for _, want := range []*store.Secret{docs, ops} {
		got, err := tab.GetSecret(ctx, want.Org, "db")
		if err != nil {
			t.Fatalf("GetSecret in %s: %v", want.Org, err)
		}
		checkSecret(t, "GetSecret in "+want.Org, got, want)
		list, err := tab.ListSecrets(ctx, want.Org)
		if err != nil || len(list) != 1 {
			t.Fatalf("ListSecrets of %s: %v, %v; want its own", want.Org, secretNames(list), err)
		}
		checkSecret(t, "ListSecrets of "+want.Org, list[0], want)
	}
	_, err := tab.GetSecret(ctx, "other", "db")
	wantErr(t, "GetSecret in an org without it", err, store.ErrNotFound)
	wantErr(t, "DeleteSecret in an org without it", tab.DeleteSecret(ctx, "other", "db"), store.ErrNotFound)

	// A replace in one org is not one in the other: ops' record is new.
	ops2 := newSecret("ops", "db", 3)
	ops2.Sealed = []byte("ops again")
	mustPutSecret(ctx, t, tab, ops2)
	if got, err := tab.GetSecret(ctx, "docs", "db"); err != nil {
		t.Fatal(err)
	} else {
		checkSecret(t, "docs' after ops' was replaced", got, docs)
	}
	if err := tab.DeleteSecret(ctx, "ops", "db"); err != nil {
		t.Fatalf("DeleteSecret in ops: %v", err)
	}
	if got, err := tab.GetSecret(ctx, "docs", "db"); err != nil {
		t.Errorf("docs' after ops' was deleted: %v", err)
	} else {
		checkSecret(t, "docs' after ops' was deleted", got, docs)
	}
}

// testSecretAudited: a put or delete is an API call's change, so the
// call's record commits with it, once; a delete that finds nothing writes
// none, and the call's end (Finish) writes it with its outcome.
func testSecretAudited(ctx context.Context, t *testing.T, tab Secrets, log Audit) {
	ev := api.AuditEvent{Time: t0, Org: "docs", Key: "k-1", Action: "secret.put", Target: "secrets/tok", Client: "test"}
	call := store.NewAuditCall(ev, log)
	cctx := store.WithAudit(ctx, call)
	mustPutSecret(cctx, t, tab, newSecret("docs", "tok", 1))
	mustPutSecret(cctx, t, tab, newSecret("docs", "tok", 2))
	got := mustListAudit(ctx, t, log, store.AuditFilter{})
	if len(got) != 1 || got[0].Action != "secret.put" || got[0].Outcome != "ok" {
		t.Fatalf("audit log after two puts of one call: %+v; want its one record, ok", got)
	}
	// The call fails after its change: its record says so.
	if err := call.Finish(cctx, "internal"); err != nil {
		t.Fatalf("Finish: %v", err)
	}

	ev.Action, ev.Target = "secret.delete", "secrets/nope"
	call = store.NewAuditCall(ev, log)
	cctx = store.WithAudit(ctx, call)
	wantErr(t, "DeleteSecret of a missing name", tab.DeleteSecret(cctx, "docs", "nope"), store.ErrNotFound)
	if got := mustListAudit(ctx, t, log, store.AuditFilter{}); len(got) != 1 {
		t.Fatalf("audit log after a delete that deleted nothing: %+v; want no new record", got)
	}
	if err := call.Finish(cctx, "not_found"); err != nil {
		t.Fatalf("Finish: %v", err)
	}

	// A delete that deletes is the call's change: the record goes with it.
	ev.Target = "secrets/tok"
	call = store.NewAuditCall(ev, log)
	cctx = store.WithAudit(ctx, call)
	if err := tab.DeleteSecret(cctx, "docs", "tok"); err != nil {
		t.Fatalf("DeleteSecret: %v", err)
	}
	if got := mustListAudit(ctx, t, log, store.AuditFilter{}); len(got) != 3 || got[2].Target != "secrets/tok" || got[2].Outcome != "ok" {
		t.Fatalf("audit log after a delete: %+v; want its record with it", got)
	}
	if err := call.Finish(cctx, "ok"); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	got = mustListAudit(ctx, t, log, store.AuditFilter{})
	want := []string{"secret.put secrets/tok internal", "secret.delete secrets/nope not_found", "secret.delete secrets/tok ok"}
	var have []string
	for _, ev := range got {
		have = append(have, ev.Action+" "+ev.Target+" "+ev.Outcome)
	}
	if !slices.Equal(have, want) {
		t.Errorf("audit log at the end: %q, want %q", have, want)
	}
}

// testSecretsApart: a store's secrets and its registry credentials are two
// tables: one name in each is two records, neither listed, found or
// deleted as the other.
func testSecretsApart(ctx context.Context, t *testing.T, secrets, creds Secrets) {
	sec, cred := newSecret("docs", "ghcr.io", 1), newSecret("docs", "ghcr.io", 2)
	cred.Sealed = []byte("a registry's password, sealed")
	mustPutSecret(ctx, t, secrets, sec)
	mustPutSecret(ctx, t, creds, cred)
	mustPutSecret(ctx, t, creds, newSecret("docs", "docker.io", 3))
	if got, err := secrets.GetSecret(ctx, "docs", "ghcr.io"); err != nil {
		t.Fatal(err)
	} else {
		checkSecret(t, "the secret", got, sec)
	}
	if got, err := creds.GetSecret(ctx, "docs", "ghcr.io"); err != nil {
		t.Fatal(err)
	} else {
		checkSecret(t, "the credential", got, cred)
	}
	if list, err := secrets.ListSecrets(ctx, "docs"); err != nil || !slices.Equal(secretNames(list), []string{"ghcr.io"}) {
		t.Errorf("ListSecrets: %v, %v; want the secret alone, no credential", secretNames(list), err)
	}
	_, err := secrets.GetSecret(ctx, "docs", "docker.io")
	wantErr(t, "GetSecret of a credential's name", err, store.ErrNotFound)
	wantErr(t, "DeleteSecret of a credential's name", secrets.DeleteSecret(ctx, "docs", "docker.io"), store.ErrNotFound)
	if err := secrets.DeleteSecret(ctx, "docs", "ghcr.io"); err != nil {
		t.Fatal(err)
	}
	if got, err := creds.GetSecret(ctx, "docs", "ghcr.io"); err != nil {
		t.Errorf("the credential after the secret of its name was deleted: %v", err)
	} else {
		checkSecret(t, "the credential after the secret was deleted", got, cred)
	}
	if list, err := creds.ListSecrets(ctx, "docs"); err != nil || !slices.Equal(secretNames(list), []string{"docker.io", "ghcr.io"}) {
		t.Errorf("the credentials: %v, %v; want both", secretNames(list), err)
	}
}
