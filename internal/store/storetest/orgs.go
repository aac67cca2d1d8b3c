package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// Orgs is what a store that keeps orgs has (internal/sandbox's OrgStore).
type Orgs interface {
	EnsureOrg(ctx context.Context, org string) error
	CreateOrg(ctx context.Context, org string) error
	DeleteOrg(ctx context.Context, org string, secrets bool) error
	GetOrg(ctx context.Context, name string) (*store.Org, error)
	ListOrgs(ctx context.Context) ([]*store.Org, error)
	SetQuota(ctx context.Context, org string, q api.Quota) error
	CheckpointUse(ctx context.Context, org string) (count, memoryMiB int, err error)
}

// orgStore is the store the org suite drives: an org owns its sandboxes
// (and their checkpoints), keys and images, which its tests make.
type orgStore interface {
	store.Store
	Orgs
	Keys
	Images
}

// Sealed reaches a store's tables of sealed values, secrets and
// registry_credentials, which the org suite needs to fill and count but
// whose methods are no part of it (internal/secret's): each store's test
// says how, with its own methods or SQL.
type Sealed struct {
	// Put stores a value named name in org, in table.
	Put func(ctx context.Context, st store.Store, table, org, name string) error
	// Names lists the names of org's values in table.
	Names func(ctx context.Context, st store.Store, table, org string) ([]string, error)
}

// SealedByMethods is Sealed through a store's own methods for its sealed
// tables: the secrets' (store.Sealed) and its RegistryCredentials(), as
// both SQL stores have them.
var SealedByMethods = Sealed{
	Put: func(ctx context.Context, st store.Store, table, org, name string) error {
		now := store.Now()
		return sealedTable(st, table).PutSecret(ctx, &store.Secret{Org: org, Name: name, Sealed: []byte("sealed " + name), CreatedAt: now, UpdatedAt: now})
	},
	Names: func(ctx context.Context, st store.Store, table, org string) ([]string, error) {
		list, err := sealedTable(st, table).ListSecrets(ctx, org)
		names := []string{}
		for _, sec := range list {
			names = append(names, sec.Name)
		}
		return names, err
	},
}

// sealedStore is a store with both sealed tables.
type sealedStore interface {
	store.Sealed
	RegistryCredentials() store.Sealed
}

func sealedTable(st store.Store, table string) store.Sealed {
	s := st.(sealedStore)
	if table == "registry_credentials" {
		return s.RegistryCredentials()
	}
	return s
}

// sealedTables are the tables Sealed reaches.
var sealedTables = []string{"secrets", "registry_credentials"}

// RunOrgs runs the suite of orgs; newStore must return a new, empty
// store, which RunOrgs closes, and sealed reaches its sealed values.
func RunOrgs(t *testing.T, newStore func(t *testing.T) store.Store, sealed Sealed) {
	tests := []struct {
		name string
		fn   func(ctx context.Context, t *testing.T, st orgStore, sealed sealedOf)
	}{
		{"Create", testOrgCreate},
		{"GetNotFound", testOrgGetNotFound},
		{"ListOrder", testOrgListOrder},
		{"Quota", testOrgQuota},
		{"Ensure", testOrgEnsure},
		{"EnsureAdopts", testOrgEnsureAdopts},
		{"DeleteNotEmpty", testOrgDeleteNotEmpty},
		{"DeleteSecrets", testOrgDeleteSecrets},
		{"DeleteEverything", testOrgDeleteEverything},
		{"DeleteNotFound", testOrgDeleteNotFound},
		{"CheckpointUse", testOrgCheckpointUse},
		{"Audit", testOrgAudit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := openAs[orgStore](t, newStore, "orgs, keys or images")
			tc.fn(t.Context(), t, st, sealedOf{sealed, st, t})
		})
	}
}

// sealedOf is Sealed on one store, failing its test on an error.
type sealedOf struct {
	Sealed
	st store.Store
	t  *testing.T
}

func (s sealedOf) put(ctx context.Context, table, org, name string) {
	s.t.Helper()
	if err := s.Put(ctx, s.st, table, org, name); err != nil {
		s.t.Fatalf("putting %s %s of org %q: %v", table, name, org, err)
	}
}

func (s sealedOf) names(ctx context.Context, table, org string) []string {
	s.t.Helper()
	names, err := s.Names(ctx, s.st, table, org)
	if err != nil {
		s.t.Fatalf("listing %s of org %q: %v", table, org, err)
	}
	return names
}

