package test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// TestRacingLifecycle has many clients race checkpoint, restore, fork,
// sleep, wake and delete on one sandbox. Every answer is a success or a
// conflict (not_found once the sandbox is deleted); afterwards the sandbox
// is in a valid state, every listed checkpoint restores, and no fork,
// volume, snapshot or checkpoint directory is left over; after the delete,
// nothing of the sandbox is left.
func TestRacingLifecycle(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t, "--checkpoint-limit", "100")
	ctx := harness.Ctx(t)
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "race"})
	if err != nil {
		t.Fatal(err)
	}
	d.Run("race", "sh", "-c", "echo v0 > mark")
	if _, err := d.C.CreateCheckpoint(ctx, "race", api.CreateCheckpoint{Name: "base"}); err != nil {
		t.Fatal(err)
	}

	var deleting, deleted atomic.Bool
	var mu sync.Mutex
	answers := map[string]int{}
	samples := map[string]string{} // a conflict's message, by kind
	var forks []string
	// userCheckpoint picks one of the user's checkpoints (automatic ones
	// are pruned by restores as they go).
	userCheckpoint := func(r *rand.Rand) string {
		cps, err := d.C.ListCheckpoints(ctx, "race")
		if err != nil {
			return "base"
		}
		var ids []string
		for _, cp := range cps {
			if !cp.Auto {
				ids = append(ids, cp.ID)
			}
		}
		if len(ids) == 0 {
			return "base"
		}
		return ids[r.IntN(len(ids))]
	}
	op := func(r *rand.Rand, g, i int, kind string) {
		var err error
		switch kind {
		case "checkpoint":
			mem := r.IntN(3) > 0
			_, err = d.C.CreateCheckpoint(ctx, "race", api.CreateCheckpoint{Memory: &mem})
		case "restore":
			_, err = d.C.RestoreCheckpoint(ctx, "race", userCheckpoint(r))
		case "fork":
			name := fmt.Sprintf("fork-%d-%d", g, i)
			_, err = d.C.Fork(ctx, "race", userCheckpoint(r), name)
			if err == nil {
				if derr := d.C.DeleteSandbox(ctx, name); derr != nil {
					mu.Lock()
					forks = append(forks, name)
					mu.Unlock()
					t.Errorf("deleting fork %s: %v", name, derr)
				}
			}
		case "sleep":
			_, err = d.C.Sleep(ctx, "race")
		case "wake":
			_, err = d.C.Wake(ctx, "race")
		case "delete":
			// From the moment a delete is asked for, the sandbox and its
			// checkpoints may be gone to the others.
			deleting.Store(true)
			err = d.C.DeleteSandbox(ctx, "race")
			if err == nil {
				deleted.Store(true)
			}
		}
		answer := "ok"
		switch {
		case err == nil:
		case errors.Is(err, api.ErrConflict):
			answer = "conflict"
			mu.Lock()
			if samples[kind] == "" {
				samples[kind] = err.Error()
			}
			mu.Unlock()
		case errors.Is(err, api.ErrNotFound) && deleting.Load():
			answer = "not_found"
		default:
			t.Errorf("%s: %v; want success or conflict", kind, err)
			answer = "other"
		}
		mu.Lock()
		answers[kind+" "+answer]++
		mu.Unlock()
	}
	kinds := []string{"checkpoint", "restore", "fork", "sleep", "wake"}
	race := func(goroutines, ops int, extra func(g, i int) string) {
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(g), 7))
				for i := range ops {
					kind := kinds[r.IntN(len(kinds))]
					if k := extra(g, i); k != "" {
						kind = k
					}
					op(r, g, i, kind)
				}
			}()
		}
		wg.Wait()
	}

	// Round one: no delete.
	race(10, 8, func(int, int) string { return "" })
	got, err := d.C.GetSandbox(ctx, "race")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != api.StateRunning && got.State != api.StateSleeping {
		t.Fatalf("after the race the sandbox is %s; want running or sleeping", got.State)
	}
	cps, err := d.C.ListCheckpoints(ctx, "race")
	if err != nil {
		t.Fatal(err)
	}
	checkLeftovers(t, d, sb.ID, cps)
	// Every listed checkpoint restores, and the sandbox then answers.
	// Automatic ones first: each restore keeps one more and prunes the
	// oldest beyond the few kept, which may be one listed.
	slices.SortStableFunc(cps, func(a, b api.Checkpoint) int {
		if a.Auto == b.Auto {
			return 0
		}
		if a.Auto {
			return -1
		}
		return 1
	})
	restored, pruned := 0, 0
	for _, cp := range cps {
		_, err := d.C.RestoreCheckpoint(ctx, "race", cp.ID)
		if cp.Auto && errors.Is(err, api.ErrNotFound) {
			pruned++
			continue
		}
		if err != nil {
			t.Errorf("restoring %s (memory %v) after the race: %v", cp.ID, cp.Memory, err)
			continue
		}
		restored++
		if out := d.Run("race", "cat", "mark"); strings.TrimSpace(out) != "v0" {
			t.Errorf("after restoring %s, mark is %q", cp.ID, out)
		}
	}
	if cps, err = d.C.ListCheckpoints(ctx, "race"); err != nil {
		t.Fatal(err)
	}
	checkLeftovers(t, d, sb.ID, cps)

	// Round two: one client deletes the sandbox while the others race,
	// trying again on conflict until it is gone.
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := rand.New(rand.NewPCG(99, 7))
		for i := 0; !deleted.Load() && i < 200; i++ {
			op(r, 99, i, "delete")
			time.Sleep(50 * time.Millisecond)
		}
	}()
	race(6, 6, func(int, int) string { return "" })
	<-done
	if !deleted.Load() {
		t.Fatal("the sandbox was never deleted")
	}
	if _, err := d.C.GetSandbox(ctx, "race"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("after the delete: %v, want not_found", err)
	}
	checkLeftovers(t, d, sb.ID, nil)
	var keys []string
	for k := range answers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%d", k, answers[k])
	}
	t.Logf("answers:%s; %d checkpoints restored after the race (%d automatic ones pruned by those restores)", b.String(), restored, pruned)
	for k, v := range samples {
		t.Logf("a conflict of %s: %s", k, v)
	}
}

