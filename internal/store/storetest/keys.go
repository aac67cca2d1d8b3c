package storetest

import (
	"context"
	"crypto/sha256"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// Keys is what a store that keeps API keys has (internal/auth's
// KeyStore): each org's, found by the hash of their secret from any org.
type Keys interface {
	CreateKey(ctx context.Context, k *store.Key) error
	KeyByHash(ctx context.Context, hash []byte) (*store.Key, error)
	GetKey(ctx context.Context, org, id string) (*store.Key, error)
	ListKeys(ctx context.Context, org string) ([]*store.Key, error)
	DeleteKey(ctx context.Context, org, id string) error
	TouchKey(ctx context.Context, id string, t time.Time) error
}

// RunKeys runs the suite of API key records; newStore must return a new,
// empty store, which RunKeys closes.
func RunKeys(t *testing.T, newStore func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(ctx context.Context, t *testing.T, st Keys)
	}{
		{"RoundTrip", testKeyRoundTrip},
		{"NotFound", testKeyNotFound},
		{"Conflict", testKeyConflict},
		{"ListOrder", testKeyListOrder},
		{"Delete", testKeyDelete},
		{"Touch", testKeyTouch},
		{"Expiry", testKeyExpiry},
		{"Labels", testKeyLabels},
		{"Orgs", testKeyOrgs},
		{"Audit", testKeyAudit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := openAs[Keys](t, newStore, "API keys")
			tc.fn(t.Context(), t, st)
		})
	}
}

// newKey is a key of org "docs" with every field a store keeps set
// (LastUsedAt aside: a key is made unused), distinct for each n: id
// key-n, the hash of secret-n, created n seconds after t0, expiring a
// day after that.
func newKey(n int) *store.Key {
	hash := sha256.Sum256(fmt.Appendf(nil, "secret-%d", n))
	created := t0.Add(time.Duration(n) * time.Second)
	expires := created.Add(24*time.Hour + 1)
	return &store.Key{
		Key: api.Key{
			ID:        fmt.Sprintf("key-%03d", n),
			Name:      fmt.Sprintf("ci %d", n),
			Org:       "docs",
			Scope:     api.ScopeWrite,
			Labels:    map[string]string{"team": "infra", "n": fmt.Sprint(n), "quote": `"é"`},
			CreatedBy: "admin",
			CreatedAt: created,
			ExpiresAt: &expires,
		},
		Hash: hash[:],
	}
}

func mustCreateKey(ctx context.Context, t *testing.T, st Keys, k *store.Key) {
	t.Helper()
	if err := st.CreateKey(ctx, k); err != nil {
		t.Fatalf("CreateKey(%s): %v", k.ID, err)
	}
}

func mustGetKey(ctx context.Context, t *testing.T, st Keys, org, id string) *store.Key {
	t.Helper()
	k, err := st.GetKey(ctx, org, id)
	if err != nil {
		t.Fatalf("GetKey(%s, %s): %v", org, id, err)
	}
	return k
}

func mustListKeys(ctx context.Context, t *testing.T, st Keys, org string) []*store.Key {
	t.Helper()
	list, err := st.ListKeys(ctx, org)
	if err != nil {
		t.Fatalf("ListKeys(%s): %v", org, err)
	}
	if list == nil {
		t.Errorf("ListKeys(%s): nil, want a list (the API shows [])", org)
	}
	return list
}

// checkKey fails t unless got is want as a store returns it: its times
// the same instants, in UTC; labels nil as an empty map.
func checkKey(t *testing.T, what string, got, want *store.Key) {
	t.Helper()
	if got == nil {
		t.Errorf("%s: got nil key, want %s", what, want.ID)
		return
	}
	checkTime(t, what+": created_at", got.CreatedAt, want.CreatedAt)
	checkOptionalTime(t, what+": expires_at", got.ExpiresAt, want.ExpiresAt)
	checkOptionalTime(t, what+": last_used_at", got.LastUsedAt, want.LastUsedAt)
	if got.Labels == nil {
		t.Errorf("%s: labels nil, want an empty map", what)
	}
	g, w := *got, *want
	g.CreatedAt, w.CreatedAt = time.Time{}, time.Time{}
	g.ExpiresAt, w.ExpiresAt, g.LastUsedAt, w.LastUsedAt = nil, nil, nil, nil
	w.Labels = orEmpty(w.Labels)
	if !reflect.DeepEqual(g, w) {
		t.Errorf("%s:\n got %+v\nwant %+v", what, g, w)
	}
}

