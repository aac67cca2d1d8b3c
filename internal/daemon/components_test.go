package daemon

import (
	"context"
	"errors"
	"loam.dev/loam/internal/testenv"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// slowToEnd is a component that, once its ctx ends, waits for a goroutine
// of its own that takes a while to finish, then records that it ended.
func slowToEnd(name string, delay time.Duration, ended *atomic.Bool) component {
	return component{name, func(ctx context.Context) error {
		var wg sync.WaitGroup
		wg.Go(func() {
			<-ctx.Done()
			time.Sleep(delay) // work still under way when the stop comes
		})
		wg.Wait()
		ended.Store(true)
		return nil
	}}
}

// TestCloseWaitsForComponents: Close returns only once every component has
// ended, those started in a later step (as the API server is) too, and
// then Wait reports no failure.
func TestCloseWaitsForComponents(t *testing.T) {
	d := &Daemon{log: slog.New(slog.DiscardHandler)}
	var ended [4]atomic.Bool
	d.runComponents(t.Context(),
		slowToEnd("a", 0, &ended[0]),
		slowToEnd("b", 50*time.Millisecond, &ended[1]),
		slowToEnd("c", 100*time.Millisecond, &ended[2]),
	)
	d.runComponents(t.Context(), slowToEnd("later", 150*time.Millisecond, &ended[3]))
	// A component done with its work early (the default template) stops
	// nothing.
	d.runComponents(t.Context(), component{"done early", func(context.Context) error { return nil }})
	select {
	case <-d.running.Done():
		t.Fatal("the components' ctx ended before Close")
	case <-time.After(20 * time.Millisecond):
	}
	for i := range ended {
		if ended[i].Load() {
			t.Fatalf("component %d ended before Close", i)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range ended {
		if !ended[i].Load() {
			t.Errorf("component %d still running after Close", i)
		}
	}
	if err := d.Wait(t.Context()); err != nil {
		t.Errorf("Wait after Close: %v, want nil", err)
	}
}

// TestComponentFailure: a component's failure is logged, ends the other
// components' ctx, and is what Wait returns, naming the component.
func TestComponentFailure(t *testing.T) {
	var logged testenv.SyncBuffer
	d := &Daemon{log: slog.New(slog.NewTextHandler(&logged, nil))}
	boom := errors.New("boom")
	fail := make(chan struct{})
	var otherEnded atomic.Bool
	d.runComponents(t.Context(),
		component{"fails", func(ctx context.Context) error {
			<-fail
			return boom
		}},
		slowToEnd("other", 0, &otherEnded),
	)
	waited := make(chan error, 1)
	go func() { waited <- d.Wait(t.Context()) }()
	select {
	case err := <-waited:
		t.Fatalf("Wait returned %v before any component failed", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(fail)
	select {
	case err := <-waited:
		if !errors.Is(err, boom) || !strings.Contains(err.Error(), "fails") {
			t.Errorf("Wait: %v, want boom, naming the component", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait still waiting 10 s after a component failed")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if !otherEnded.Load() {
		t.Error("the other component still running after Close")
	}
	if log := logged.String(); !strings.Contains(log, "a component failed") || !strings.Contains(log, "component=fails") || !strings.Contains(log, "boom") {
		t.Errorf("the failure is not logged: %s", log)
	}
}

// TestWaitEndsWithCtx: Wait returns nil when its ctx ends (a signal), the
// components still running until Close.
func TestWaitEndsWithCtx(t *testing.T) {
	d := &Daemon{log: slog.New(slog.DiscardHandler)}
	var ended atomic.Bool
	d.runComponents(t.Context(), slowToEnd("a", 0, &ended))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := d.Wait(ctx); err != nil {
		t.Errorf("Wait: %v, want nil", err)
	}
	if ended.Load() {
		t.Error("the component ended before Close")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if !ended.Load() {
		t.Error("the component still running after Close")
	}
}
