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
		if _, err := e.m.RestoreCheckpoint(e.ctx, "self", owners.ID); err != nil {
			t.Fatal(err)
		}
	}
	mine, err := e.m.CreateCheckpoint(inside, "self", api.CreateCheckpoint{Comment: "from inside"})
	if err != nil {
		t.Fatalf("creating a checkpoint from inside: %v", err)
	}
	if !e.cpRecord(sb.ID, mine.ID).Inside || e.cpRecord(sb.ID, owners.ID).Inside {
		t.Errorf("origin of %s (inside) and %s (owner) not recorded", mine.ID, owners.ID)
	}
	for _, id := range []string{owners.ID, "auto-1"} {
		err := e.m.DeleteCheckpoint(inside, "self", id)
		if !errors.Is(err, api.ErrForbidden) {
			t.Errorf("deleting %s from inside: %v, want forbidden", id, err)
		}
	}
	// Seven restores from inside: they keep their own automatic
	// checkpoints, five at most, and never touch the owner's.
	for range 7 {
		if _, err := e.m.RestoreCheckpoint(inside, "self", mine.ID); err != nil {
			t.Fatalf("restoring from inside: %v", err)
		}
	}
	ids := e.checkpointIDs("self")
	want := []string{"v1", "auto-1", "auto-2", "v2", "auto-5", "auto-6", "auto-7", "auto-8", "auto-9"}
	if !slices.Equal(ids, want) {
		t.Errorf("checkpoints after restores from inside %v, want %v", ids, want)
	}
	if err := e.m.DeleteCheckpoint(inside, "self", "auto-9"); !errors.Is(err, api.ErrForbidden) {
		t.Errorf("deleting an automatic checkpoint of its own restore from inside: %v, want forbidden", err)
	}
	if err := e.m.DeleteCheckpoint(inside, "self", mine.ID); err != nil {
		t.Errorf("deleting its own checkpoint from inside: %v", err)
	}
	// The owner may delete anything, and an owner's restore prunes any
	// automatic checkpoint beyond five.
	if err := e.m.DeleteCheckpoint(e.ctx, "self", "auto-9"); err != nil {
		t.Errorf("the owner deleting auto-9: %v", err)
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
	e.rt.setNoAgent(true)
	e.rt.setHook(func(op, id string) {
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
	_, err = e.m.RestoreCheckpoint(e.ctx, "liar", "v1")
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
