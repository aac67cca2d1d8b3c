// Package storetest is the suite every store.Store implementation must pass,
// so that the daemon may rely on what the interface promises rather than on
// what one implementation happens to do:
//
//	func TestStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store { … },
//			storetest.WithReopen(func(t *testing.T, old store.Store) store.Store { … }))
//	}
//
// Run it with the race detector: one of the tests writes from many
// goroutines at once.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// Option changes what Run tests.
type Option func(*config)

// WithPeer gives Run a second store over the records of a store it made,
// as a second node opens the database the first uses, for the tests of
// many writers. Without it, those tests write through the one store from
// many goroutines (a store that one process alone may open, as
// store/sqlite's file).
func WithPeer(open func(t *testing.T, st store.Store) store.Store) Option {
	return func(c *config) { c.peer = open }
}

// WithReopen lets Run check that records outlive a Close. reopen must
// return a new Store over the data of old, which Run has closed already.
// Without it, Run skips the tests that need it.
func WithReopen(reopen func(t *testing.T, old store.Store) store.Store) Option {
	return func(c *config) { c.reopen = reopen }
}

type config struct {
	newStore func(t *testing.T) store.Store
	reopen   func(t *testing.T, old store.Store) store.Store
	peer     func(t *testing.T, st store.Store) store.Store
}

// test is one test of the suite; st is new and empty, and closed by Run.
type test func(ctx context.Context, t *testing.T, st store.Store)

// Run runs the suite, each test as a subtest with its own store from
// newStore, which must return a new, empty Store. Run closes it and fails the
// test if Close fails.
func Run(t *testing.T, newStore func(t *testing.T) store.Store, opts ...Option) {
	c := &config{newStore: newStore}
	for _, o := range opts {
		o(c)
	}
	tests := []struct {
		name string
		fn   test
	}{
		{"Empty", testEmpty},

		{"SandboxCreateGet", testSandboxCreateGet},
		{"SandboxRoundTrip", testSandboxRoundTrip},
		{"SandboxGetNotFound", testSandboxGetNotFound},
		{"SandboxConflict", testSandboxConflict},
		{"SandboxIDBeatsName", testSandboxIDBeatsName},
		{"SandboxRecordsAreCopies", testSandboxRecordsAreCopies},
		{"SandboxUpdate", testSandboxUpdate},
		{"SandboxUpdateNameConflict", testSandboxUpdateNameConflict},
		{"SandboxUpdateNotFound", testSandboxUpdateNotFound},
		{"SandboxDelete", testSandboxDelete},
		{"SandboxDeleteCascades", testSandboxDeleteCascades},
		{"SandboxListOrder", testSandboxListOrder},
		{"SandboxListLabels", testSandboxListLabels},
		{"SandboxOrgs", testSandboxOrgs},
		{"UsedNetIndexes", testUsedNetIndexes},
		{"ByNode", testByNode},
		{"CreatedAtExact", testCreatedAtExact},

		{"CheckpointCreateGet", testCheckpointCreateGet},
		{"CheckpointGetNotFound", testCheckpointGetNotFound},
		{"CheckpointConflict", testCheckpointConflict},
		{"CheckpointUnknownSandbox", testCheckpointUnknownSandbox},
		{"CheckpointIDBeatsName", testCheckpointIDBeatsName},
		{"CheckpointRecordsAreCopies", testCheckpointRecordsAreCopies},
		{"CheckpointListOrder", testCheckpointListOrder},
		{"CheckpointDelete", testCheckpointDelete},
		{"CheckpointFields", testCheckpointFields},

		{"ConcurrentWrites", testConcurrentWrites},
		{"ConcurrentConflicts", testConcurrentConflicts},
		{"SandboxVersion", testSandboxVersion},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t.Context(), t, c.open(t))
		})
	}
	for _, tc := range []struct {
		name string
		fn   func(ctx context.Context, t *testing.T, stores []store.Store)
	}{
		{"WritersUpdate", testWritersUpdate},
		{"WritersCheckpointIDs", testWritersCheckpointIDs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t.Context(), t, c.writers(t))
		})
	}
	t.Run("Reopen", func(t *testing.T) {
		if c.reopen == nil {
			t.Skip("no WithReopen option")
		}
		testReopen(t.Context(), t, c)
	})
}

