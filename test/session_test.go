package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// counterCmd counts up, a line a tick, for ever.
var counterCmd = []string{"sh", "-c", `i=0; while :; do echo $i; i=$((i+1)); sleep 0.02; done`}

// follower is one client's view of a detachable session's stdout, across as
// many attaches as it takes: what it got, and so where to attach again.
type follower struct {
	mu      sync.Mutex
	out     bytes.Buffer
	offsets []int64 // the offset each attach started at
	dropped int64
}

func (f *follower) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.out.Write(p)
}

// next is the offset to attach again from: everything before it was got.
func (f *follower) next() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return int64(f.out.Len())
}

func (f *follower) lines() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return bytes.Count(f.out.Bytes(), []byte("\n"))
}

// attach attaches from where f is, in the background; the error comes on
// the channel once the attach ends.
func (f *follower) attach(ctx context.Context, c *client.Client, sb, id string) <-chan error {
	done := make(chan error, 1)
	from := f.next()
	first := true
	go func() {
		_, err := c.Attach(ctx, sb, id, client.AttachOptions{
			Offset: &from,
			Stdout: f,
			OnOffset: func(stream byte, offset, dropped int64) {
				f.mu.Lock()
				defer f.mu.Unlock()
				if first {
					f.offsets = append(f.offsets, offset)
					first = false
				}
				f.dropped += dropped
			},
		})
		done <- err
	}()
	return done
}

// waitLines waits until f has got n more lines than it had.
func (f *follower) waitLines(t *testing.T, more int) {
	t.Helper()
	want := f.lines() + more
	harness.Eventually(t, 30*time.Second, fmt.Sprintf("%d lines of output", want), func() error {
		if n := f.lines(); n < want {
			return fmt.Errorf("%d lines", n)
		}
		return nil
	})
}

// checkCount checks that f's output is 0, 1, 2, … with no gap or repeat.
func (f *follower) checkCount(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	lines := strings.Split(f.out.String(), "\n")
	lines = lines[:len(lines)-1] // the last one may be partial
	for i, l := range lines {
		if l != strconv.Itoa(i) {
			t.Fatalf("line %d of the output is %q, want %d (a gap or a repeat); dropped %d", i, l, i, f.dropped)
		}
	}
}

// TestSessionAcrossCheckpoints: a detachable counter keeps counting across
// a memory checkpoint, which ends its attach socket (1011), and is attached
// again at once from where its client was, with no gap in its output; a
// disk-only checkpoint ends nothing; a fork and a memory restore have the
// session running; a disk-only restore has none.
func TestSessionAcrossCheckpoints(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "sess"}); err != nil {
		t.Fatal(err)
	}
	ss, err := d.C.CreateSession(ctx, "sess", api.ExecRequest{Cmd: counterCmd})
	if err != nil {
		t.Fatal(err)
	}
	if !api.ValidSessionID(ss.ID) || !ss.Detachable || ss.State != api.SessionRunning || ss.PID <= 0 {
		t.Fatalf("created %+v", ss)
	}

	var f follower
	done := f.attach(ctx, d.C, "sess", ss.ID)
	waited := make(chan error, 1)
	go func() {
		_, err := d.C.WaitSession(ctx, "sess", ss.ID)
		waited <- err
	}()
	f.waitLines(t, 10)
	if _, err := d.C.CreateCheckpoint(ctx, "sess", api.CreateCheckpoint{}); err != nil {
		t.Fatal(err)
	}
	// A wait in flight ends too, unavailable: the caller waits again.
	if err := <-waited; !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("a wait across a memory checkpoint ended with %v, want unavailable", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, client.ErrInterrupted) || !errors.Is(err, client.ErrStreamEnded) {
			t.Fatalf("attach ended with %v, want ErrInterrupted", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a memory checkpoint did not end the attach socket")
	}
	at := f.next()
	done = f.attach(ctx, d.C, "sess", ss.ID)
	f.waitLines(t, 20)
	f.checkCount(t)
	if len(f.offsets) != 2 || f.offsets[1] != at || f.dropped != 0 {
		t.Fatalf("attaches started at %v (dropped %d), want the second at %d", f.offsets, f.dropped, at)
	}

	// A disk-only checkpoint ends nothing.
	no := false
	if _, err := d.C.CreateCheckpoint(ctx, "sess", api.CreateCheckpoint{Memory: &no}); err != nil {
		t.Fatal(err)
	}
	f.waitLines(t, 10)
	select {
	case err := <-done:
		t.Fatalf("a disk-only checkpoint ended the attach: %v", err)
	default:
	}
	f.checkCount(t)

	// A fork of the memory checkpoint has the session, running.
	if _, err := d.C.Fork(ctx, "sess", "v1", "sess-fork"); err != nil {
		t.Fatal(err)
	}
	checkRunning(t, d, "sess-fork", ss.ID)

	// A memory restore ends every socket, and brings the session back as
	// the checkpoint had it; a disk-only one boots fresh, with none.
	if _, err := d.C.RestoreCheckpoint(ctx, "sess", "v1"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, client.ErrInterrupted) {
			t.Fatalf("attach ended with %v at a restore, want ErrInterrupted", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a restore did not end the attach socket")
	}
	checkRunning(t, d, "sess", ss.ID)
	if _, err := d.C.RestoreCheckpoint(ctx, "sess", "v2"); err != nil {
		t.Fatal(err)
	}
	list, err := d.C.ListSessions(ctx, "sess")
	if err != nil || len(list) != 0 {
		t.Fatalf("after a disk-only restore: %+v, %v; want no session", list, err)
	}
	if _, err := d.C.GetSession(ctx, "sess", ss.ID); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("after a disk-only restore the session is %v, want not found", err)
	}
}