func mustCreateOrg(ctx context.Context, t *testing.T, st Orgs, org string) {
	t.Helper()
	if err := st.CreateOrg(ctx, org); err != nil {
		t.Fatalf("CreateOrg(%s): %v", org, err)
	}
}

func mustGetOrg(ctx context.Context, t *testing.T, st Orgs, org string) *store.Org {
	t.Helper()
	o, err := st.GetOrg(ctx, org)
	if err != nil {
		t.Fatalf("GetOrg(%s): %v", org, err)
	}
	return o
}

func orgNames(list []*store.Org) []string {
	names := []string{}
	for _, o := range list {
		names = append(names, o.Name)
	}
	return names
}

// orgSandbox is newSandbox(n) of org, in pool ("" for a user's).
func orgSandbox(n int, org, pool string) *store.Sandbox {
	sb := newSandbox(n)
	sb.Org, sb.Pool = org, pool
	return sb
}

// orgImage is newImage(n) of org.
func orgImage(n int, org string) *store.Image {
	im := newImage(n)
	im.Org = org
	return im
}

func ptr[T any](v T) *T { return &v }

// testOrgCreate: a new org has no quota and was made now, in UTC; a
// second of its name is ErrExists and leaves the first as it was.
func testOrgCreate(ctx context.Context, t *testing.T, st orgStore, _ sealedOf) {
	before := store.Now()
	mustCreateOrg(ctx, t, st, "docs")
	after := store.Now()
	o := mustGetOrg(ctx, t, st, "docs")
	if o.Name != "docs" || !reflect.DeepEqual(o.Quota, api.Quota{}) {
		t.Errorf("GetOrg of a new org: %+v, want docs with no quota", o)
	}
	if o.CreatedAt.Before(before) || o.CreatedAt.After(after) || o.CreatedAt.Location() != time.UTC {
		t.Errorf("created_at %s, want between %s and %s, in UTC", o.CreatedAt, before, after)
	}
	if err := st.SetQuota(ctx, "docs", api.Quota{Sandboxes: ptr(3)}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateOrg(ctx, "docs"); !errorsIs(err, store.ErrExists) {
		t.Errorf("CreateOrg of a name in use: %v, want ErrExists", err)
	}
	again := mustGetOrg(ctx, t, st, "docs")
	if !again.CreatedAt.Equal(o.CreatedAt) || again.Quota.Sandboxes == nil || *again.Quota.Sandboxes != 3 {
		t.Errorf("the org after a second CreateOrg: %+v, want it unchanged", again)
	}
}

func testOrgGetNotFound(ctx context.Context, t *testing.T, st orgStore, _ sealedOf) {
	mustCreateOrg(ctx, t, st, "docs")
	for _, name := range []string{"ops", "doc", "DOCS", ""} {
		if _, err := st.GetOrg(ctx, name); !errorsIs(err, store.ErrNotFound) {
			t.Errorf("GetOrg(%q): %v, want ErrNotFound", name, err)
		}
	}
}

// testOrgListOrder: orgs are listed by name, by its bytes ('-' before
// letters), whatever the order they were made in.
func testOrgListOrder(ctx context.Context, t *testing.T, st orgStore, _ sealedOf) {
	list, err := st.ListOrgs(ctx)
	if err != nil || list == nil || len(list) != 0 {
		t.Errorf("ListOrgs of a new store: %v, %v; want an empty list", list, err)
	}
	for _, org := range []string{"zeta", "ab", "a-c", "mid", "a9"} {
		mustCreateOrg(ctx, t, st, org)
	}
	list, err = st.ListOrgs(ctx)
	if err != nil {
		t.Fatalf("ListOrgs: %v", err)
	}
	if got, want := orgNames(list), []string{"a-c", "a9", "ab", "mid", "zeta"}; !slices.Equal(got, want) {
		t.Errorf("ListOrgs: %v, want %v", got, want)
	}
	for _, o := range list {
		if o.CreatedAt.IsZero() || o.Quota != (api.Quota{}) {
			t.Errorf("ListOrgs: %+v, want a creation time and no quota", o)
		}
	}
}

// testOrgQuota: SetQuota replaces the whole quota (a limit it leaves out
// is gone), of that org alone; ErrNotFound for no org.
func testOrgQuota(ctx context.Context, t *testing.T, st orgStore, _ sealedOf) {
	mustCreateOrg(ctx, t, st, "docs")
	mustCreateOrg(ctx, t, st, "ops")
	full := api.Quota{Sandboxes: ptr(4), MemoryMiB: ptr(8192), CPUs: ptr(2.5), DiskMiB: ptr(0),
		Checkpoints: ptr(20), PoolMembers: ptr(1)}
	if err := st.SetQuota(ctx, "docs", full); err != nil {
		t.Fatalf("SetQuota: %v", err)
	}
	if got := mustGetOrg(ctx, t, st, "docs").Quota; !reflect.DeepEqual(got, full) {
		t.Errorf("the quota set: %s, want %s", quotaString(got), quotaString(full))
	}
	if got := mustGetOrg(ctx, t, st, "ops").Quota; got != (api.Quota{}) {
		t.Errorf("another org's quota: %s, want none", quotaString(got))
	}
	list, err := st.ListOrgs(ctx)
	if err != nil || len(list) != 2 || !reflect.DeepEqual(list[0].Quota, full) {
		t.Errorf("ListOrgs after SetQuota: %v, %v; want docs with its quota first", orgNames(list), err)
	}
	less := api.Quota{MemoryMiB: ptr(1024)}
	if err := st.SetQuota(ctx, "docs", less); err != nil {
		t.Fatal(err)
	}
	if got := mustGetOrg(ctx, t, st, "docs").Quota; !reflect.DeepEqual(got, less) {
		t.Errorf("the quota replaced: %s, want %s", quotaString(got), quotaString(less))
	}
	if err := st.SetQuota(ctx, "docs", api.Quota{}); err != nil {
		t.Fatal(err)
	}
	if got := mustGetOrg(ctx, t, st, "docs").Quota; got != (api.Quota{}) {
		t.Errorf("the quota cleared: %s, want none", quotaString(got))
	}
	if err := st.SetQuota(ctx, "nope", full); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("SetQuota of no org: %v, want ErrNotFound", err)
	}
	if _, err := st.GetOrg(ctx, "nope"); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("GetOrg after SetQuota of no org: %v, want still none", err)
	}
}