// checkLeftovers checks that the daemon holds for sandbox id exactly the
// checkpoints cps (data directories and disk snapshots, no temp
// directories) and no sandbox, volume or snapshot of a fork.
func checkLeftovers(t *testing.T, d *harness.Daemon, id string, cps []api.Checkpoint) {
	t.Helper()
	sbs, err := d.C.ListSandboxes(harness.Ctx(t), client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sb := range sbs {
		names = append(names, sb.Name)
	}
	want := []string{"race"}
	if cps == nil {
		want = nil
	}
	if !slices.Equal(names, want) {
		t.Errorf("sandboxes %v; want %v", names, want)
	}
	var ids []string
	for _, cp := range cps {
		ids = append(ids, cp.ID)
	}
	sort.Strings(ids)
	ls := func(dir string) []string {
		ents, _ := os.ReadDir(dir)
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		sort.Strings(out)
		return out
	}
	if got := ls(filepath.Join(d.DataDir, "checkpoints", id)); !slices.Equal(got, ids) {
		t.Errorf("checkpoint directories %v; want %v", got, ids)
	}
	pool := filepath.Join(d.DataDir, "disk", "mnt")
	var snaps []string
	for _, s := range ls(filepath.Join(pool, "snapshots")) {
		snaps = append(snaps, strings.TrimPrefix(s, id+"."))
	}
	if !slices.Equal(snaps, ids) {
		t.Errorf("disk snapshots %v; want %v", snaps, ids)
	}
	vols := ls(filepath.Join(pool, "volumes"))
	wantVols := []string{id}
	if cps == nil {
		wantVols = nil
	}
	if !slices.Equal(vols, wantVols) {
		t.Errorf("volumes %v; want %v", vols, wantVols)
	}
}