// checkRunning checks that session id of sb is listed as running, and
// that attaching to it gets output.
func checkRunning(t *testing.T, d *harness.Daemon, sb, id string) {
	t.Helper()
	ctx := harness.Ctx(t)
	list, err := d.C.ListSessions(ctx, sb)
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, s := range list {
		found = found || s.ID == id && s.State == api.SessionRunning
	}
	if !found {
		t.Fatalf("sessions of %s: %+v, want %s running", sb, list, id)
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	var f follower
	f.attach(actx, d.C, sb, id)
	f.waitLines(t, 5)
}

// TestSessionLifecycle: wait, signal, a process tree killed by DELETE
// leaves no child, the CLI's commands.
func TestSessionLifecycle(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "life"}); err != nil {
		t.Fatal(err)
	}
	// Wait returns the exit code.
	ss, err := d.C.CreateSession(ctx, "life", api.ExecRequest{Cmd: []string{"sh", "-c", "echo done; exit 5"}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.C.WaitSession(ctx, "life", ss.ID)
	if err != nil || got.State != api.SessionExited || got.ExitCode == nil || *got.ExitCode != 5 || got.ExitedAt == nil {
		t.Fatalf("wait: %+v, %v", got, err)
	}
	// Its output stays to be read, exited.
	var out bytes.Buffer
	if code, err := d.C.Attach(ctx, "life", ss.ID, client.AttachOptions{Stdout: &out}); err != nil || code != 5 || out.String() != "done\n" {
		t.Fatalf("attach to an exited session: %d %q %v", code, out.String(), err)
	}

	// A signal goes to the whole group.
	ss, err = d.C.CreateSession(ctx, "life", api.ExecRequest{Cmd: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.C.SignalSession(ctx, "life", ss.ID, "TERM"); err != nil {
		t.Fatal(err)
	}
	if got, err := d.C.WaitSession(ctx, "life", ss.ID); err != nil || *got.ExitCode != 128+15 {
		t.Fatalf("after TERM: %+v, %v", got, err)
	}

	// DELETE kills the tree: a child in the group, and one in a session
	// of its own.
	ss, err = d.C.CreateSession(ctx, "life", api.ExecRequest{Cmd: []string{"sh", "-c", "sleep 1001 & setsid sleep 1002 & wait"}})
	if err != nil {
		t.Fatal(err)
	}
	sleeps := func() int {
		n := 0
		for _, l := range strings.Split(d.Run("life", "ps", "-o", "args"), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "sleep 100") {
				n++
			}
		}
		return n
	}
	waitFor(t, func() bool { return sleeps() == 2 })
	if err := d.C.DeleteSession(ctx, "life", ss.ID); err != nil {
		t.Fatal(err)
	}
	if n := sleeps(); n != 0 {
		t.Fatalf("%d children left after DELETE:\n%s", n, d.Run("life", "ps", "-o", "pid,ppid,args"))
	}
	if _, err := d.C.GetSession(ctx, "life", ss.ID); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("a deleted session: %v, want not found", err)
	}

	// A detachable exec runs on when its socket goes; its output waits.
	ectx, cancel := context.WithCancel(ctx)
	var detached string
	_, err = d.C.Exec(ectx, "life", client.ExecOptions{
		Cmd:        []string{"sh", "-c", "sleep 0.5; echo late"},
		Detachable: true,
		Started:    func(_ int, s string) { detached = s; cancel() },
	})
	if !errors.Is(err, context.Canceled) || !api.ValidSessionID(detached) {
		t.Fatalf("detachable exec cancelled: %v, session %q", err, detached)
	}
	if got, err := d.C.WaitSession(ctx, "life", detached); err != nil || *got.ExitCode != 0 {
		t.Fatalf("wait for the detached exec: %+v, %v", got, err)
	}
	out.Reset()
	if code, err := d.C.Attach(ctx, "life", detached, client.AttachOptions{Stdout: &out, NoFollow: true}); err != nil || code != 0 || out.String() != "late\n" {
		t.Fatalf("logs of the detached exec: %d %q %v", code, out.String(), err)
	}

	// A non-detachable exec is a session too, and cannot be attached to.
	var id string
	if _, err := d.C.Exec(ctx, "life", client.ExecOptions{Cmd: []string{"true"}, Started: func(_ int, s string) { id = s }}); err != nil {
		t.Fatal(err)
	}
	got, err = d.C.GetSession(ctx, "life", id)
	if err != nil || got.Detachable || got.State != api.SessionExited {
		t.Fatalf("the exec's session %q: %+v, %v", id, got, err)
	}
	if _, err := d.C.Attach(ctx, "life", id, client.AttachOptions{}); !errors.Is(err, api.ErrConflict) {
		t.Fatalf("attaching to an exec: %v, want conflict", err)
	}
}

// TestSessionOldAgent runs sandboxes with the first agent (protocol 1, at
// commit d3d1566), as a sandbox restored from an old checkpoint does: exec
// works, and sessions are refused with a clear error.
func TestSessionOldAgent(t *testing.T) {
	t.Parallel()
	old := oldAgent(t)
	d := harness.StartDaemon(t, "--agent-binary", old)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "old"}); err != nil {
		t.Fatal(err)
	}
	if out := d.Run("old", "echo", "hi"); out != "hi\n" {
		t.Fatalf("exec on an old agent: %q", out)
	}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "needs a newer agent") || !strings.Contains(err.Error(), "protocol 1, needs 3") {
			t.Fatalf("%s on an old agent: %v, want a conflict that says the agent is too old", what, err)
		}
	}
	_, err := d.C.CreateSession(ctx, "old", api.ExecRequest{Cmd: []string{"true"}})
	check("create session", err)
	_, err = d.C.ListSessions(ctx, "old")
	check("list sessions", err)
	_, err = d.C.Exec(ctx, "old", client.ExecOptions{Cmd: []string{"true"}, Detachable: true})
	check("detachable exec", err)
	if !errors.Is(err, client.ErrNotStarted) {
		t.Fatalf("detachable exec on an old agent: %v, want not started", err)
	}
}

