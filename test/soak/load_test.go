package soak

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// TestLoad runs many clients against one daemon at once: listing, reading
// sandboxes, short commands and file moves across a set of sandboxes, with
// checkpoints, restores and forks in the mix. Every call must succeed, and
// the daemon must hold no more goroutines or open files after the load than
// before it. It prints throughput and p50/p99 latency per operation.
//
// The suite runs it small and short (30 clients, 4 sandboxes, 10 s); the
// full load the reliability promise is measured at is
//
//	LOAM_LOAD=5m LOAM_LOAD_CLIENTS=100 LOAM_LOAD_SANDBOXES=20 go test -run TestLoad -v -timeout 30m ./test/
func TestLoad(t *testing.T) {
	t.Parallel()
	dur := envDur(t, "LOAM_LOAD", 10*time.Second)
	clients := harness.EnvInt(t, "LOAM_LOAD_CLIENTS", 30)
	nsb := harness.EnvInt(t, "LOAM_LOAD_SANDBOXES", 4)
	if nsb < 2 {
		t.Fatal("LOAM_LOAD_SANDBOXES: at least 2 (one is restored and forked from)")
	}
	d := harness.StartDaemon(t, "--debug-listen", "127.0.0.1:0")
	// Not ctxT's three minutes: the full load runs five.
	ctx, cancel := context.WithTimeout(context.Background(), dur+10*time.Minute)
	t.Cleanup(cancel)

	// The last sandbox is the one restored in place and forked from; the
	// others are the light calls', which a restore would otherwise cut.
	names := make([]string, nsb)
	var wg sync.WaitGroup
	errs := make(chan error, nsb)
	for i := range names {
		names[i] = fmt.Sprintf("load-%d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: names[i], Resources: &api.Resources{MemoryMiB: 256}})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	churn := names[nsb-1]
	light := names[:nsb-1]
	base, err := d.C.CreateCheckpoint(ctx, churn, api.CreateCheckpoint{Name: "base"})
	if err != nil {
		t.Fatal(err)
	}

	dbg := debugURL(t, d)
	// A short warm-up, so that pools of connections and buffers the daemon
	// keeps are counted in "before".
	runLoad(ctx, t, d, light, churn, base.ID, min(clients, 10), 3*time.Second)
	before := daemonUse(t, d, dbg)

	began := time.Now()
	rec := runLoad(ctx, t, d, light, churn, base.ID, clients, dur)
	took := time.Since(began)
	if took < dur*9/10 {
		t.Errorf("the load ran %v of its %v", took.Round(time.Second), dur)
	}

	// Let closing sockets and finished streams be reaped: the daemon keeps
	// up to four idle connections to each agent for 30 s (the manager's
	// IdleConnTimeout), so a hundred clients leave more of them than the
	// warm-up's ten did until that time has passed.
	var after loadUse
	for i := 0; i < 80; i++ {
		time.Sleep(500 * time.Millisecond)
		after = daemonUse(t, d, dbg)
		if after.goroutines <= before.goroutines+10 && after.fds <= before.fds+10 {
			break
		}
	}
	rec.report(t, took)
	t.Logf("daemon before: %s", before)
	t.Logf("daemon after:  %s", after)
	if n := rec.failures(); n > 0 {
		t.Errorf("%d calls failed (target: none)", n)
	}
	// Slack for goroutines and sockets that live a little while by design
	// (idle HTTP connections, the agents' spare exec sockets).
	if after.goroutines > before.goroutines+20 {
		t.Errorf("goroutines grew from %d to %d", before.goroutines, after.goroutines)
	}
	if after.fds > before.fds+20 {
		t.Errorf("open files grew from %d to %d", before.fds, after.fds)
	}
}

// runLoad runs clients for dur and returns what they recorded. Each client
// has files of its own, so that no two clients' checks race.
func runLoad(ctx context.Context, t *testing.T, d *harness.Daemon, light []string, churn, base string, clients int, dur time.Duration) *loadRecorder {
	rec := newLoadRecorder()
	// The heavy clients' forks are named after this run: a fork the
	// warm-up's end cut on the client's side may still be made on the
	// daemon's, under a name the next run must not reuse.
	rec.run = loadRuns.Add(1)
	ctx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// One client of every 25 churns checkpoints, restores and
			// forks; the rest make the light calls.
			if i%25 == 0 {
				heavyClient(ctx, d.C, rec, light, churn, base, i)
				return
			}
			lightClient(ctx, d.C, rec, light, i)
		}()
	}
	wg.Wait()
	return rec
}

