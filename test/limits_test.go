package test

// End-to-end tests of the limits inside a sandbox: a hostile sandbox hits
// its own limits while a neighbour and the daemon keep answering.

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// latency is the median of a neighbour's exec round trip and of the API's
// list of sandboxes over n tries.
type latency struct{ exec, list time.Duration }

func measure(t *testing.T, d *harness.Daemon, neighbour string, n int) latency {
	t.Helper()
	var execs, lists []time.Duration
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		out, _, code, err := d.C.Output(ctx, neighbour, "echo", "ok")
		if err != nil || code != 0 || string(out) != "ok\n" {
			cancel()
			t.Fatalf("the neighbour's exec: %q %d %v", out, code, err)
		}
		execs = append(execs, time.Since(start))
		start = time.Now()
		if _, err := d.C.ListSandboxes(ctx, client.ListOptions{}); err != nil {
			cancel()
			t.Fatalf("listing sandboxes: %v", err)
		}
		lists = append(lists, time.Since(start))
		cancel()
		time.Sleep(20 * time.Millisecond)
	}
	return latency{p50(execs), p50(lists)}
}

func p50(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// slowWriter takes what an exec prints a little at a time, as a client
// that reads its stream slowly.
// started is closed on the first write.
type slowWriter struct {
	n       int64
	started chan struct{}
}

func (w *slowWriter) Write(p []byte) (int, error) {
	if w.n == 0 {
		close(w.started)
	}
	w.n += int64(len(p))
	time.Sleep(5 * time.Millisecond)
	return len(p), nil
}

// firstWrite is a hostile command's output; started is closed on its
// first write.
type firstWrite struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	started chan struct{}
}

func (w *firstWrite) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf.Len() == 0 {
		close(w.started)
	}
	return w.buf.Write(p)
}