// quotaString shows a quota's limits rather than its pointers.
func quotaString(q api.Quota) string {
	show := func(p *int) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprint(*p)
	}
	cpus := "-"
	if q.CPUs != nil {
		cpus = fmt.Sprint(*q.CPUs)
	}
	return fmt.Sprintf("{sandboxes %s memory %s cpus %s disk %s checkpoints %s pool %s}",
		show(q.Sandboxes), show(q.MemoryMiB), cpus, show(q.DiskMiB), show(q.Checkpoints), show(q.PoolMembers))
}

// testOrgEnsure: EnsureOrg makes an org with no quota, once: again, or
// on an org made otherwise, it changes nothing (its quota and creation
// time stay).
func testOrgEnsure(ctx context.Context, t *testing.T, st orgStore, _ sealedOf) {
	if err := st.EnsureOrg(ctx, "default"); err != nil {
		t.Fatalf("EnsureOrg: %v", err)
	}
	o := mustGetOrg(ctx, t, st, "default")
	if o.Quota != (api.Quota{}) || o.CreatedAt.IsZero() {
		t.Errorf("an org EnsureOrg made: %+v, want no quota and a creation time", o)
	}
	if err := st.SetQuota(ctx, "default", api.Quota{Sandboxes: ptr(2)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond) // so that a second creation time would differ
	if err := st.EnsureOrg(ctx, "default"); err != nil {
		t.Fatalf("EnsureOrg again: %v", err)
	}
	again := mustGetOrg(ctx, t, st, "default")
	if !again.CreatedAt.Equal(o.CreatedAt) || again.Quota.Sandboxes == nil || *again.Quota.Sandboxes != 2 {
		t.Errorf("the org after a second EnsureOrg: %+v, want its creation time %s and quota kept", again, o.CreatedAt)
	}
	if list, err := st.ListOrgs(ctx); err != nil || !slices.Equal(orgNames(list), []string{"default"}) {
		t.Errorf("ListOrgs: %v, %v; want [default] once", orgNames(list), err)
	}
	// Nor is it an error that the org is there, made by CreateOrg.
	mustCreateOrg(ctx, t, st, "docs")
	if err := st.EnsureOrg(ctx, "docs"); err != nil {
		t.Errorf("EnsureOrg of an org CreateOrg made: %v", err)
	}
}

// testOrgEnsureAdopts: EnsureOrg gives the org every sandbox, secret,
// registry credential and image that has no org (those of records older
// than orgs), also when the org is already there; another org's stay its.
func testOrgEnsureAdopts(ctx context.Context, t *testing.T, st orgStore, sealed sealedOf) {
	mustCreateOrg(ctx, t, st, "ops")
	mustCreateSandbox(ctx, t, st, orgSandbox(1, "", ""))
	mustCreateSandbox(ctx, t, st, orgSandbox(2, "", "pool-a"))
	mustCreateSandbox(ctx, t, st, orgSandbox(3, "ops", ""))
	for _, im := range []*store.Image{orgImage(1, ""), orgImage(2, "ops")} {
		if err := st.PutImage(ctx, im); err != nil {
			t.Fatal(err)
		}
	}
	for _, table := range sealedTables {
		sealed.put(ctx, table, "", "old")
		sealed.put(ctx, table, "ops", "theirs")
	}
	if err := st.EnsureOrg(ctx, "default"); err != nil {
		t.Fatalf("EnsureOrg: %v", err)
	}
	owners := func() map[string]string {
		got := map[string]string{}
		for _, id := range []string{"sb-001", "sb-002", "sb-003"} {
			got[id] = mustGetSandbox(ctx, t, st, id).Org
		}
		return got
	}
	want := map[string]string{"sb-001": "default", "sb-002": "default", "sb-003": "ops"}
	if got := owners(); !reflect.DeepEqual(got, want) {
		t.Errorf("the sandboxes' orgs after EnsureOrg: %v, want %v", got, want)
	}
	if list := mustListSandboxes(ctx, t, st, store.Filter{Org: ""}); len(list) != 3 {
		t.Errorf("sandboxes after EnsureOrg: %v, want the 3 still", sandboxIDs(list))
	}
	if _, err := st.GetImage(ctx, "default", orgImage(1, "").ID); err != nil {
		t.Errorf("the image without an org, in default after EnsureOrg: %v", err)
	}
	if list, err := st.ListImages(ctx, "ops"); err != nil || len(list) != 1 {
		t.Errorf("ops' images after EnsureOrg: %v, %v; want its one still", list, err)
	}
	for _, table := range sealedTables {
		if got := sealed.names(ctx, table, "default"); !slices.Equal(got, []string{"old"}) {
			t.Errorf("%s of default after EnsureOrg: %v, want [old]", table, got)
		}
		if got := sealed.names(ctx, table, ""); len(got) != 0 {
			t.Errorf("%s without an org after EnsureOrg: %v, want none", table, got)
		}
		if got := sealed.names(ctx, table, "ops"); !slices.Equal(got, []string{"theirs"}) {
			t.Errorf("%s of ops after EnsureOrg: %v, want [theirs]", table, got)
		}
	}
	// A second daemon's org, later, finds nothing left to adopt.
	if err := st.EnsureOrg(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	if got := owners(); !reflect.DeepEqual(got, want) {
		t.Errorf("the sandboxes' orgs after a second EnsureOrg: %v, want %v", got, want)
	}
}

// fillOrg gives org a key, an image, a secret and a registry credential,
// each named after n.
func fillOrg(ctx context.Context, t *testing.T, st orgStore, sealed sealedOf, org string, n int) {
	t.Helper()
	k := newKey(n)
	k.Org = org
	mustCreateKey(ctx, t, st, k)
	if err := st.PutImage(ctx, orgImage(n, org)); err != nil {
		t.Fatal(err)
	}
	for _, table := range sealedTables {
		sealed.put(ctx, table, org, fmt.Sprintf("value-%d", n))
	}
}

// checkFilled fails t unless org still has what fillOrg(n) gave it.
func checkFilled(ctx context.Context, t *testing.T, st orgStore, sealed sealedOf, org string, n int) {
	t.Helper()
	if got := keyIDs(mustListKeys(ctx, t, st, org)); !slices.Equal(got, []string{newKey(n).ID}) {
		t.Errorf("keys of %s: %v, want [%s]", org, got, newKey(n).ID)
	}
	if _, err := st.GetImage(ctx, org, orgImage(n, org).ID); err != nil {
		t.Errorf("image of %s: %v", org, err)
	}
	for _, table := range sealedTables {
		if got, want := sealed.names(ctx, table, org), []string{fmt.Sprintf("value-%d", n)}; !slices.Equal(got, want) {
			t.Errorf("%s of %s: %v, want %v", table, org, got, want)
		}
	}
}

// checkEmptied fails t unless org has no keys, images, secrets nor
// registry credentials left.
func checkEmptied(ctx context.Context, t *testing.T, st orgStore, sealed sealedOf, org string) {
	t.Helper()
	if list := mustListKeys(ctx, t, st, org); len(list) != 0 {
		t.Errorf("keys of deleted org %s: %v, want none", org, keyIDs(list))
	}
	if list, err := st.ListImages(ctx, org); err != nil || len(list) != 0 {
		t.Errorf("images of deleted org %s: %d, %v; want none", org, len(list), err)
	}
	for _, table := range sealedTables {
		if got := sealed.names(ctx, table, org); len(got) != 0 {
			t.Errorf("%s of deleted org %s: %v, want none", table, org, got)
		}
	}
}

// wantNotEmpty fails t unless err is a *store.NotEmptyError (and
// store.ErrNotEmpty) counting sandboxes and secrets.
func wantNotEmpty(t *testing.T, what string, err error, sandboxes, secrets int) {
	t.Helper()
	var in *store.NotEmptyError
	if !errors.As(err, &in) || !errors.Is(err, store.ErrNotEmpty) {
		t.Errorf("%s: %v, want a *store.NotEmptyError", what, err)
		return
	}
	if in.Sandboxes != sandboxes || in.Secrets != secrets {
		t.Errorf("%s: %d sandboxes and %d secrets, want %d and %d", what, in.Sandboxes, in.Secrets, sandboxes, secrets)
	}
}

// testOrgDeleteNotEmpty: while the org has a sandbox of a user, a
// delete, even of its secrets, refuses with the count and deletes
// nothing; a member of its warm pool is none, and stays after (the
// caller deletes it).
func testOrgDeleteNotEmpty(ctx context.Context, t *testing.T, st orgStore, sealed sealedOf) {
	mustCreateOrg(ctx, t, st, "docs")
	fillOrg(ctx, t, st, sealed, "docs", 1)
	mustCreateSandbox(ctx, t, st, orgSandbox(1, "docs", ""))
	mustCreateSandbox(ctx, t, st, orgSandbox(2, "docs", ""))
	mustCreateSandbox(ctx, t, st, orgSandbox(3, "docs", "pool-a"))
	// Another org's sandbox, and one without an org, count for neither.
	mustCreateSandbox(ctx, t, st, orgSandbox(4, "ops", ""))
	mustCreateSandbox(ctx, t, st, orgSandbox(5, "", ""))

	wantNotEmpty(t, "DeleteOrg of an org with sandboxes", st.DeleteOrg(ctx, "docs", true), 2, 0)
	wantNotEmpty(t, "DeleteOrg of an org with sandboxes and a secret", st.DeleteOrg(ctx, "docs", false), 2, 1)
	mustGetOrg(ctx, t, st, "docs")
	checkFilled(ctx, t, st, sealed, "docs", 1)

	for _, id := range []string{"sb-001", "sb-002"} {
		if err := st.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.DeleteOrg(ctx, "docs", true); err != nil {
		t.Fatalf("DeleteOrg with only a pool member left: %v", err)
	}
	if _, err := st.GetOrg(ctx, "docs"); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("GetOrg after DeleteOrg: %v, want ErrNotFound", err)
	}
	checkEmptied(ctx, t, st, sealed, "docs")
	if got := sandboxIDs(mustListSandboxes(ctx, t, st, store.Filter{})); !slices.Equal(got, []string{"sb-003", "sb-004", "sb-005"}) {
		t.Errorf("sandboxes after DeleteOrg: %v, want the pool member and the others' kept", got)
	}
}

// testOrgDeleteSecrets: an org's secrets hold its delete back unless the
// delete is of them too; registry credentials never do.
func testOrgDeleteSecrets(ctx context.Context, t *testing.T, st orgStore, sealed sealedOf) {
	mustCreateOrg(ctx, t, st, "docs")
	sealed.put(ctx, "secrets", "docs", "a")
	sealed.put(ctx, "secrets", "docs", "b")
	sealed.put(ctx, "registry_credentials", "docs", "ghcr")
	sealed.put(ctx, "secrets", "ops", "c")
	wantNotEmpty(t, "DeleteOrg of an org with secrets", st.DeleteOrg(ctx, "docs", false), 0, 2)
	if got := sealed.names(ctx, "secrets", "docs"); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("secrets after a refused delete: %v, want [a b]", got)
	}
	mustGetOrg(ctx, t, st, "docs")
	if err := st.DeleteOrg(ctx, "docs", true); err != nil {
		t.Fatalf("DeleteOrg with its secrets: %v", err)
	}
	checkEmptied(ctx, t, st, sealed, "docs")
	if got := sealed.names(ctx, "secrets", "ops"); !slices.Equal(got, []string{"c"}) {
		t.Errorf("another org's secrets: %v, want [c]", got)
	}

	// Registry credentials alone are no reason to refuse.
	mustCreateOrg(ctx, t, st, "ci")
	sealed.put(ctx, "registry_credentials", "ci", "ghcr")
	if err := st.DeleteOrg(ctx, "ci", false); err != nil {
		t.Fatalf("DeleteOrg of an org with a registry credential: %v", err)
	}
	checkEmptied(ctx, t, st, sealed, "ci")
}

// testOrgDeleteEverything: a delete takes the org's keys (which then no
// longer authenticate), images, secrets and registry credentials, and
// nothing of another org, nor of an org whose name it starts.
func testOrgDeleteEverything(ctx context.Context, t *testing.T, st orgStore, sealed sealedOf) {
	for i, org := range []string{"docs", "ops", "docs-2"} {
		mustCreateOrg(ctx, t, st, org)
		fillOrg(ctx, t, st, sealed, org, i+1)
	}
	if err := st.SetQuota(ctx, "ops", api.Quota{Sandboxes: ptr(1)}); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteOrg(ctx, "docs", true); err != nil {
		t.Fatalf("DeleteOrg: %v", err)
	}
	checkEmptied(ctx, t, st, sealed, "docs")
	if _, err := st.KeyByHash(ctx, newKey(1).Hash); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("KeyByHash of a deleted org's key: %v, want ErrNotFound", err)
	}
	checkFilled(ctx, t, st, sealed, "ops", 2)
	checkFilled(ctx, t, st, sealed, "docs-2", 3)
	if o := mustGetOrg(ctx, t, st, "ops"); o.Quota.Sandboxes == nil || *o.Quota.Sandboxes != 1 {
		t.Errorf("another org's quota after a delete: %s", quotaString(o.Quota))
	}
	if list, err := st.ListOrgs(ctx); err != nil || !slices.Equal(orgNames(list), []string{"docs-2", "ops"}) {
		t.Errorf("ListOrgs after a delete: %v, %v", orgNames(list), err)
	}
	// The name is free again, for an org with nothing in it.
	mustCreateOrg(ctx, t, st, "docs")
	checkEmptied(ctx, t, st, sealed, "docs")
}

