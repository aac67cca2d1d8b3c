package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// testSandboxVersion: a record is created at version 1, every update
// bumps it (and the caller's copy), and an update of a copy read before
// another update is refused with ErrStale, changing nothing.
func testSandboxVersion(ctx context.Context, t *testing.T, st store.Store) {
	sb := newSandbox(1)
	sb.Version = 42 // the store's to set, not the caller's
	mustCreateSandbox(ctx, t, st, sb)
	if sb.Version != 1 {
		t.Errorf("after CreateSandbox, Version = %d, want 1", sb.Version)
	}
	first := mustGetSandbox(ctx, t, st, sb.ID)
	second := mustGetSandbox(ctx, t, st, sb.ID)
	if first.Version != 1 {
		t.Errorf("GetSandbox after create: Version = %d, want 1", first.Version)
	}

	first.State = api.StateStopped
	if err := st.UpdateSandbox(ctx, first); err != nil {
		t.Fatalf("UpdateSandbox: %v", err)
	}
	if first.Version != 2 {
		t.Errorf("after UpdateSandbox, the caller's Version = %d, want 2", first.Version)
	}
	// The caller's copy is current: it updates again without a read.
	first.Labels = map[string]string{"again": "yes"}
	if err := st.UpdateSandbox(ctx, first); err != nil {
		t.Fatalf("UpdateSandbox again: %v", err)
	}

	second.State = api.StateSleeping
	err := st.UpdateSandbox(ctx, second)
	wantErr(t, "UpdateSandbox of a copy read before two updates", err, store.ErrStale)
	if second.Version != 1 {
		t.Errorf("a refused update changed the caller's Version to %d", second.Version)
	}
	got := mustGetSandbox(ctx, t, st, sb.ID)
	if got.Version != 3 || got.State != api.StateStopped || got.Labels["again"] != "yes" {
		t.Errorf("after a stale update, the record is at version %d, %s, %v; want 3, stopped, again=yes", got.Version, got.State, got.Labels)
	}

	// A refused rename changes neither the record nor the caller's version.
	mustCreateSandbox(ctx, t, st, newSandbox(2))
	got.Name = newSandbox(2).Name
	wantErr(t, "UpdateSandbox to a name in use", st.UpdateSandbox(ctx, got), store.ErrExists)
	if got.Version != 3 {
		t.Errorf("a refused rename changed the caller's Version to %d", got.Version)
	}

	// A record deleted is not found, not stale.
	if err := st.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	wantErr(t, "UpdateSandbox of a deleted record", st.UpdateSandbox(ctx, first), store.ErrNotFound)
}

// writersEach is how many writers testWritersUpdate and
// testWritersCheckpointIDs start on each store, and writesEach how many
// changes each makes.
const (
	writersEach = 4
	writesEach  = 10
)

// update reads the record of id from st, changes it with change, and
// stores it, reading again as long as another writer's update came
// first: what a node does that may race another for one record. It
// returns the record it stored.
func update(ctx context.Context, st store.Store, id string, change func(sb *store.Sandbox)) (*store.Sandbox, error) {
	for {
		sb, err := st.GetSandbox(ctx, "", id)
		if err != nil {
			return nil, err
		}
		change(sb)
		err = st.UpdateSandbox(ctx, sb)
		if errors.Is(err, store.ErrStale) {
			continue
		}
		return sb, err
	}
}

// testWritersUpdate: writers on two stores over one database (two nodes)
// update one record at once, each reading it and writing it back. No
// change is lost: every writer's last count is in the record, and its
// version counts every update.
func testWritersUpdate(ctx context.Context, t *testing.T, stores []store.Store) {
	sb := newSandbox(1)
	sb.Labels = map[string]string{}
	mustCreateSandbox(ctx, t, stores[0], sb)
	var wg sync.WaitGroup
	for i := range 2 * writersEach {
		st := stores[i%2]
		key := fmt.Sprintf("w%d", i)
		wg.Go(func() {
			for n := 1; n <= writesEach; n++ {
				if _, err := update(ctx, st, sb.ID, func(sb *store.Sandbox) { sb.Labels[key] = fmt.Sprint(n) }); err != nil {
					t.Errorf("writer %s: %v", key, err)
					return
				}
			}
		})
	}
	wg.Wait()
	got := mustGetSandbox(ctx, t, stores[1], sb.ID)
	for i := range 2 * writersEach {
		if v := got.Labels[fmt.Sprintf("w%d", i)]; v != fmt.Sprint(writesEach) {
			t.Errorf("writer w%d's label is %q, want %d: an update was lost", i, v, writesEach)
		}
	}
	if want := int64(1 + 2*writersEach*writesEach); got.Version != want {
		t.Errorf("Version = %d after %d updates, want %d", got.Version, 2*writersEach*writesEach, want)
	}
}

// testWritersCheckpointIDs: writers on two stores take checkpoints of one
// sandbox at once, as a daemon does: spend the next number of the
// sandbox's sequence (v-N or auto-N) in its record, then store the
// checkpoint under it. Every number is spent once: the ids are v1 to vN
// and auto-1 to auto-N, none twice, none skipped, and deleting one never
// frees its number.
func testWritersCheckpointIDs(ctx context.Context, t *testing.T, stores []store.Store) {
	sb := newSandbox(1)
	sb.CheckpointSeq, sb.AutoSeq = 0, 0
	mustCreateSandbox(ctx, t, stores[0], sb)
	var wg sync.WaitGroup
	for i := range 2 * writersEach {
		st := stores[i%2]
		auto := i%4 >= 2
		wg.Go(func() {
			for range writesEach {
				var id string
				_, err := update(ctx, st, sb.ID, func(sb *store.Sandbox) {
					if auto {
						sb.AutoSeq++
						id = fmt.Sprintf("auto-%d", sb.AutoSeq)
					} else {
						sb.CheckpointSeq++
						id = fmt.Sprintf("v%d", sb.CheckpointSeq)
					}
				})
				if err != nil {
					t.Errorf("spending a checkpoint id: %v", err)
					return
				}
				cp := newCheckpoint(sb, id, "")
				cp.Auto = auto
				if err := st.CreateCheckpoint(ctx, cp); err != nil {
					t.Errorf("CreateCheckpoint(%s): %v", id, err)
					return
				}
			}
		})
	}
	wg.Wait()
	const each = writersEach * writesEach // of each kind
	var want []string
	for n := 1; n <= each; n++ {
		want = append(want, fmt.Sprintf("v%d", n), fmt.Sprintf("auto-%d", n))
	}
	got := checkpointIDs(mustListCheckpoints(ctx, t, stores[1], sb.ID))
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("checkpoint ids = %v\nwant %v", got, want)
	}
	// The last number is not handed out again once its checkpoint goes.
	last := fmt.Sprintf("v%d", each)
	if err := stores[0].DeleteCheckpoint(ctx, sb.ID, last); err != nil {
		t.Fatalf("DeleteCheckpoint(%s): %v", last, err)
	}
	rec, err := update(ctx, stores[1], sb.ID, func(sb *store.Sandbox) { sb.CheckpointSeq++ })
	if err != nil {
		t.Fatalf("spending the next id: %v", err)
	}
	if rec.CheckpointSeq != each+1 {
		t.Errorf("after deleting %s the next number is %d, want %d", last, rec.CheckpointSeq, each+1)
	}
}