// oldAgent builds the loam binary of commit d3d1566 (LOAM_OLD_AGENT names
// one already built).
func oldAgent(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("LOAM_OLD_AGENT"); p != "" {
		return p
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("sh", "-c", `git archive d3d1566 | tar -x -C "$1"`, "sh", src)
	archive.Dir = ".." // the whole tree, not test/ alone
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("extracting commit d3d1566: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "loam")
	build := exec.Command("go", "build", "-o", bin, "./cmd/loam")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the old agent: %v\n%s", err, out)
	}
	return bin
}

// BenchmarkAttach measures attaching to a detachable session: from the
// call to the first replayed byte, through the daemon and the agent.
func BenchmarkAttach(b *testing.B) {
	d := harness.StartDaemonB(b)
	ctx := context.Background()
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "attach"}); err != nil {
		b.Fatal(err)
	}
	ss, err := d.C.CreateSession(ctx, "attach", api.ExecRequest{Cmd: []string{"sh", "-c", "echo ready; exec sleep 100000"}})
	if err != nil {
		b.Fatal(err)
	}
	// Wait for the output to be there to replay.
	for {
		var f follower
		actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		d.C.Attach(actx, "attach", ss.ID, client.AttachOptions{Stdout: &f})
		cancel()
		if f.next() > 0 {
			break
		}
	}
	// ns/op counts the whole attach, closing included; the figure to
	// read is first-byte-ms, the median time to the first replayed byte.
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		actx, cancel := context.WithCancel(ctx)
		first := &firstByte{cancel: cancel, start: time.Now()}
		d.C.Attach(actx, "attach", ss.ID, client.AttachOptions{Stdout: first})
		cancel()
		if first.at == 0 {
			b.Fatal("no byte replayed")
		}
		lat = append(lat, first.at)
	}
	b.ReportMetric(median(lat), "first-byte-ms")
}