func checkOptionalTime(t *testing.T, what string, got, want *time.Time) {
	t.Helper()
	switch {
	case got == nil && want == nil:
	case got == nil || want == nil:
		t.Errorf("%s: got %v, want %v", what, got, want)
	default:
		checkTime(t, what, *got, *want)
	}
}

func keyIDs(list []*store.Key) []string {
	ids := []string{}
	for _, k := range list {
		ids = append(ids, k.ID)
	}
	return ids
}

// testKeyRoundTrip: a key comes back as it was made, by id and by hash,
// unused.
func testKeyRoundTrip(ctx context.Context, t *testing.T, st Keys) {
	k := newKey(1)
	k.Scope = api.ScopeRead
	k.CreatedBy = "key-000"
	mustCreateKey(ctx, t, st, k)
	checkKey(t, "GetKey", mustGetKey(ctx, t, st, "docs", k.ID), k)
	got, err := st.KeyByHash(ctx, k.Hash)
	if err != nil {
		t.Fatalf("KeyByHash: %v", err)
	}
	checkKey(t, "KeyByHash", got, k)
	list := mustListKeys(ctx, t, st, "docs")
	if len(list) != 1 {
		t.Fatalf("ListKeys: %v, want [%s]", keyIDs(list), k.ID)
	}
	checkKey(t, "ListKeys", list[0], k)

	// A key is made unused, whatever the record handed in says.
	used := newKey(2)
	at := t0.Add(time.Minute)
	used.LastUsedAt = &at
	mustCreateKey(ctx, t, st, used)
	if got := mustGetKey(ctx, t, st, "docs", used.ID); got.LastUsedAt != nil {
		t.Errorf("a new key's last use: %v, want none", got.LastUsedAt)
	}
}

func testKeyNotFound(ctx context.Context, t *testing.T, st Keys) {
	mustCreateKey(ctx, t, st, newKey(1))
	other := newKey(2)
	if _, err := st.GetKey(ctx, "docs", other.ID); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("GetKey of a missing key: %v, want ErrNotFound", err)
	}
	if _, err := st.KeyByHash(ctx, other.Hash); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("KeyByHash of an unknown hash: %v, want ErrNotFound", err)
	}
	// A prefix of a hash is no hash.
	if _, err := st.KeyByHash(ctx, newKey(1).Hash[:16]); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("KeyByHash of a hash's prefix: %v, want ErrNotFound", err)
	}
	if list := mustListKeys(ctx, t, st, "ops"); len(list) != 0 {
		t.Errorf("ListKeys of an org with none: %v", keyIDs(list))
	}
}

// testKeyConflict: a second key with a taken id, or with a taken hash
// (another secret of the same value), is ErrExists and changes nothing.
func testKeyConflict(ctx context.Context, t *testing.T, st Keys) {
	k := newKey(1)
	mustCreateKey(ctx, t, st, k)

	sameID := newKey(2)
	sameID.ID = k.ID
	if err := st.CreateKey(ctx, sameID); !errorsIs(err, store.ErrExists) {
		t.Errorf("CreateKey with a taken id: %v, want ErrExists", err)
	}
	sameHash := newKey(3)
	sameHash.Hash = k.Hash
	sameHash.Org = "ops"
	if err := st.CreateKey(ctx, sameHash); !errorsIs(err, store.ErrExists) {
		t.Errorf("CreateKey with a taken hash (in another org): %v, want ErrExists", err)
	}
	checkKey(t, "the first key after the conflicts", mustGetKey(ctx, t, st, "docs", k.ID), k)
	if _, err := st.KeyByHash(ctx, sameID.Hash); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("KeyByHash of the refused key's hash: %v, want ErrNotFound", err)
	}
	if list := mustListKeys(ctx, t, st, "ops"); len(list) != 0 {
		t.Errorf("ListKeys of ops after its key was refused: %v", keyIDs(list))
	}
}

// testKeyListOrder: oldest first, by creation time to the nanosecond,
// then by id, whatever the order they were made in.
func testKeyListOrder(ctx context.Context, t *testing.T, st Keys) {
	// early's id sorts after late's, so an order by id, or by times
	// rounded to less than a nanosecond, shows.
	late, early, tieB, tieA := newKey(1), newKey(9), newKey(5), newKey(6)
	late.CreatedAt = t0.Add(9 * time.Second)
	early.CreatedAt = late.CreatedAt.Add(-1)
	tieA.CreatedAt = t0.Add(-2 * time.Hour)
	tieB.CreatedAt = tieA.CreatedAt
	tieA.ID, tieB.ID = "key-a", "key-b"
	for _, k := range []*store.Key{late, tieB, early, tieA} {
		mustCreateKey(ctx, t, st, k)
	}
	want := []string{"key-a", "key-b", early.ID, late.ID}
	if got := keyIDs(mustListKeys(ctx, t, st, "docs")); !slices.Equal(got, want) {
		t.Errorf("ListKeys: %v, want %v", got, want)
	}
}

