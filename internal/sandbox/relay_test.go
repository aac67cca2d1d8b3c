package sandbox_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/sandbox"
)

// TestRelay: the one entry point to a sandbox's agent wakes a sleeping
// sandbox, counts a call as activity until it ends, lets a memory
// checkpoint cut the calls that ask for it and only those, and refuses a
// call that needs a newer agent than the sandbox runs.
func TestRelay(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "r", Idle: "1m"})
	if _, err := e.m.Sleep(e.ctx, "r"); err != nil {
		t.Fatal(err)
	}
	c, err := e.m.Relay(e.ctx, "r", sandbox.Need{})
	if err != nil {
		t.Fatalf("Relay to a sleeping sandbox: %v", err)
	}
	e.awake(sb.ID)
	if c.Sandbox.State != api.StateRunning || c.Agent == nil {
		t.Fatalf("Relay gave %+v", c.Sandbox)
	}
	must(t, e.sleep.SleepIdle(e.ctx, time.Now().Add(time.Hour)))
	if e.record(sb.ID).State != api.StateRunning {
		t.Fatal("slept with a call in flight")
	}
	c.End()
	c.End()
	if c.Ctx.Err() == nil {
		t.Error("a call's context outlived its End")
	}
	must(t, e.sleep.SleepIdle(e.ctx, time.Now().Add(2*time.Minute)))
	e.sleeping(sb.ID)

	cut, err := e.m.Relay(e.ctx, "r", sandbox.Need{Cut: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cut.End()
	kept, err := e.m.Relay(e.ctx, "r", sandbox.Need{})
	if err != nil {
		t.Fatal(err)
	}
	defer kept.End()
	e.checkpoint("r", true)
	select {
	case <-cut.Ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a memory checkpoint did not cut a call that asked for it")
	}
	if !strings.Contains(cut.Cut(), "checkpointed") {
		t.Errorf("cut call: reason %q", cut.Cut())
	}
	if kept.Ctx.Err() != nil || kept.Cut() != "" {
		t.Errorf("a memory checkpoint cut a call that did not ask for it: %v %q", kept.Ctx.Err(), kept.Cut())
	}

	e.m.SetAgentVersion(sb.ID, 2)
	_, err = e.m.Relay(e.ctx, "r", sandbox.Need{Protocol: 3, What: "the thing"})
	if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "the thing needs a newer agent than sandbox r runs (protocol 2, needs 3)") {
		t.Errorf("an old agent: %v", err)
	}
	if _, err := e.m.Relay(e.ctx, "nope", sandbox.Need{}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("no such sandbox: %v", err)
	}
}
