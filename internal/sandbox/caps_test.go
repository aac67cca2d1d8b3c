package sandbox_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/sandbox"
)

// TestMaxSandboxes: the cap counts every sandbox a user has, sleeping ones
// included, and creates in flight; a create beyond answers limit, and a
// delete makes room again.
func TestMaxSandboxes(t *testing.T) {
	e := newEnv(t, func(c *sandbox.Config) { c.MaxSandboxes = 2 })
	e.create(api.CreateSandbox{Name: "one"})
	e.create(api.CreateSandbox{Name: "two"})
	if _, err := e.m.Sleep(e.ctx, "two"); err != nil {
		t.Fatal(err)
	}
	_, err := e.m.Create(e.ctx, api.CreateSandbox{Name: "three"})
	if !errors.Is(err, api.ErrLimit) {
		t.Fatalf("a third create under a cap of 2: %v, want limit", err)
	}
	t.Logf("refused: %v", err)
	if err := e.m.Delete(e.ctx, "one"); err != nil {
		t.Fatal(err)
	}
	e.create(api.CreateSandbox{Name: "three"})

	// Two creates at once for the one place left: one of them gets it.
	if err := e.m.Delete(e.ctx, "three"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, name := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = e.m.Create(e.ctx, api.CreateSandbox{Name: name})
		}()
	}
	wg.Wait()
	ok, limited := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, api.ErrLimit):
			limited++
		default:
			t.Errorf("concurrent create: %v", err)
		}
	}
	if ok != 1 || limited != 1 {
		t.Errorf("two creates for one place: %d made, %d refused (%v)", ok, limited, errs)
	}
}

// TestMaxHeavy: with one slot, a heavy operation that comes while another
// runs waits for it, and answers limit when it does not end in time; the
// slot is given back on every way out.
func TestMaxHeavy(t *testing.T) {
	// The wait is long enough for the slow create to end within it once
	// released, also on a loaded machine (300 ms was not, with a CI run beside it).
	const wait = 2 * time.Second
	e := newEnv(t, func(c *sandbox.Config) { c.MaxHeavy = 1; c.HeavyWait = wait })
	e.create(api.CreateSandbox{Name: "busy"})

	// A create held inside the runtime keeps the only slot.
	release := make(chan struct{})
	started := make(chan struct{})
	var once sync.Once
	e.rt.SetHook(func(op, id string) {
		if op == "start" {
			once.Do(func() { close(started); <-release })
		}
	})
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Create(e.ctx, api.CreateSandbox{Name: "slow"})
		done <- err
	}()
	<-started
	memory := false
	begin := time.Now()
	_, err := e.cps.CreateCheckpoint(e.ctx, "busy", api.CreateCheckpoint{Memory: &memory})
	if !errors.Is(err, api.ErrLimit) {
		t.Fatalf("a checkpoint while the only slot is taken: %v, want limit", err)
	}
	if waited := time.Since(begin); waited < wait {
		t.Errorf("refused after %s, before the wait of %s", waited, wait)
	}
	t.Logf("refused: %v", err)

	// One that comes while the slot is taken, and gets it once it is free.
	got := make(chan error, 1)
	go func() {
		_, err := e.cps.CreateCheckpoint(e.ctx, "busy", api.CreateCheckpoint{Memory: &memory})
		got <- err
	}()
	// Only once it waits for the slot does the test show what it claims.
	eventually(t, "waiting for the slot", func() bool { return e.m.HeavyWaiters() == 1 })
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("the slow create: %v", err)
	}
	if err := <-got; err != nil {
		t.Errorf("a checkpoint that waited for the slot: %v", err)
	}
	// A failed operation gives its slot back too.
	if _, err := e.cps.RestoreCheckpoint(e.ctx, "busy", "no-such"); err == nil || errors.Is(err, api.ErrLimit) {
		t.Errorf("restore of a missing checkpoint: %v, want not found", err)
	}
	e.checkpoint("busy", false)
}