func lightClient(ctx context.Context, c *client.Client, rec *loadRecorder, sbs []string, id int) {
	r := rand.New(rand.NewPCG(uint64(id), 1))
	for n := 0; ctx.Err() == nil; n++ {
		sb := sbs[r.IntN(len(sbs))]
		dir := fmt.Sprintf("/home/loam/c%d", id)
		switch op := r.IntN(6); op {
		case 0:
			rec.do(ctx, "list", func() error {
				_, err := c.ListSandboxes(ctx, client.ListOptions{})
				return err
			})
		case 1:
			rec.do(ctx, "get", func() error {
				got, err := c.GetSandbox(ctx, sb)
				if err == nil && got.State != api.StateRunning {
					err = fmt.Errorf("%s is %s", sb, got.State)
				}
				return err
			})
		case 2:
			rec.do(ctx, "exec", func() error {
				want := strconv.Itoa(n)
				out, _, code, err := c.Output(ctx, sb, "echo", want)
				if err == nil && (code != 0 || strings.TrimSpace(string(out)) != want) {
					err = fmt.Errorf("echo %s answered %q, exit %d", want, out, code)
				}
				return err
			})
		case 3, 4:
			rec.do(ctx, "write+read", func() error {
				want := fmt.Sprintf("client %d call %d", id, n)
				p := fmt.Sprintf("%s/f%d", dir, n%4)
				if _, err := c.WriteFile(ctx, sb, p, strings.NewReader(want), nil); err != nil {
					return err
				}
				rc, err := c.ReadFile(ctx, sb, p, nil)
				if err != nil {
					return err
				}
				got, err := io.ReadAll(rc)
				rc.Close()
				if err == nil && string(got) != want {
					err = fmt.Errorf("read %q back from %s, wrote %q", got, p, want)
				}
				return err
			})
		case 5:
			rec.do(ctx, "move+list", func() error {
				p := fmt.Sprintf("%s/m", dir)
				if _, err := c.WriteFile(ctx, sb, p, strings.NewReader("x"), nil); err != nil {
					return err
				}
				if _, err := c.MoveFile(ctx, sb, p, p+"2", nil); err != nil {
					return err
				}
				ls, err := c.ListFiles(ctx, sb, dir, nil)
				if err != nil {
					return err
				}
				if !slices.ContainsFunc(ls.Entries, func(e api.FileInfo) bool { return e.Path == p+"2" }) {
					return fmt.Errorf("%s moved to %s2, which the listing lacks", p, p)
				}
				return nil
			})
		}
	}
}

// heavyClient takes checkpoints of the light sandboxes (deleting them
// again, within the per-sandbox limit) and restores and forks the churn
// sandbox, which no light client uses.
func heavyClient(ctx context.Context, c *client.Client, rec *loadRecorder, light []string, churn, base string, id int) {
	r := rand.New(rand.NewPCG(uint64(id), 2))
	for n := 0; ctx.Err() == nil; n++ {
		switch r.IntN(4) {
		case 0, 1:
			sb := light[r.IntN(len(light))]
			memory := r.IntN(2) == 0
			op := "checkpoint (disk)"
			if memory {
				op = "checkpoint (memory)"
			}
			var cp *api.Checkpoint
			ok := rec.do(ctx, op, func() error {
				var err error
				cp, err = c.CreateCheckpoint(ctx, sb, api.CreateCheckpoint{Memory: &memory, Comment: "load"})
				if isConflict(err) {
					// Another heavy client checkpoints it now: an
					// answer the API promises, not a failure.
					return errConflict
				}
				return err
			})
			// A delete while another heavy client checkpoints the same
			// sandbox is answered conflict (the sandbox is busy): tried
			// again, so that checkpoints do not pile up to the limit.
			for try := 0; ok && try < 10 && ctx.Err() == nil; try++ {
				conflict := false
				rec.do(ctx, "delete checkpoint", func() error {
					err := c.DeleteCheckpoint(ctx, sb, cp.ID)
					if isConflict(err) {
						conflict = true
						return errConflict
					}
					return err
				})
				if !conflict {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
		case 2:
			rec.do(ctx, "restore", func() error {
				_, err := c.RestoreCheckpoint(ctx, churn, base)
				if isConflict(err) {
					return errConflict
				}
				if err == nil {
					// Keep the churn sandbox's automatic checkpoints
					// within its limit.
					err = pruneAuto(ctx, c, churn)
				}
				return err
			})
		case 3:
			name := fmt.Sprintf("load-fork-%d-%d-%d", rec.run, id, n)
			if rec.do(ctx, "fork", func() error {
				_, err := c.Fork(ctx, churn, base, name)
				return err
			}) {
				rec.do(ctx, "delete", func() error { return c.DeleteSandbox(context.WithoutCancel(ctx), name) })
			}
		}
	}
}

// pruneAuto deletes a sandbox's automatic checkpoints but the newest.
func pruneAuto(ctx context.Context, c *client.Client, sb string) error {
	cps, err := c.ListCheckpoints(ctx, sb)
	if err != nil {
		return err
	}
	var auto []api.Checkpoint
	for _, cp := range cps {
		if strings.HasPrefix(cp.Name, "auto-") {
			auto = append(auto, cp)
		}
	}
	for i := 0; i+1 < len(auto); i++ {
		if err := c.DeleteCheckpoint(ctx, sb, auto[i].ID); err != nil && !isNotFound(err) {
			return err
		}
	}
	return nil
}

var errConflict = fmt.Errorf("conflict")

// cutByCheckpoint tells a call that was in flight when a memory checkpoint
// of its sandbox was taken: the API promises to end those (calls that come
// during the checkpoint wait for it instead), so the load counts them apart.
func cutByCheckpoint(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "the sandbox is being checkpointed")
}

func isConflict(err error) bool { return harness.APICode(err) == api.CodeConflict }
func isNotFound(err error) bool { return harness.APICode(err) == api.CodeNotFound }

// loadRecorder keeps each operation's latencies and failures.
// loadRuns numbers the runs of runLoad.
var loadRuns atomic.Int64

type loadRecorder struct {
	// run is the number of the runLoad that records.
	run       int64
	mu        sync.Mutex
	lat       map[string][]time.Duration
	fails     map[string][]string
	conflicts map[string]int
}

func newLoadRecorder() *loadRecorder {
	return &loadRecorder{lat: map[string][]time.Duration{}, fails: map[string][]string{}, conflicts: map[string]int{}}
}

// do times f as op and reports whether it succeeded. A call cut by the end
// of the run counts as neither.
func (r *loadRecorder) do(ctx context.Context, op string, f func() error) bool {
	start := time.Now()
	err := f()
	took := time.Since(start)
	if ctx.Err() != nil && err != nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == errConflict || cutByCheckpoint(err):
		r.conflicts[op]++
		return false
	case err != nil:
		r.fails[op] = append(r.fails[op], err.Error())
		return false
	}
	r.lat[op] = append(r.lat[op], took)
	return true
}

