package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// testConcurrentWrites drives the store from many goroutines at once, writers
// and readers, then checks that every write landed whole. Under the race
// detector it also checks the store's own locking; a deadlock shows as the
// test binary's timeout.
func testConcurrentWrites(ctx context.Context, t *testing.T, st store.Store) {
	const (
		writers   = 8
		perWriter = 4
	)
	var (
		writersWG, readersWG sync.WaitGroup
		done                 = make(chan struct{})
	)
	for w := range writers {
		writersWG.Go(func() {
			for j := range perWriter {
				n := w*perWriter + j
				sb := newSandbox(n)
				if err := st.CreateSandbox(ctx, sb); err != nil {
					t.Errorf("CreateSandbox(%s): %v", sb.ID, err)
					return
				}
				for _, id := range []string{"v1", "v2", "v3"} {
					if err := st.CreateCheckpoint(ctx, newCheckpoint(sb, id, "name-"+id)); err != nil {
						t.Errorf("CreateCheckpoint(%s, %s): %v", sb.ID, id, err)
						return
					}
				}
				got, err := st.GetSandbox(ctx, "", sb.Name)
				if err != nil {
					t.Errorf("GetSandbox(%s): %v", sb.Name, err)
					return
				}
				got.State = api.StateStopped
				if err := st.UpdateSandbox(ctx, got); err != nil {
					t.Errorf("UpdateSandbox(%s): %v", sb.ID, err)
					return
				}
				if err := st.DeleteCheckpoint(ctx, sb.ID, "v2"); err != nil {
					t.Errorf("DeleteCheckpoint(%s, v2): %v", sb.ID, err)
					return
				}
				list, err := st.ListSandboxes(ctx, store.Filter{Labels: map[string]string{"n": fmt.Sprint(n)}})
				if err != nil || len(list) != 1 || list[0].ID != sb.ID {
					t.Errorf("ListSandboxes(n=%d) = %v, %v; want [%s]", n, sandboxIDs(list), err, sb.ID)
				}
			}
			// Each writer removes its first sandbox again.
			if err := st.DeleteSandbox(ctx, newSandbox(w*perWriter).ID); err != nil {
				t.Errorf("DeleteSandbox: %v", err)
			}
		})
	}
	for range 2 {
		readersWG.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if _, err := st.ListSandboxes(ctx, store.Filter{}); err != nil {
					t.Errorf("ListSandboxes: %v", err)
					return
				}
				if _, err := st.UsedNetIndexes(ctx, ""); err != nil {
					t.Errorf("UsedNetIndexes: %v", err)
					return
				}
			}
		})
	}
	writersWG.Wait()
	close(done)
	readersWG.Wait()
	if t.Failed() {
		return
	}

	var wantIDs []string
	var wantNets []int
	for w := range writers {
		for j := 1; j < perWriter; j++ {
			n := w*perWriter + j
			wantIDs = append(wantIDs, newSandbox(n).ID)
			wantNets = append(wantNets, n)
		}
	}
	list := mustListSandboxes(ctx, t, st, store.Filter{})
	if got := sandboxIDs(list); !slices.Equal(got, wantIDs) {
		t.Fatalf("ListSandboxes = %v, want %v", got, wantIDs)
	}
	for _, sb := range list {
		want := newSandbox(sb.NetIndex)
		want.State = api.StateStopped
		checkSandbox(t, sb.ID, sb, want)
		if got := checkpointIDs(mustListCheckpoints(ctx, t, st, sb.ID)); !slices.Equal(got, []string{"v1", "v3"}) {
			t.Errorf("ListCheckpoints(%s) = %v, want [v1 v3]", sb.ID, got)
		}
	}
	used, err := st.UsedNetIndexes(ctx, "")
	if err != nil {
		t.Fatalf("UsedNetIndexes: %v", err)
	}
	slices.Sort(used)
	if !slices.Equal(used, wantNets) {
		t.Errorf("UsedNetIndexes = %v, want %v", used, wantNets)
	}
}

// testConcurrentConflicts races creates of one name or id: exactly one of
// them may win.
func testConcurrentConflicts(ctx context.Context, t *testing.T, st store.Store) {
	const racers = 8
	race := func(what string, create func(i int) error) {
		t.Helper()
		var wins, losses atomic.Int32
		var wg sync.WaitGroup
		for i := range racers {
			wg.Go(func() {
				err := create(i)
				switch {
				case err == nil:
					wins.Add(1)
				case errors.Is(err, store.ErrExists):
					losses.Add(1)
				default:
					t.Errorf("%s #%d: %v", what, i, err)
				}
			})
		}
		wg.Wait()
		if wins.Load() != 1 || losses.Load() != racers-1 {
			t.Errorf("%s: %d succeeded and %d failed with ErrExists, want 1 and %d", what, wins.Load(), losses.Load(), racers-1)
		}
	}
	race("CreateSandbox with one name", func(i int) error {
		sb := newSandbox(i)
		sb.Name = "contested"
		return st.CreateSandbox(ctx, sb)
	})
	race("CreateSandbox with one id", func(i int) error {
		sb := newSandbox(100 + i)
		sb.ID = "sb-contested"
		return st.CreateSandbox(ctx, sb)
	})
	owner := mustGetSandbox(ctx, t, st, "contested")
	race("CreateCheckpoint with one id", func(i int) error {
		return st.CreateCheckpoint(ctx, newCheckpoint(owner, "v1", fmt.Sprintf("n%d", i)))
	})
	race("CreateCheckpoint with one name", func(i int) error {
		return st.CreateCheckpoint(ctx, newCheckpoint(owner, fmt.Sprintf("v%d", 10+i), "contested"))
	})
	if got := len(mustListSandboxes(ctx, t, st, store.Filter{})); got != 2 {
		t.Errorf("ListSandboxes has %d sandboxes, want 2", got)
	}
	if got := len(mustListCheckpoints(ctx, t, st, owner.ID)); got != 2 {
		t.Errorf("ListCheckpoints has %d checkpoints, want 2", got)
	}
}