// firstByte cancels an attach at its first byte, and says when it came.
type firstByte struct {
	start  time.Time
	at     time.Duration
	cancel context.CancelFunc
}

func (w *firstByte) Write(p []byte) (int, error) {
	if w.at == 0 {
		w.at = time.Since(w.start)
	}
	w.cancel()
	return len(p), nil
}

// TestSessionCLI drives sessions through the CLI: exec -d, sessions, logs,
// attach (and its 1011 ending), kill.
func TestSessionCLI(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "cli"}); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := d.CLI("", "exec", "-d", "cli", "--", "sh", "-c", "echo out; echo err >&2; exec sleep 1000")
	id := strings.TrimSpace(out)
	if code != 0 || !api.ValidSessionID(id) {
		t.Fatalf("exec -d: %d %q %q", code, out, errOut)
	}
	if out, _, _ := d.CLI("", "sessions", "cli"); !strings.Contains(out, id) || !strings.Contains(out, "running") || !strings.Contains(out, "sh -c echo out") {
		t.Fatalf("sessions:\n%s", out)
	}
	waitFor(t, func() bool {
		out, errOut, code := d.CLI("", "logs", "cli", id)
		return code == 0 && out == "out\n" && errOut == "err\n"
	})

	// An attach ended by a memory checkpoint says the session runs on.
	attach := exec.Command(harness.LoamBin, "attach", "cli", id)
	attach.Env = append(os.Environ(), "LOAM_API_URL="+d.URL, "LOAM_TOKEN="+d.Token)
	var aout, aerr harness.SyncBuffer
	attach.Stdout, attach.Stderr = &aout, &aerr
	if err := attach.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(aout.String(), "out") })
	if _, err := d.C.CreateCheckpoint(ctx, "cli", api.CreateCheckpoint{}); err != nil {
		t.Fatal(err)
	}
	err := attach.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(aerr.String(), "can be attached again: loam attach cli "+id) {
		t.Fatalf("attach across a checkpoint: %v, stderr %q", err, aerr.String())
	}

	if _, errOut, code := d.CLI("", "kill", "cli", id); code != 0 {
		t.Fatalf("kill: %d %q", code, errOut)
	}
	out, errOut, code = d.CLI("", "attach", "cli", id)
	if code != 128+15 || out != "out\n" || errOut != "err\n" {
		t.Fatalf("attach after kill: %d %q %q", code, out, errOut)
	}
	if _, errOut, code := d.CLI("", "kill", "--rm", "cli", id); code != 0 {
		t.Fatalf("kill --rm: %d %q", code, errOut)
	}
	if out, _, _ := d.CLI("", "sessions", "cli"); strings.Contains(out, id) {
		t.Fatalf("sessions after kill --rm:\n%s", out)
	}
	if _, errOut, code := d.CLI("", "logs", "cli", id); code != 1 || !strings.Contains(errOut, "no session") {
		t.Fatalf("logs of a removed session: %d %q", code, errOut)
	}
	// Without -d, exec attaches at once and exits with the command's status.
	out, errOut, code = d.CLI("", "exec", "cli", "--", "sh", "-c", "echo hi; exit 4")
	if code != 4 || out != "hi\n" {
		t.Fatalf("exec: %d %q %q", code, out, errOut)
	}
}
