package sandbox_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/sandbox"
)

// TestInsideCannotEraseTheOwnersCheckpoints: a sandbox, through its own
// API, may create, list, read and restore checkpoints, and delete only the
// ones it took; the owner's checkpoints and every automatic one stay, and
// its restores push out only the automatic checkpoints its own restores
// kept.
func TestInsideCannotEraseTheOwnersCheckpoints(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "self"})
	inside := checkpoint.WithCaller(e.ctx, checkpoint.Inside)

	owners := e.checkpoint("self", true) // v1, the owner's
	// Two restores by the owner: auto-1 and auto-2 are the owner's undo points.
	for range 2 {
		if _, err := e.cps.RestoreCheckpoint(e.ctx, "self", owners.ID); err != nil {
			t.Fatal(err)
		}
	}
	mine, err := e.cps.CreateCheckpoint(inside, "self", api.CreateCheckpoint{Comment: "from inside"})
	if err != nil {
		t.Fatalf("creating a checkpoint from inside: %v", err)
	}
	if !e.cpRecord(sb.ID, mine.ID).Inside || e.cpRecord(sb.ID, owners.ID).Inside {
		t.Errorf("origin of %s (inside) and %s (owner) not recorded", mine.ID, owners.ID)
	}
	for _, id := range []string{owners.ID, "auto-1"} {
		err := e.cps.DeleteCheckpoint(inside, "self", id)
		if !errors.Is(err, api.ErrForbidden) {
			t.Errorf("deleting %s from inside: %v, want forbidden", id, err)
		}
	}
	// Seven restores from inside: they keep their own automatic
	// checkpoints, five at most, and never touch the owner's.
	for range 7 {
		if _, err := e.cps.RestoreCheckpoint(inside, "self", mine.ID); err != nil {
			t.Fatalf("restoring from inside: %v", err)
		}
	}
	ids := e.checkpointIDs("self")
	want := []string{"v1", "auto-1", "auto-2", "v2", "auto-5", "auto-6", "auto-7", "auto-8", "auto-9"}
	if !slices.Equal(ids, want) {
		t.Errorf("checkpoints after restores from inside %v, want %v", ids, want)
	}
	if err := e.cps.DeleteCheckpoint(inside, "self", "auto-9"); !errors.Is(err, api.ErrForbidden) {
		t.Errorf("deleting an automatic checkpoint of its own restore from inside: %v, want forbidden", err)
	}
	if err := e.cps.DeleteCheckpoint(inside, "self", mine.ID); err != nil {
		t.Errorf("deleting its own checkpoint from inside: %v", err)
	}
	// The owner may delete anything, and an owner's restore prunes any
	// automatic checkpoint beyond five.
	if err := e.cps.DeleteCheckpoint(e.ctx, "self", "auto-9"); err != nil {
		t.Errorf("the owner deleting auto-9: %v", err)
	}
}