// testOrgDeleteNotFound: a delete of no org is ErrNotFound and deletes
// nothing, not even what an org of that name would own.
func testOrgDeleteNotFound(ctx context.Context, t *testing.T, st orgStore, sealed sealedOf) {
	if err := st.DeleteOrg(ctx, "nope", true); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("DeleteOrg of no org: %v, want ErrNotFound", err)
	}
	fillOrg(ctx, t, st, sealed, "ghost", 1) // records of an org never made
	if err := st.DeleteOrg(ctx, "ghost", true); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("DeleteOrg of an org never made: %v, want ErrNotFound", err)
	}
	checkFilled(ctx, t, st, sealed, "ghost", 1)
	mustCreateOrg(ctx, t, st, "docs")
	if err := st.DeleteOrg(ctx, "docs", false); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteOrg(ctx, "docs", false); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("DeleteOrg again: %v, want ErrNotFound", err)
	}
}

// testOrgCheckpointUse: the checkpoints of the org's sandboxes, pool
// members' included, and the memory_mib each memory checkpoint was taken
// of (its own resources, not the sandbox's now; none for a disk-only
// one); another org's count for it not.
func testOrgCheckpointUse(ctx context.Context, t *testing.T, st orgStore, _ sealedOf) {
	mustCreateOrg(ctx, t, st, "docs")
	if n, mib, err := st.CheckpointUse(ctx, "docs"); err != nil || n != 0 || mib != 0 {
		t.Errorf("CheckpointUse of an org with none: %d, %d, %v; want 0, 0", n, mib, err)
	}
	a, b, pooled := orgSandbox(1, "docs", ""), orgSandbox(2, "docs", ""), orgSandbox(3, "docs", "pool-a")
	theirs, bare := orgSandbox(4, "ops", ""), orgSandbox(5, "docs", "")
	for _, sb := range []*store.Sandbox{a, b, pooled, theirs, bare} {
		mustCreateSandbox(ctx, t, st, sb)
	}
	cp := func(sb *store.Sandbox, id string, memory bool, mib int) {
		t.Helper()
		c := newCheckpoint(sb, id, "")
		c.Memory, c.Resources.MemoryMiB = memory, mib
		mustCreateCheckpoint(ctx, t, st, c)
	}
	cp(a, "v1", true, 512)
	cp(a, "v2", false, 4096) // disk only: no memory image
	cp(a, "auto-1", true, 1024)
	cp(b, "v1", true, 0) // no memory_mib recorded
	cp(pooled, "v1", true, 256)
	cp(theirs, "v1", true, 8192)
	if n, mib, err := st.CheckpointUse(ctx, "docs"); err != nil || n != 5 || mib != 512+1024+256 {
		t.Errorf("CheckpointUse(docs): %d, %d MiB, %v; want 5, %d", n, mib, err, 512+1024+256)
	}
	if n, mib, err := st.CheckpointUse(ctx, "ops"); err != nil || n != 1 || mib != 8192 {
		t.Errorf("CheckpointUse(ops): %d, %d MiB, %v; want 1, 8192", n, mib, err)
	}
	if n, mib, err := st.CheckpointUse(ctx, "nope"); err != nil || n != 0 || mib != 0 {
		t.Errorf("CheckpointUse of no org: %d, %d, %v; want 0, 0", n, mib, err)
	}
	// A sandbox's checkpoints go with it.
	if err := st.DeleteSandbox(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if n, mib, err := st.CheckpointUse(ctx, "docs"); err != nil || n != 2 || mib != 256 {
		t.Errorf("CheckpointUse(docs) after a delete: %d, %d MiB, %v; want 2, 256", n, mib, err)
	}
}

// testOrgAudit: a create, a quota and a delete are an API call's change,
// whose record the store writes with them; EnsureOrg (the daemon's
// start) and a change refused or of no org write none.
func testOrgAudit(ctx context.Context, t *testing.T, st orgStore, _ sealedOf) {
	expectAudit(ctx, t, "EnsureOrg", false, func(ctx context.Context) error { return st.EnsureOrg(ctx, "default") })
	expectAudit(ctx, t, "CreateOrg", true, func(ctx context.Context) error { return st.CreateOrg(ctx, "docs") })
	expectAudit(ctx, t, "CreateOrg of a name in use", false, func(ctx context.Context) error {
		if err := st.CreateOrg(ctx, "docs"); !errorsIs(err, store.ErrExists) {
			return fmt.Errorf("got %v, want ErrExists", err)
		}
		return nil
	})
	expectAudit(ctx, t, "SetQuota", true, func(ctx context.Context) error {
		return st.SetQuota(ctx, "docs", api.Quota{Sandboxes: ptr(1)})
	})
	expectAudit(ctx, t, "SetQuota of no org", false, func(ctx context.Context) error {
		if err := st.SetQuota(ctx, "nope", api.Quota{}); !errorsIs(err, store.ErrNotFound) {
			return fmt.Errorf("got %v, want ErrNotFound", err)
		}
		return nil
	})
	mustCreateSandbox(ctx, t, st, orgSandbox(1, "docs", ""))
	expectAudit(ctx, t, "DeleteOrg refused", false, func(ctx context.Context) error {
		if err := st.DeleteOrg(ctx, "docs", true); !errors.Is(err, store.ErrNotEmpty) {
			return fmt.Errorf("got %v, want ErrNotEmpty", err)
		}
		return nil
	})
	if err := st.DeleteSandbox(ctx, "sb-001"); err != nil {
		t.Fatal(err)
	}
	expectAudit(ctx, t, "DeleteOrg", true, func(ctx context.Context) error { return st.DeleteOrg(ctx, "docs", true) })
	expectAudit(ctx, t, "DeleteOrg of no org", false, func(ctx context.Context) error {
		if err := st.DeleteOrg(ctx, "docs", true); !errorsIs(err, store.ErrNotFound) {
			return fmt.Errorf("got %v, want ErrNotFound", err)
		}
		return nil
	})
}
