package sandbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/runtime/fake"
	"loam.dev/loam/internal/store"
)

// auditLog is the env's store as the audit log: records written, listed.
type auditLog interface {
	store.AuditWriter
	ListAudit(ctx context.Context, f store.AuditFilter) ([]api.AuditEvent, error)
}

// audited returns ctx carrying the record of a call of action on target,
// as the API's auth gives a call that may change something.
func (e *env) audited(action, target string) (context.Context, *store.AuditCall) {
	log := e.st.Store.(auditLog)
	call := store.NewAuditCall(api.AuditEvent{Time: store.Now(), Org: e.cfg.Org, Key: "test", Action: action, Target: target}, log)
	return store.WithAudit(e.ctx, call), call
}

// records are the audit log's records of action.
func (e *env) records(action string) []api.AuditEvent {
	e.t.Helper()
	evs, err := e.st.Store.(auditLog).ListAudit(context.WithoutCancel(e.ctx), store.AuditFilter{Action: action})
	if err != nil {
		e.t.Fatal(err)
	}
	return evs
}

// whileIn counts the records of action each time the runtime runs op: what
// a crash there would leave in the log.
func (e *env) whileIn(op, action string) (counts func() []int) {
	var mu sync.Mutex
	var seen []int
	e.rt.SetHook(func(o, id string) {
		if o == op {
			n := len(e.records(action))
			mu.Lock()
			seen = append(seen, n)
			mu.Unlock()
		}
	})
	return func() []int {
		e.rt.SetHook(nil)
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

// wantOne checks that action has one record of target, of outcome.
func (e *env) wantOne(action, outcome, target string) {
	e.t.Helper()
	var of []api.AuditEvent
	for _, ev := range e.records(action) {
		if ev.Target == target {
			of = append(of, ev)
		}
	}
	if len(of) != 1 || of[0].Outcome != outcome {
		e.t.Errorf("%s records of %s: %+v, want one %s", action, target, of, outcome)
	}
}

// TestAuditWithTheChange: a create, fork, wake and restore write their
// record with the write that makes their change, not with their first
// write, so that a crash part-way (the runtime's step, here) leaves none
// for a change recovery undoes; one that fails is recorded with its error.
func TestAuditWithTheChange(t *testing.T) {
	e := newEnv(t)
	noneYet := func(what string, counts []int) {
		t.Helper()
		if len(counts) == 0 {
			t.Fatalf("%s: the runtime's step never ran", what)
		}
		for _, n := range counts {
			if n != 0 {
				t.Errorf("%s: %d records while the runtime's step ran, want none yet", what, n)
			}
		}
	}

	ctx, call := e.audited("sandbox.create", "sandboxes")
	counts := e.whileIn(fake.OpStart, "sandbox.create")
	_, err := e.m.Create(ctx, api.CreateSandbox{Name: "one"})
	noneYet("create", counts())
	if err != nil {
		t.Fatal(err)
	}
	call.Finish(ctx, "ok")
	e.wantOne("sandbox.create", "ok", "sandboxes/one")

	ctx, call = e.audited("sandbox.create", "sandboxes")
	e.rt.FailNext(fake.OpStart, errors.New("injected"))
	if _, err := e.m.Create(ctx, api.CreateSandbox{Name: "broken"}); err == nil {
		t.Fatal("a create whose start fails made a sandbox")
	}
	call.Finish(ctx, "internal")
	e.wantOne("sandbox.create", "internal", "sandboxes/broken")

	cp, err := e.cps.CreateCheckpoint(e.ctx, "one", api.CreateCheckpoint{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, call = e.audited("sandbox.fork", "sandboxes")
	counts = e.whileIn(fake.OpRestore, "sandbox.fork")
	_, err = e.m.Create(ctx, api.CreateSandbox{Name: "forked", From: &api.ForkSource{Sandbox: "one", Checkpoint: cp.ID}})
	noneYet("fork", counts())
	if err != nil {
		t.Fatal(err)
	}
	call.Finish(ctx, "ok")
	e.wantOne("sandbox.fork", "ok", "sandboxes/forked")

	if _, err := e.m.Sleep(e.ctx, "one"); err != nil {
		t.Fatal(err)
	}
	ctx, call = e.audited("sandbox.wake", "sandboxes/one/wake")
	counts = e.whileIn(fake.OpRestore, "sandbox.wake")
	_, err = e.m.Wake(ctx, "one")
	noneYet("wake", counts())
	if err != nil {
		t.Fatal(err)
	}
	call.Finish(ctx, "ok")
	e.wantOne("sandbox.wake", "ok", "sandboxes/one/wake")

	// A restore's change is made once the state before it is kept (the
	// automatic checkpoint's record).
	target := "sandboxes/one/checkpoints/" + cp.ID + "/restore"
	ctx, call = e.audited("checkpoint.restore", target)
	counts = e.whileIn(fake.OpCheckpoint, "checkpoint.restore")
	_, err = e.cps.RestoreCheckpoint(ctx, "one", cp.ID)
	noneYet("restore", counts())
	if err != nil {
		t.Fatal(err)
	}
	call.Finish(ctx, "ok")
	e.wantOne("checkpoint.restore", "ok", target)
}