func (w *firstWrite) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestLimitsContainHostile: a fork bomb, a memory hog, a disk filler and a
// process flooding stdout to a slow reader each hit the limits of their
// own sandbox (EAGAIN, the memory limit, ENOSPC, the stream's flow
// control), while a neighbour's exec and the API's list keep answering.
// Their latency is logged against the one at rest, not bounded: a loaded
// machine is not a failure of loam's (BenchmarkNeighbourUnderFlood
// measures it).
func TestLimitsContainHostile(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "neighbour"}); err != nil {
		t.Fatal(err)
	}
	hostile := func() {
		t.Helper()
		_ = d.C.DeleteSandbox(ctx, "hostile")
		if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "hostile",
			Resources: &api.Resources{MemoryMiB: 256, DiskMiB: 256}}); err != nil {
			t.Fatal(err)
		}
	}
	hostile()
	rest := measure(t, d, "neighbour", 10)
	t.Logf("at rest: exec %v, list %v (medians of 10)", rest.exec, rest.list)

	within := func(name string, got latency) {
		t.Helper()
		t.Logf("%s: exec %v (%.1fx at rest), list %v (%.1fx) (medians of 10; at rest %v, %v)", name,
			got.exec, float64(got.exec)/float64(rest.exec), got.list, float64(got.list)/float64(rest.list), rest.exec, rest.list)
	}
	// alive tells whether the hostile sandbox still answers, as root (the
	// agent's own processes are not bound by the sandbox user's limits).
	alive := func(name string) bool {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		var o bytes.Buffer
		code, err := d.C.Exec(sctx, "hostile", client.ExecOptions{Cmd: []string{"echo", "ok"}, User: "root", Stdout: &o})
		sb, gerr := d.C.GetSandbox(ctx, "hostile")
		state := api.State("?")
		if gerr == nil {
			state = sb.State
		}
		t.Logf("%s: afterwards the hostile sandbox is %s, its exec %d %q %v", name, state, code, o.String(), err)
		return err == nil && code == 0
	}
	// during runs hostile in the hostile sandbox while the neighbour is
	// measured, and returns what hostile printed and its exit code.
	during := func(name string, user string, cmd string, limit time.Duration) (string, int) {
		t.Helper()
		type result struct {
			out  string
			code int
			err  error
		}
		done := make(chan result, 1)
		hctx, cancel := context.WithTimeout(ctx, limit)
		defer cancel()
		// The hostile command says when it runs: the neighbour is
		// measured from then on.
		o := &firstWrite{started: make(chan struct{})}
		go func() {
			code, err := d.C.Exec(hctx, "hostile", client.ExecOptions{Cmd: []string{"sh", "-c", "echo started; " + cmd}, User: user, Stdout: o, Stderr: o})
			done <- result{o.String(), code, err}
		}()
		select {
		case <-o.started:
		case r := <-done:
			done <- r
		}
		within(name, measure(t, d, "neighbour", 10))
		r := <-done
		t.Logf("%s: exit %d, err %v, output %q", name, r.code, r.err, tail(r.out, 300))
		return r.out, r.code
	}

	// A fork bomb as the sandbox's user: fork stops with EAGAIN.
	out, code := during("fork bomb", "loam",
		`i=0; while true; do sleep 30 </dev/null >/dev/null 2>&1 & [ $? -ne 0 ] && break; i=$((i+1)); [ $i -ge 5000 ] && break; done; echo forked $i`, time.Minute)
	if code == 0 || !strings.Contains(out, "Resource temporarily unavailable") {
		t.Errorf("fork bomb: exit %d, %q; want fork to fail with EAGAIN", code, tail(out, 300))
	}
	if !alive("fork bomb") {
		t.Error("the sandbox of the fork bomb does not answer")
	}
	// The sandbox's user kills all its processes (kill is the shell's own:
	// it needs no fork).
	runAs(d, "loam", "hostile", "sh", "-c", "kill -9 -1")

	// A memory hog past its 256 MiB: killed, or its sandbox is. On this
	// platform the host's memory cgroup kills the whole sandbox process;
	// the daemon notices at once: the sandbox is in state error with the
	// reason, the hog's exec ends well before its deadline, and a wake
	// starts the sandbox again on its disk.
	// How long the hog takes to reach its limit depends on the machine;
	// what the daemon promises is that its exec ends soon after the
	// sandbox dies, so a watcher notes when the sandbox is first seen in
	// state error.
	hogStart := time.Now()
	died := make(chan time.Time, 1)
	wctx, stopWatch := context.WithCancel(ctx)
	go func() {
		defer close(died)
		for wctx.Err() == nil {
			if sb, err := d.C.GetSandbox(wctx, "hostile"); err == nil && sb.State == api.StateError {
				died <- time.Now()
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	out, code = during("memory hog", "loam", `x=$(head -c 400000000 /dev/zero | tr '\0' a); echo held ${#x}`, 60*time.Second)
	hogEnded := time.Now()
	// The exec may end a moment before the state is seen: wait a little.
	var diedAt time.Time
	var seen bool
	select {
	case diedAt, seen = <-died:
	case <-time.After(5 * time.Second):
		stopWatch()
		diedAt, seen = <-died
	}
	stopWatch()
	if code == 0 && strings.Contains(out, "held 400000000") {
		t.Errorf("a 256 MiB sandbox held 400 MB: %q", out)
	}
	if alive("memory hog") {
		// Held at its limit and cut at its deadline: anything of it left
		// goes before the next test.
		runAs(d, "root", "hostile", "sh", "-c", "pkill -9 -u loam; true")
	} else {
		sb, err := d.C.GetSandbox(ctx, "hostile")
		if err != nil {
			t.Fatal(err)
		}
		if sb.State != api.StateError || !strings.Contains(sb.Reason, "memory") {
			t.Errorf("memory hog: the sandbox that stopped answering is %s (%q), want error with the reason", sb.State, sb.Reason)
		}
		switch {
		case !seen && hogEnded.Sub(hogStart) >= 59*time.Second:
			// Cut at the test's deadline, and the sandbox died after.
			t.Logf("memory hog: its sandbox died after the hog's exec was cut at its deadline")
		case !seen:
			t.Errorf("memory hog: its exec ended while the sandbox was never seen in state error")
		default:
			// The watcher polls every 50 ms, and the exec may end first:
			// only an exec that outlives the death by seconds is wrong.
			after := hogEnded.Sub(diedAt)
			t.Logf("memory hog: the sandbox is %s (%q); the hog's exec ended %v after the sandbox was seen dead", sb.State, sb.Reason, after)
			if after > 5*time.Second {
				t.Errorf("memory hog: its exec lasted %v after its sandbox died", after)
			}
		}
		if _, err := d.C.Wake(ctx, "hostile"); err != nil {
			t.Fatalf("waking the sandbox that ran out of memory: %v", err)
		}
		if !alive("memory hog, woken") {
			t.Fatal("the sandbox woken after running out of memory does not answer")
		}
	}

	// A disk filler past its 256 MiB: ENOSPC.
	out, code = during("disk filler", "loam", "dd if=/dev/zero of=/home/loam/fill bs=1M count=400 conv=fsync", time.Minute)
	if code == 0 || !strings.Contains(out, "No space left on device") {
		t.Errorf("disk filler: exit %d, %q; want No space left on device", code, tail(out, 300))
	}
	if !alive("disk filler") {
		t.Error("the sandbox of the disk filler does not answer")
	}

	// A process flooding stdout to a client that reads slowly: the stream's
	// flow control holds it back, the daemon does not buffer it all.
	fctx, cancel := context.WithTimeout(ctx, 12*time.Second)
	defer cancel()
	w := &slowWriter{started: make(chan struct{})}
	flood := make(chan error, 1)
	go func() {
		_, err := d.C.Exec(fctx, "hostile", client.ExecOptions{Cmd: []string{"yes", strings.Repeat("x", 1000)}, Stdout: w})
		flood <- err
	}()
	// Measured once the flood reaches the slow reader.
	select {
	case <-w.started:
	case err := <-flood:
		flood <- err
	}
	within("stdout flood", measure(t, d, "neighbour", 10))
	cancel()
	if err := <-flood; err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		t.Logf("stdout flood ended with %v", err)
	}
	t.Logf("stdout flood: the slow reader took %d bytes", w.n)
	if !alive("stdout flood") {
		t.Error("the sandbox of the stdout flood does not answer")
	}
	runAs(d, "root", "hostile", "sh", "-c", "pkill yes; true")
	within("after all", measure(t, d, "neighbour", 10))
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// TestMaxSandboxesCap: a daemon started with --max-sandboxes 1 refuses a
// second sandbox with limit, the sleeping first one counted, and takes one
// again once the first is deleted.
func TestMaxSandboxesCap(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t, "--max-sandboxes", "1", "--max-heavy", "2")
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "one"}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.Sleep(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	_, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "two"})
	if harness.APICode(err) != api.CodeLimit || !strings.Contains(err.Error(), "--max-sandboxes") {
		t.Fatalf("a second sandbox under --max-sandboxes 1: %v, want limit", err)
	}
	if out, errOut, code := d.CLI("", "create", "two"); code == 0 || !strings.Contains(errOut, "at most 1 sandboxes") {
		t.Errorf("loam create beyond the cap: %d %q %q", code, out, errOut)
	}
	if err := d.C.DeleteSandbox(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "two"}); err != nil {
		t.Fatalf("a create once there is room: %v", err)
	}
}