// openAs opens a new store from newStore, closed when t ends, as what a
// suite tests of it (Images, Keys, …), and ends t if the store is not
// one: what names its records in the message.
func openAs[T any](t *testing.T, newStore func(t *testing.T) store.Store, what string) T {
	t.Helper()
	c := &config{newStore: newStore}
	st, ok := c.open(t).(T)
	if !ok {
		t.Fatalf("the store keeps no %s", what)
	}
	return st
}

// writers returns two stores over one set of records (see WithPeer),
// closed when t ends.
func (c *config) writers(t *testing.T) []store.Store {
	t.Helper()
	st := c.open(t)
	if c.peer == nil {
		return []store.Store{st, st}
	}
	peer := c.peer(t, st)
	t.Cleanup(func() {
		if err := peer.Close(); err != nil {
			t.Errorf("closing the peer store: %v", err)
		}
	})
	return []store.Store{st, peer}
}

// open returns a new store that is closed when t ends.
func (c *config) open(t *testing.T) store.Store {
	t.Helper()
	st := c.newStore(t)
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("closing store: %v", err)
		}
	})
	return st
}

// t0 is a time with every nanosecond digit set, so a store that rounds
// times shows it.
var t0 = time.Date(2025, time.March, 14, 15, 9, 26, 535897932, time.UTC)

// newSandbox is a record with every field set (From aside), distinct for
// each n: id sb-n, name box-n, NetIndex n, created n seconds after t0.
func newSandbox(n int) *store.Sandbox {
	id, name := fmt.Sprintf("sb-%03d", n), fmt.Sprintf("box-%d", n)
	return &store.Sandbox{
		Sandbox: api.Sandbox{
			ID:        id,
			Name:      name,
			State:     api.StateRunning,
			Template:  "python",
			Image:     "docker.io/library/python:3.13",
			Resources: api.Resources{CPUs: 1.5, MemoryMiB: 2048, DiskMiB: 10240},
			Env:       map[string]string{"PATH": "/usr/local/bin:/usr/bin", "GREETING": `héllo "world"`},
			Labels:    map[string]string{"team": "infra", "n": fmt.Sprint(n)},
			Idle:      "15m",
			HTTPPort:  8080,
			URL:       "https://" + name + ".loam.test",
			Node:      "node-a",
			CreatedAt: t0.Add(time.Duration(n) * time.Second),
		},
		NetIndex:      n,
		AgentGen:      7,
		RestoreTarget: "v2",
		CheckpointSeq: 4,
		AutoSeq:       2,
	}
}

// newCheckpoint is a record of sb with every field set.
func newCheckpoint(sb *store.Sandbox, id, name string) *store.Checkpoint {
	return &store.Checkpoint{
		Checkpoint: api.Checkpoint{
			ID:        id,
			Sandbox:   sb.ID,
			Name:      name,
			Comment:   "before " + id,
			Memory:    true,
			Auto:      len(id) > 5 && id[:5] == "auto-",
			Inside:    true,
			CreatedAt: t0.Add(time.Hour),
		},
		SandboxName: sb.Name,
		Template:    sb.Template,
		Image:       sb.Image,
		Resources:   sb.Resources,
		AgentGen:    sb.AgentGen,
	}
}

func mustCreateSandbox(ctx context.Context, t *testing.T, st store.Store, sb *store.Sandbox) {
	t.Helper()
	if err := st.CreateSandbox(ctx, sb); err != nil {
		t.Fatalf("CreateSandbox(%s): %v", sb.ID, err)
	}
}

func mustCreateCheckpoint(ctx context.Context, t *testing.T, st store.Store, cp *store.Checkpoint) {
	t.Helper()
	if err := st.CreateCheckpoint(ctx, cp); err != nil {
		t.Fatalf("CreateCheckpoint(%s, %s): %v", cp.Sandbox, cp.ID, err)
	}
}

func mustGetSandbox(ctx context.Context, t *testing.T, st store.Store, ref string) *store.Sandbox {
	t.Helper()
	sb, err := st.GetSandbox(ctx, "", ref)
	if err != nil {
		t.Fatalf("GetSandbox(%q): %v", ref, err)
	}
	return sb
}

