package test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// TestInside: a sandbox checkpoints itself with the in-sandbox CLI, with a
// credential that reaches only that sandbox; a fork learns who it is.
func TestInside(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	self, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "self"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "other"}); err != nil {
		t.Fatal(err)
	}
	if got := d.Run("self", "loam", "checkpoint", "create", "--disk-only", "--comment", "from inside"); got != "v1\n" {
		t.Fatalf("inside disk-only checkpoint printed %q", got)
	}
	// A memory checkpoint ends exec streams, so run it detached, as a
	// program in the sandbox would. It waits a second first: started at
	// once, the checkpoint could end this very exec's stream before its
	// exit status came back (seen in CI).
	d.Run("self", "sh", "-c", "setsid sh -c 'sleep 1; loam checkpoint create --comment mem > /tmp/out 2>&1' </dev/null >/dev/null 2>&1 &")
	waitFor(t, func() bool {
		out, _, _, _ := d.C.Output(ctx, "self", "cat", "/tmp/out")
		return string(out) == "v2\n"
	})
	ls := d.Run("self", "loam", "checkpoint", "ls")
	if !strings.Contains(ls, "v1  disk    no") || !strings.Contains(ls, "v2  memory  no") {
		t.Fatalf("inside ls:\n%s", ls)
	}
	cps, err := d.C.ListCheckpoints(ctx, "self")
	if err != nil || len(cps) != 2 || cps[1].Comment != "mem" || cps[1].Sandbox != self.ID {
		t.Fatalf("%v %+v", err, cps)
	}
	// The credential reaches nothing but its own sandbox.
	for _, args := range [][]string{
		{"loam", "checkpoint", "ls", "other"},
		{"loam", "checkpoint", "create", "other"},
		{"loam", "ls"},
		{"loam", "rm", "-y", "other"},
	} {
		out, errOut, code, err := d.C.Output(ctx, "self", args...)
		if err != nil || code == 0 {
			t.Errorf("%v from inside: %d %v %q %q", args, code, err, out, errOut)
		}
	}
	if _, err := d.C.GetSandbox(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	if cps, _ := d.C.ListCheckpoints(ctx, "other"); len(cps) != 0 {
		t.Fatalf("other got checkpoints: %+v", cps)
	}

	// The in-sandbox API answers its own sandbox only: even with the
	// sandbox's token, a caller elsewhere (here, the host) is cut off as
	// soon as it connects.
	apiURL := strings.TrimSpace(d.Run("self", "cat", "/var/lib/loam/api_url"))
	token, _, _ := runAs(d, "root", "self", "cat", "/var/lib/loam/token")
	token = strings.TrimSpace(token)
	req, _ := http.NewRequest("GET", apiURL+"/v1/sandboxes/self/checkpoints", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Errorf("in-sandbox API from the host answered %d", resp.StatusCode)
	}
	if token == d.Token || !strings.HasPrefix(token, "loam_sb_") {
		t.Errorf("the sandbox holds token %q", token)
	}

	// A fork knows it is the fork, though its memory came from self.
	fork, err := d.C.Fork(ctx, "self", "v2", "self-fork")
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Run("self-fork", "cat", "/var/lib/loam/sandbox"); got != fork.ID+"\n" {
		t.Fatalf("fork thinks it is %q, it is %s", got, fork.ID)
	}
	// Its name is its own too, in the kernel and on its disk, for a fork
	// of a memory checkpoint as for one of a disk-only checkpoint.
	diskFork, err := d.C.Fork(ctx, "self", "v1", "self-disk")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []*api.Sandbox{fork, diskFork} {
		got := d.Run(f.Name, "sh", "-c", "hostname; cat /etc/hostname; grep -c "+f.Name+" /etc/hosts")
		if want := f.Name + "\n" + f.Name + "\n1\n"; got != want {
			t.Errorf("fork %s: hostname, /etc/hostname and hosts lines %q, want %q", f.Name, got, want)
		}
	}
	if got := d.Run("self-fork", "loam", "checkpoint", "create", "--disk-only"); got != "v1\n" {
		t.Fatalf("checkpoint inside the fork: %q", got)
	}
	if cps, _ := d.C.ListCheckpoints(ctx, "self-fork"); len(cps) != 1 {
		t.Fatalf("fork's checkpoints: %+v", cps)
	}
}

// TestStreamsEnd: a memory checkpoint ends exec streams with 1011 and hangs
// their commands up; a disk-only one ends nothing.
func TestStreamsEnd(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "streamy"}); err != nil {
		t.Fatal(err)
	}
	start := func(cmd string) chan error {
		done := make(chan error, 1)
		go func() {
			_, err := d.C.Exec(context.Background(), "streamy", client.ExecOptions{Cmd: []string{"sleep", cmd}})
			done <- err
		}()
		waitFor(t, func() bool { return strings.Contains(d.Run("streamy", "ps", "-o", "args"), "sleep "+cmd) })
		return done
	}
	done := start("5001")
	f := false
	if _, err := d.C.CreateCheckpoint(ctx, "streamy", api.CreateCheckpoint{Memory: &f}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("a disk-only checkpoint ended an exec: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	if _, err := d.C.CreateCheckpoint(ctx, "streamy", api.CreateCheckpoint{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, client.ErrStreamEnded) || !errors.Is(err, api.ErrUnavailable) {
			t.Fatalf("exec ended with %v, want a stream ended with 1011", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a memory checkpoint did not end the exec")
	}
	waitFor(t, func() bool { return !strings.Contains(d.Run("streamy", "ps", "-o", "args"), "sleep 5001") })
}

// TestInsideShare: checkpoints a sandbox takes of itself count against a
// share of their own, so a sandbox that fills it does not make its owner's
// next checkpoint fail (it made it 409 limit when both counted against one
// limit), and the owner's own share is still enforced.
func TestInsideShare(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t, "--checkpoint-limit", "2", "--inside-checkpoint-limit", "2")
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "greedy"}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		d.Run("greedy", "loam", "checkpoint", "create", "--disk-only", "--comment", "mine")
	}
	_, errOut, code := runAs(d, "root", "greedy", "loam", "checkpoint", "create", "--disk-only")
	if code == 0 || !strings.Contains(errOut, "taken from inside") {
		t.Fatalf("a third checkpoint from inside: %d %q, want the inside share's limit", code, errOut)
	}
	f := false
	for i := range 2 {
		if _, err := d.C.CreateCheckpoint(ctx, "greedy", api.CreateCheckpoint{Memory: &f}); err != nil {
			t.Fatalf("the owner's checkpoint %d after the sandbox filled its share: %v", i+1, err)
		}
	}
	if _, err := d.C.CreateCheckpoint(ctx, "greedy", api.CreateCheckpoint{Memory: &f}); !errors.Is(err, api.ErrLimit) {
		t.Fatalf("the owner's third checkpoint: %v, want limit", err)
	}
	cps, err := d.C.ListCheckpoints(ctx, "greedy")
	if err != nil {
		t.Fatal(err)
	}
	var inside []bool
	for _, cp := range cps {
		inside = append(inside, cp.Inside)
	}
	if len(cps) != 4 || !inside[0] || !inside[1] || inside[2] || inside[3] {
		t.Errorf("checkpoints %+v", cps)
	}
}