// BenchmarkNeighbourUnderFlood is the latency TestLimitsContainHostile
// logs, as a benchmark: a neighbour's exec round trip while another
// sandbox floods its stdout to a slow reader. ns/op is the exec under the
// flood; rest-ns/exec the same exec measured before it.
func BenchmarkNeighbourUnderFlood(b *testing.B) {
	d := harness.StartDaemonB(b)
	ctx := harness.Ctx(b)
	for _, name := range []string{"neighbour", "hostile"} {
		if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: name}); err != nil {
			b.Fatal(err)
		}
	}
	exec := func() {
		d.RunB(b, "neighbour", "echo", "ok")
	}
	const rest = 20
	start := time.Now()
	for range rest {
		exec()
	}
	atRest := time.Since(start) / rest
	fctx, cancel := context.WithCancel(ctx)
	w := &slowWriter{started: make(chan struct{})}
	flood := make(chan error, 1)
	go func() {
		_, err := d.C.Exec(fctx, "hostile", client.ExecOptions{Cmd: []string{"yes", strings.Repeat("x", 1000)}, Stdout: w})
		flood <- err
	}()
	select {
	case <-w.started:
	case err := <-flood:
		b.Fatalf("the flood ended before it began: %v", err)
	}
	b.ResetTimer()
	for b.Loop() {
		exec()
	}
	b.StopTimer()
	cancel()
	<-flood
	b.ReportMetric(float64(atRest.Nanoseconds()), "rest-ns/exec")
}