func testKeyDelete(ctx context.Context, t *testing.T, st Keys) {
	k, kept := newKey(1), newKey(2)
	mustCreateKey(ctx, t, st, k)
	mustCreateKey(ctx, t, st, kept)
	if err := st.DeleteKey(ctx, "docs", k.ID); err != nil {
		t.Fatalf("DeleteKey: %v", err)
	}
	if _, err := st.GetKey(ctx, "docs", k.ID); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("GetKey after delete: %v, want ErrNotFound", err)
	}
	if _, err := st.KeyByHash(ctx, k.Hash); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("KeyByHash after delete: %v, want ErrNotFound (a revoked key must not authenticate)", err)
	}
	if err := st.DeleteKey(ctx, "docs", k.ID); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("DeleteKey again: %v, want ErrNotFound", err)
	}
	if got := keyIDs(mustListKeys(ctx, t, st, "docs")); !slices.Equal(got, []string{kept.ID}) {
		t.Errorf("ListKeys after delete: %v, want [%s]", got, kept.ID)
	}
	// The deleted key's id and hash are free again.
	mustCreateKey(ctx, t, st, k)
}

// testKeyTouch: TouchKey records the last use, to the nanosecond and in
// UTC whatever the zone it is given in, of that key alone; a later touch
// replaces it; touching a key that is gone is no error (a call in flight
// while its key was revoked).
func testKeyTouch(ctx context.Context, t *testing.T, st Keys) {
	k, other := newKey(1), newKey(2)
	mustCreateKey(ctx, t, st, k)
	mustCreateKey(ctx, t, st, other)
	first := t0.Add(time.Hour + 7).In(time.FixedZone("UTC+5", 5*3600))
	if err := st.TouchKey(ctx, k.ID, first); err != nil {
		t.Fatalf("TouchKey: %v", err)
	}
	want := *k
	want.LastUsedAt = &first
	checkKey(t, "GetKey after a touch", mustGetKey(ctx, t, st, "docs", k.ID), &want)
	got, err := st.KeyByHash(ctx, k.Hash)
	if err != nil {
		t.Fatal(err)
	}
	checkKey(t, "KeyByHash after a touch", got, &want)
	checkKey(t, "another key after a touch", mustGetKey(ctx, t, st, "docs", other.ID), other)

	second := first.Add(time.Minute)
	if err := st.TouchKey(ctx, k.ID, second); err != nil {
		t.Fatalf("TouchKey again: %v", err)
	}
	want.LastUsedAt = &second
	checkKey(t, "GetKey after a second touch", mustGetKey(ctx, t, st, "docs", k.ID), &want)

	if err := st.TouchKey(ctx, "key-gone", second); err != nil {
		t.Errorf("TouchKey of a key that is gone: %v, want no error", err)
	}
}

// testKeyExpiry: an expiry comes back the same instant, to the
// nanosecond, in UTC; a key without one has none.
func testKeyExpiry(ctx context.Context, t *testing.T, st Keys) {
	k, forever := newKey(1), newKey(2)
	expires := t0.Add(30*24*time.Hour + 123).In(time.FixedZone("UTC-7", -7*3600))
	k.ExpiresAt = &expires
	forever.ExpiresAt = nil
	mustCreateKey(ctx, t, st, k)
	mustCreateKey(ctx, t, st, forever)
	checkKey(t, "a key that expires", mustGetKey(ctx, t, st, "docs", k.ID), k)
	checkKey(t, "a key that never expires", mustGetKey(ctx, t, st, "docs", forever.ID), forever)
}

// testKeyLabels: labels come back as made, none (nil or empty) as an
// empty map, never nil.
func testKeyLabels(ctx context.Context, t *testing.T, st Keys) {
	none, empty, some := newKey(1), newKey(2), newKey(3)
	none.Labels, empty.Labels = nil, map[string]string{}
	some.Labels = map[string]string{"team": "ml", "a.b/c": `x "y" z`, "": "empty key"}
	for _, k := range []*store.Key{none, empty, some} {
		mustCreateKey(ctx, t, st, k)
	}
	for _, k := range []*store.Key{none, empty, some} {
		got := mustGetKey(ctx, t, st, "docs", k.ID)
		checkKey(t, "labels of "+k.ID, got, k)
		if len(got.Labels) != len(k.Labels) {
			t.Errorf("labels of %s: %v, want %v", k.ID, got.Labels, k.Labels)
		}
	}
}

