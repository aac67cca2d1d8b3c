package postgres

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/postgres/pgtest"
)

// TestRestartUnderLoad: PostgreSQL crashed (an immediate shutdown: no
// checkpoint, the WAL replayed at the start) and started again while
// writers create sandboxes, take their checkpoints and
// delete some: the calls it cuts fail with unavailable and nothing else,
// the store works again once it is back, and every change it acknowledged
// is there after, as acknowledged: no acknowledged create, checkpoint or
// delete is lost.
func TestRestartUnderLoad(t *testing.T) {
	s := openNew(t)
	ctx := t.Context()
	srv := pgtest.Shared()

	var (
		mu      sync.Mutex
		created = map[string]bool{}            // acknowledged creates
		deleted = map[string]bool{}            // acknowledged deletes
		tried   = map[string]bool{}            // deletes asked for
		cps     = map[string]map[string]bool{} // acknowledged checkpoints
		acks    atomic.Int64
		cut     atomic.Int64
		others  = make(chan error, 100)
	)
	// call runs one change; an error must be unavailable.
	call := func(err error) bool {
		if err == nil {
			acks.Add(1)
			return true
		}
		if errors.Is(err, api.ErrUnavailable) {
			cut.Add(1)
		} else {
			select {
			case others <- err:
			default:
			}
		}
		return false
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				sb := &store.Sandbox{}
				sb.ID, sb.Name, sb.Org, sb.State, sb.CreatedAt = fmt.Sprintf("sb-w%d-%d", w, i), fmt.Sprintf("w%d-%d", w, i), "default", api.StateRunning, store.Now()
				if !call(s.CreateSandbox(ctx, sb)) {
					continue
				}
				mu.Lock()
				created[sb.ID] = true
				cps[sb.ID] = map[string]bool{}
				mu.Unlock()
				for _, id := range []string{"v1", "v2"} {
					cp := &store.Checkpoint{}
					cp.ID, cp.Sandbox, cp.SandboxName, cp.CreatedAt = id, sb.ID, sb.Name, store.Now()
					if call(s.CreateCheckpoint(ctx, cp)) {
						mu.Lock()
						cps[sb.ID][id] = true
						mu.Unlock()
					}
				}
				if i%3 != 0 {
					continue
				}
				mu.Lock()
				tried[sb.ID] = true
				mu.Unlock()
				if call(s.DeleteSandbox(ctx, sb.ID)) {
					mu.Lock()
					deleted[sb.ID] = true
					mu.Unlock()
				}
			}
		})
	}
	// waitAcks waits until n more changes were acknowledged.
	waitAcks := func(what string, n int64) {
		t.Helper()
		want := acks.Load() + n
		deadline := time.Now().Add(30 * time.Second)
		for acks.Load() < want {
			if time.Now().After(deadline) {
				close(stop)
				wg.Wait()
				t.Fatalf("%s: %d changes acknowledged, want %d", what, acks.Load(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitAcks("the load before the restart", 200)
	if err := srv.Crash(); err != nil {
		t.Fatal(err)
	}
	// The writers meet the server gone for a while.
	for cutBefore, deadline := cut.Load(), time.Now().Add(30*time.Second); cut.Load() < cutBefore+20; {
		if time.Now().After(deadline) {
			t.Error("no call was cut in 30 s with the server down")
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	waitAcks("the load after the restart", 200)
	close(stop)
	wg.Wait()
	close(others)
	for err := range others {
		t.Errorf("a call the restart cut: %v, want unavailable", err)
	}

	mu.Lock()
	defer mu.Unlock()
	for id := range created {
		sb, err := s.GetSandbox(ctx, "", id)
		if deleted[id] {
			if !errors.Is(err, store.ErrNotFound) {
				t.Errorf("sandbox %s, whose delete was acknowledged: %v, want not found", id, err)
			}
			continue
		}
		if errors.Is(err, store.ErrNotFound) && tried[id] {
			continue // a delete the restart cut may have been made
		}
		if err != nil {
			t.Errorf("sandbox %s, whose create was acknowledged: %v", id, err)
			continue
		}
		list, err := s.ListCheckpoints(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		have := map[string]bool{}
		for _, cp := range list {
			have[cp.ID] = true
		}
		for cp := range cps[id] {
			if !have[cp] {
				t.Errorf("checkpoint %s of %s, whose create was acknowledged, is missing", cp, id)
			}
		}
	}
	t.Logf("%d changes acknowledged (%d creates, %d deletes), %d cut by the restart", acks.Load(), len(created), len(deleted), cut.Load())
}