// testReopen: everything written before a Close is there after reopening,
// and the store still keeps its promises (order, conflicts, cascades).
func testReopen(ctx context.Context, t *testing.T, c *config) {
	st := c.newStore(t)
	closed := false
	t.Cleanup(func() {
		if !closed {
			st.Close()
		}
	})

	fork := newSandbox(2)
	fork.From = &api.ForkSource{Sandbox: "box-1", Checkpoint: "v2"}
	bare := newSandbox(3)
	bare.Env, bare.Labels = nil, nil
	sandboxes := []*store.Sandbox{newSandbox(1), fork, bare}
	for _, sb := range sandboxes {
		mustCreateSandbox(ctx, t, st, sb)
	}
	gone := newSandbox(4)
	mustCreateSandbox(ctx, t, st, gone)
	mustCreateCheckpoint(ctx, t, st, newCheckpoint(gone, "v1", ""))
	if err := st.DeleteSandbox(ctx, gone.ID); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	checkpoints := map[string][]*store.Checkpoint{}
	for _, sb := range sandboxes[:2] {
		for _, id := range []string{"v2", "v10", "auto-1", "v1"} {
			cp := newCheckpoint(sb, id, "")
			if id == "v10" {
				cp.Name = "ten"
			}
			mustCreateCheckpoint(ctx, t, st, cp)
			if id != "auto-1" {
				checkpoints[sb.ID] = append(checkpoints[sb.ID], cp)
			}
		}
		if err := st.DeleteCheckpoint(ctx, sb.ID, "auto-1"); err != nil {
			t.Fatalf("DeleteCheckpoint: %v", err)
		}
	}

	if err := st.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	closed = true
	st = c.reopen(t, st)
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("closing reopened store: %v", err)
		}
	})

	list := mustListSandboxes(ctx, t, st, store.Filter{})
	if len(list) != len(sandboxes) {
		t.Fatalf("ListSandboxes after reopen = %v, want %v", sandboxIDs(list), sandboxIDs(sandboxes))
	}
	for i, want := range sandboxes {
		checkSandbox(t, "after reopen", list[i], want)
		got := mustListCheckpoints(ctx, t, st, want.ID)
		if len(got) != len(checkpoints[want.ID]) {
			t.Fatalf("ListCheckpoints(%s) after reopen = %v, want %v", want.ID, checkpointIDs(got), checkpointIDs(checkpoints[want.ID]))
		}
		for j, cp := range checkpoints[want.ID] {
			checkCheckpoint(t, "after reopen", got[j], cp)
		}
	}
	checkCheckpoint(t, "by name after reopen", mustGetCheckpoint(ctx, t, st, "sb-001", "ten"), checkpoints["sb-001"][1])
	used, err := st.UsedNetIndexes(ctx, "")
	slices.Sort(used)
	if err != nil || !slices.Equal(used, []int{1, 2, 3}) {
		t.Errorf("UsedNetIndexes after reopen = %v, %v; want [1 2 3]", used, err)
	}

	// Promises still kept after the reopen.
	wantErr(t, "CreateSandbox with a taken name", st.CreateSandbox(ctx, newSandbox(1)), store.ErrExists)
	wantErr(t, "CreateCheckpoint with a taken name", st.CreateCheckpoint(ctx, newCheckpoint(sandboxes[0], "v20", "ten")), store.ErrExists)
	wantErr(t, "CreateCheckpoint of a deleted sandbox", st.CreateCheckpoint(ctx, newCheckpoint(gone, "v2", "")), store.ErrNotFound)
	mustCreateCheckpoint(ctx, t, st, newCheckpoint(sandboxes[0], "auto-1", ""))
	if got, want := checkpointIDs(mustListCheckpoints(ctx, t, st, "sb-001")), []string{"v2", "v10", "v1", "auto-1"}; !slices.Equal(got, want) {
		t.Errorf("ListCheckpoints after reopen and create = %v, want %v", got, want)
	}
	if err := st.DeleteSandbox(ctx, "sb-002"); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	_, err = st.ListCheckpoints(ctx, "sb-002")
	wantErr(t, "ListCheckpoints of a deleted sandbox", err, store.ErrNotFound)
	if got := mustListCheckpoints(ctx, t, st, "sb-001"); len(got) != 4 {
		t.Errorf("ListCheckpoints(sb-001) after deleting another sandbox = %v, want 4", checkpointIDs(got))
	}
}