// testKeyOrgs: a key of one org is not seen, listed nor deleted from
// another; KeyByHash, which authenticates, finds it from any.
func testKeyOrgs(ctx context.Context, t *testing.T, st Keys) {
	docs, ops := newKey(1), newKey(2)
	ops.Org = "ops"
	mustCreateKey(ctx, t, st, docs)
	mustCreateKey(ctx, t, st, ops)
	if _, err := st.GetKey(ctx, "ops", docs.ID); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("GetKey of docs' key in ops: %v, want ErrNotFound", err)
	}
	if _, err := st.GetKey(ctx, "", docs.ID); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("GetKey of docs' key in no org: %v, want ErrNotFound", err)
	}
	if err := st.DeleteKey(ctx, "ops", docs.ID); !errorsIs(err, store.ErrNotFound) {
		t.Errorf("DeleteKey of docs' key in ops: %v, want ErrNotFound", err)
	}
	for _, k := range []*store.Key{docs, ops} {
		if got := keyIDs(mustListKeys(ctx, t, st, k.Org)); !slices.Equal(got, []string{k.ID}) {
			t.Errorf("ListKeys(%s): %v, want its own [%s]", k.Org, got, k.ID)
		}
		checkKey(t, "GetKey in its own org", mustGetKey(ctx, t, st, k.Org, k.ID), k)
		got, err := st.KeyByHash(ctx, k.Hash)
		if err != nil || got.Org != k.Org || got.ID != k.ID {
			t.Errorf("KeyByHash of %s's key: %+v, %v", k.Org, got, err)
		}
	}
	if list := mustListKeys(ctx, t, st, ""); len(list) != 0 {
		t.Errorf("ListKeys of no org: %v, want none", keyIDs(list))
	}
}

// testKeyAudit: a create and a delete are an API call's change, whose
// record the store writes with them; a touch is none (the call's record
// is left to the call), nor is a change that failed.
func testKeyAudit(ctx context.Context, t *testing.T, st Keys) {
	k := newKey(1)
	expectAudit(ctx, t, "CreateKey", true, func(ctx context.Context) error { return st.CreateKey(ctx, k) })
	expectAudit(ctx, t, "CreateKey of a taken id", false, func(ctx context.Context) error {
		if err := st.CreateKey(ctx, k); !errorsIs(err, store.ErrExists) {
			return fmt.Errorf("got %v, want ErrExists", err)
		}
		return nil
	})
	expectAudit(ctx, t, "TouchKey", false, func(ctx context.Context) error { return st.TouchKey(ctx, k.ID, t0) })
	expectAudit(ctx, t, "DeleteKey of another org's key", false, func(ctx context.Context) error {
		if err := st.DeleteKey(ctx, "ops", k.ID); !errorsIs(err, store.ErrNotFound) {
			return fmt.Errorf("got %v, want ErrNotFound", err)
		}
		return nil
	})
	expectAudit(ctx, t, "DeleteKey", true, func(ctx context.Context) error { return st.DeleteKey(ctx, "docs", k.ID) })
}

// auditLog is the AuditWriter of a call: it counts the records the call
// writes itself, those no change of the store wrote.
type auditLog struct{ appended int }

func (l *auditLog) AppendAudit(context.Context, api.AuditEvent) error {
	l.appended++
	return nil
}

func (l *auditLog) SetAuditOutcome(context.Context, int64, string) error { return nil }

// expectAudit runs write under an API call's audit record and fails t
// unless the store wrote that record with the change (stored) or left it
// to the call (!stored), which then writes it itself.
func expectAudit(ctx context.Context, t *testing.T, what string, stored bool, write func(ctx context.Context) error) {
	t.Helper()
	log := &auditLog{}
	call := store.NewAuditCall(api.AuditEvent{Time: t0, Org: "docs", Key: "admin", Action: "test", Target: what}, log)
	if err := write(store.WithAudit(ctx, call)); err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	if err := call.Finish(ctx, "ok"); err != nil {
		t.Fatalf("%s: finishing the call: %v", what, err)
	}
	switch {
	case stored && log.appended != 0:
		t.Errorf("%s: the call had to write its record itself; want the store to write it with the change", what)
	case !stored && log.appended != 1:
		t.Errorf("%s: the store wrote the call's record; want it to write none", what)
	}
}