func (r *loadRecorder) failures() int {
	n := 0
	for _, f := range r.fails {
		n += len(f)
	}
	return n
}

func (r *loadRecorder) report(t *testing.T, dur time.Duration) {
	ops := slices.Sorted(func(yield func(string) bool) {
		seen := map[string]bool{}
		for op := range r.lat {
			seen[op] = true
		}
		for op := range r.fails {
			seen[op] = true
		}
		for op := range seen {
			if !yield(op) {
				return
			}
		}
	})
	total := 0
	var b strings.Builder
	// "cut" are calls in flight that a checkpoint of their sandbox ended,
	// or heavy calls another heavy call had the sandbox for (conflict):
	// both are answers the API promises.
	fmt.Fprintf(&b, "%-20s %7s %9s %9s %9s %7s %9s\n", "operation", "calls", "per s", "p50", "p99", "errors", "cut")
	for _, op := range ops {
		l := r.lat[op]
		slices.Sort(l)
		total += len(l)
		fmt.Fprintf(&b, "%-20s %7d %9.1f %9s %9s %7d %9d\n", op, len(l), float64(len(l))/dur.Seconds(),
			quantile(l, 0.5), quantile(l, 0.99), len(r.fails[op]), r.conflicts[op])
		for i, msg := range r.fails[op] {
			if i == 3 {
				fmt.Fprintf(&b, "    … and %d more\n", len(r.fails[op])-3)
				break
			}
			fmt.Fprintf(&b, "    %s\n", msg)
		}
	}
	fmt.Fprintf(&b, "%d calls in %s: %.1f per second", total, dur, float64(total)/dur.Seconds())
	t.Logf("load:\n%s", b.String())
}

func quantile(l []time.Duration, q float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	return l[min(len(l)-1, int(q*float64(len(l))))].Round(100 * time.Microsecond)
}

// loadUse is what the daemon holds.
type loadUse struct {
	rssKiB, goroutines, fds int
}

func (u loadUse) String() string {
	return fmt.Sprintf("%d MiB resident, %d goroutines, %d open files", u.rssKiB/1024, u.goroutines, u.fds)
}

// debugURL is where the daemon serves its profiles, from its log line.
func debugURL(t *testing.T, d *harness.Daemon) string {
	re := regexp.MustCompile(`serving Go's profiles" addr=(\S+)`)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(d.Log.String()); m != nil {
			return m[1]
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the daemon did not say where its profiles are")
	return ""
}

func daemonUse(t *testing.T, d *harness.Daemon, dbg string) loadUse {
	pid := d.Cmd.Process.Pid
	var u loadUse
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`VmRSS:\s+(\d+)`).FindSubmatch(status); m != nil {
		u.rssKiB, _ = strconv.Atoi(string(m[1]))
	}
	fds, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	if err != nil {
		t.Fatal(err)
	}
	u.fds = len(fds)
	resp, err := http.Get(dbg + "goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	head := make([]byte, 64)
	n, _ := io.ReadFull(resp.Body, head)
	if m := regexp.MustCompile(`goroutine profile: total (\d+)`).FindSubmatch(head[:n]); m != nil {
		u.goroutines, _ = strconv.Atoi(string(m[1]))
	} else {
		t.Fatalf("unexpected goroutine profile: %q", bytes.TrimSpace(head[:n]))
	}
	return u
}

func envDur(t *testing.T, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return d
}