// TestInsideCheckpointsHaveTheirOwnShare: checkpoints a sandbox takes of
// itself count against a share of their own, so a sandbox that fills it
// never makes its owner's next checkpoint fail; and its restores never push
// out the owner's automatic checkpoints, nor the owner's restores its own.
func TestInsideCheckpointsHaveTheirOwnShare(t *testing.T) {
	e := newEnvLimits(t, checkpoint.Limits{Owner: 2, Inside: 3})
	e.create(api.CreateSandbox{Name: "greedy"})
	inside := checkpoint.WithCaller(e.ctx, checkpoint.Inside)
	disk := api.CreateCheckpoint{Memory: ptr(false)}
	for i := range 3 {
		if _, err := e.cps.CreateCheckpoint(inside, "greedy", disk); err != nil {
			t.Fatalf("checkpoint %d from inside: %v", i+1, err)
		}
	}
	_, err := e.cps.CreateCheckpoint(inside, "greedy", disk)
	if !errors.Is(err, api.ErrLimit) || !strings.Contains(err.Error(), "taken from inside") {
		t.Fatalf("a fourth checkpoint from inside: %v, want limit", err)
	}
	for i := range 2 {
		if _, err := e.cps.CreateCheckpoint(e.ctx, "greedy", disk); err != nil {
			t.Fatalf("the owner's checkpoint %d after the sandbox filled its share: %v", i+1, err)
		}
	}
	if _, err := e.cps.CreateCheckpoint(e.ctx, "greedy", disk); !errors.Is(err, api.ErrLimit) {
		t.Fatalf("the owner's third checkpoint: %v, want limit", err)
	}
	// The owner's share full, the sandbox's is still full too: deleting one
	// of its own makes room for it, not for the owner.
	must(t, e.cps.DeleteCheckpoint(inside, "greedy", "v1"))
	if _, err := e.cps.CreateCheckpoint(e.ctx, "greedy", disk); !errors.Is(err, api.ErrLimit) {
		t.Fatalf("the owner's checkpoint after the sandbox deleted one of its own: %v, want limit", err)
	}
	if _, err := e.cps.CreateCheckpoint(inside, "greedy", disk); err != nil {
		t.Fatalf("a checkpoint from inside after deleting one: %v", err)
	}
	cps, err := e.cps.ListCheckpoints(e.ctx, "greedy")
	if err != nil {
		t.Fatal(err)
	}
	var by []string
	for _, cp := range cps {
		by = append(by, fmt.Sprintf("%s:%t", cp.ID, cp.Inside))
	}
	if want := []string{"v2:true", "v3:true", "v4:false", "v5:false", "v6:true"}; !slices.Equal(by, want) {
		t.Errorf("checkpoints %v, want %v", by, want)
	}

	// Two restores by the owner keep auto-1 and auto-2; six by the sandbox
	// keep five of their own; the owner's next restore keeps its two.
	for range 2 {
		if _, err := e.cps.RestoreCheckpoint(e.ctx, "greedy", "v4"); err != nil {
			t.Fatal(err)
		}
	}
	for range 6 {
		if _, err := e.cps.RestoreCheckpoint(inside, "greedy", "v2"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.cps.RestoreCheckpoint(e.ctx, "greedy", "v4"); err != nil {
		t.Fatal(err)
	}
	want := []string{"v2", "v3", "v4", "v5", "v6", "auto-1", "auto-2", "auto-4", "auto-5", "auto-6", "auto-7", "auto-8", "auto-9"}
	if ids := e.checkpointIDs("greedy"); !slices.Equal(ids, want) {
		t.Errorf("checkpoints after restores %v, want %v", ids, want)
	}
}

// TestAgentErrorsAreNotAPIErrors: an agent that answers a restore with an
// error of its own making ("400 invalid", say) does not choose the API's
// answer: the restore fails as an internal error that says the sandbox's
// agent failed and quotes it.
func TestAgentErrorsAreNotAPIErrors(t *testing.T) {
	e := newEnv(t, func(c *sandbox.Config) { c.BootTimeout = 5 * time.Second })
	sb := e.create(api.CreateSandbox{Name: "liar"})
	e.checkpoint("liar", true)
	rec := e.record(sb.ID)
	ep, err := e.nets.Endpoint(sb.ID, rec.NetIndex)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(ep.SandboxIP.String(), fmt.Sprint(e.cfg.AgentPort))
	// When the restored container starts, a hostile "agent" answers at
	// its address: healthy, but it refuses its new token with a user's
	// error of its own.
	e.rt.SetNoAgent(true)
	e.rt.SetHook(func(op, id string) {
		if op != "restore" || id != sb.ID {
			return
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("listening as the agent: %v", err)
			return
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/healthz" {
				io.WriteString(w, `{"ok":true,"pid":1}`)
				return
			}
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"code":"invalid","message":"agent says hi"}}`)
		})}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
	})
	_, err = e.cps.RestoreCheckpoint(e.ctx, "liar", "v1")
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeInternal {
		t.Fatalf("restore answered by a hostile agent: %v, want an internal error", err)
	}
	if !strings.Contains(ae.Message, "the sandbox's agent failed") || !strings.Contains(ae.Message, `"agent says hi"`) {
		t.Errorf("message %q: want it to say the sandbox's agent failed, quoting it", ae.Message)
	}
	if errors.Is(err, api.ErrInvalid) {
		t.Errorf("the agent chose the class of the API's error: %v", err)
	}
}