func mustGetCheckpoint(ctx context.Context, t *testing.T, st store.Store, sandboxID, ref string) *store.Checkpoint {
	t.Helper()
	cp, err := st.GetCheckpoint(ctx, sandboxID, ref)
	if err != nil {
		t.Fatalf("GetCheckpoint(%q, %q): %v", sandboxID, ref, err)
	}
	return cp
}

func mustListSandboxes(ctx context.Context, t *testing.T, st store.Store, f store.Filter) []*store.Sandbox {
	t.Helper()
	list, err := st.ListSandboxes(ctx, f)
	if err != nil {
		t.Fatalf("ListSandboxes(%v): %v", f.Labels, err)
	}
	return list
}

func mustListCheckpoints(ctx context.Context, t *testing.T, st store.Store, sandboxID string) []*store.Checkpoint {
	t.Helper()
	list, err := st.ListCheckpoints(ctx, sandboxID)
	if err != nil {
		t.Fatalf("ListCheckpoints(%q): %v", sandboxID, err)
	}
	return list
}

// wantErr fails t unless err is target; what names the call.
func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: got error %v, want %v", what, err, target)
	}
}

// checkSandbox fails t unless got is want as a store returns it: created_at
// the same instant, in UTC; nil maps as empty ones, never nil.
func checkSandbox(t *testing.T, what string, got, want *store.Sandbox) {
	t.Helper()
	if got == nil {
		t.Errorf("%s: got nil sandbox, want %s", what, want.ID)
		return
	}
	if got.Env == nil || got.Labels == nil {
		t.Errorf("%s: got nil map (env %v, labels %v); want empty maps", what, got.Env == nil, got.Labels == nil)
	}
	checkTime(t, what+": created_at", got.CreatedAt, want.CreatedAt)
	g, w := *got, *want
	g.CreatedAt, w.CreatedAt = time.Time{}, time.Time{}
	// The store keeps the version (testSandboxVersion checks it).
	g.Version, w.Version = 0, 0
	w.Env, w.Labels = orEmpty(w.Env), orEmpty(w.Labels)
	if !reflect.DeepEqual(g, w) {
		t.Errorf("%s:\n got %+v\nwant %+v", what, g, w)
	}
}

// checkCheckpoint is checkSandbox for checkpoints.
func checkCheckpoint(t *testing.T, what string, got, want *store.Checkpoint) {
	t.Helper()
	if got == nil {
		t.Errorf("%s: got nil checkpoint, want %s", what, want.ID)
		return
	}
	checkTime(t, what+": created_at", got.CreatedAt, want.CreatedAt)
	g, w := *got, *want
	g.CreatedAt, w.CreatedAt = time.Time{}, time.Time{}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("%s:\n got %+v\nwant %+v", what, g, w)
	}
}

func checkTime(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if !got.Equal(want) || got.Location() != time.UTC {
		t.Errorf("%s: got %s (%s), want %s in UTC", what, got.Format(time.RFC3339Nano), got.Location(), want.UTC().Format(time.RFC3339Nano))
	}
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// sandboxIDs lists the ids of list, in its order.
func sandboxIDs(list []*store.Sandbox) []string {
	ids := []string{}
	for _, sb := range list {
		ids = append(ids, sb.ID)
	}
	return ids
}

// checkpointIDs lists the ids of list, in its order.
func checkpointIDs(list []*store.Checkpoint) []string {
	ids := []string{}
	for _, cp := range list {
		ids = append(ids, cp.ID)
	}
	return ids
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	return maps.Clone(m)
}

func testEmpty(ctx context.Context, t *testing.T, st store.Store) {
	if list := mustListSandboxes(ctx, t, st, store.Filter{}); len(list) != 0 {
		t.Errorf("ListSandboxes on a new store: got %v, want none", sandboxIDs(list))
	}
	used, err := st.UsedNetIndexes(ctx, "")
	if err != nil || len(used) != 0 {
		t.Errorf("UsedNetIndexes on a new store: got %v, %v; want none", used, err)
	}
}
