package sandbox

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// TestOperationNames: the operations read in a conflict as they always
// have (docs and clients quote them), and only restore, create and sleep
// hold a sandbox's URL.
func TestOperationNames(t *testing.T) {
	for _, tc := range []struct {
		op       operation
		name     string
		holdsURL bool
	}{
		{opCreate, "create", true},
		{opDelete, "delete", false},
		{opCheckpoint, "a checkpoint", false},
		{opCheckpointDelete, "a checkpoint delete", false},
		{opRestore, "a restore", true},
		{opBoot, "a boot", false},
		{opSleep, "a sleep", true},
		{opWake, "a wake", false},
		{opUpdate, "an update", false},
		{opNetwork, "network change", false},
		{opDeath, "a check of its sandbox process", false},
		{opRecover, "a recovery", false},
	} {
		if got := tc.op.String(); got != tc.name {
			t.Errorf("operation %d reads %q, want %q", tc.op, got, tc.name)
		}
		if got := tc.op.holdsURL(); got != tc.holdsURL {
			t.Errorf("%s: holdsURL %v, want %v", tc.op, got, tc.holdsURL)
		}
	}
	m := &Manager{}
	sb := &store.Sandbox{Sandbox: api.Sandbox{ID: "sb-1", Name: "one"}}
	end, err := m.begin(sb, opRestore)
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.begin(sb, opSleep)
	if !errors.Is(err, api.ErrConflict) || err.Error() != "conflict: sandbox one is busy: a restore is in progress" {
		t.Errorf("second operation: %v", err)
	}
	_, done := m.live(sb.ID).current()
	end()
	select {
	case <-done:
	default:
		t.Error("the operation's done channel is open after its end")
	}
}

// TestLiveWakeOnce: callers that ask for a wake at once share one, and a
// follower that gives up leaves it running.
func TestLiveWakeOnce(t *testing.T) {
	l := &live{id: "sb-1"}
	var runs atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{})
	wantErr := errors.New("boom")
	do := func() error {
		runs.Add(1)
		close(started)
		<-release
		return wantErr
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	wg.Go(func() { errs <- l.wake(context.Background(), do) })
	<-started
	for range 3 {
		wg.Go(func() { errs <- l.wake(context.Background(), do) })
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.wake(ctx, do); !errors.Is(err, context.Canceled) {
		t.Errorf("a follower whose ctx ended: %v", err)
	}
	// The followers wait on the leader's wake before it ends.
	for {
		l.mu.Lock()
		n := l.waiters
		l.mu.Unlock()
		if n == 3 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, wantErr) {
			t.Errorf("a caller got %v, want the wake's error", err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("%d wakes ran, want 1", n)
	}
}

// TestManagerClose: Close waits for the goroutines begun with deaths.goBG, and
// none begins after it.
func TestManagerClose(t *testing.T) {
	m := New(Config{}, nil, nil, nil, nil, nil, nil)
	ended := make(chan struct{})
	if !m.deaths.goBG(func() {
		<-m.deaths.ctx.Done()
		time.Sleep(10 * time.Millisecond)
		close(ended)
	}) {
		t.Fatal("goBG refused before Close")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
	default:
		t.Fatal("Close returned before its goroutine ended")
	}
	if m.deaths.goBG(func() {}) {
		t.Error("goBG ran a goroutine after Close")
	}
}
