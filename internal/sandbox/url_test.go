package sandbox_test

import (
	"errors"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/sandbox"
)

// TestHTTPTarget: the front door's target is the running sandbox by name,
// with its access token; a request that asks during a restore is held
// until the restore ends, and then has a newer epoch.
func TestHTTPTarget(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "web", HTTPPort: 3000})
	tg, err := e.m.HTTPTarget(e.ctx, "", "web", nil)
	if err != nil {
		t.Fatal(err)
	}
	if tg.ID != sb.ID || tg.Name != "web" || tg.Addr.Port() != 3000 || tg.Public || tg.Held ||
		tg.AccessToken != sandbox.AccessToken(e.cfg.Secret, sb.ID) {
		t.Fatalf("target: %+v", tg)
	}
	at, err := e.m.AccessToken(e.ctx, "web")
	if err != nil || at.AccessToken != tg.AccessToken || at.URL != "https://web--acme.loam.test" {
		t.Fatalf("access token: %+v, %v", at, err)
	}
	for _, ref := range []string{"nope", sb.ID} {
		if _, err := e.m.HTTPTarget(e.ctx, "", ref, nil); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("HTTPTarget(%q): %v, want not_found (URLs carry names)", ref, err)
		}
	}
	e.create(api.CreateSandbox{Name: "other", Public: true})
	if ot, err := e.m.HTTPTarget(e.ctx, "", "other", nil); err != nil || !ot.Public || ot.AccessToken == tg.AccessToken {
		t.Fatalf("another sandbox's target: %+v, %v", ot, err)
	}

	cp := e.checkpoint("web", false)
	type result struct {
		tg  sandbox.Target
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	e.rt.SetHook(func(op, id string) {
		if op != "delete" || id != sb.ID {
			return
		}
		e.rt.SetHook(nil)
		go func() {
			tg, err := e.m.HTTPTarget(e.ctx, "", "web", nil)
			got <- result{tg, err, time.Now()}
		}()
		// The request must be held by the restore before it goes on.
		eventually(t, "holding the request", func() bool { return e.m.OpWaiters(sb.ID) == 1 })
	})
	if _, err := e.cps.RestoreCheckpoint(e.ctx, "web", cp.ID); err != nil {
		t.Fatal(err)
	}
	restored := time.Now()
	r := <-got
	if r.err != nil || !r.tg.Held || r.tg.Epoch <= tg.Epoch || r.at.Before(restored.Add(-50*time.Millisecond)) {
		t.Fatalf("during the restore: %+v, %v, answered %v before the restore ended", r.tg, r.err, restored.Sub(r.at))
	}
}
