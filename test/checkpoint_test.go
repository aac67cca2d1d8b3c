package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

var (
	cpJSON   = regexp.MustCompile(`^\{"id":"(v\d+)","sandbox":"(sb-[a-z0-9]{12})","name":"checkpoint-[0-9a-f]{6}","comment":"([^"]*)","memory":(true|false),"auto":false,"inside":false,"created_at":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"\}\n$`)
	lsHeader = regexp.MustCompile(`^ID +KIND +AUTO +CREATED +COMMENT$`)
)

// TestSeedStory plays the checkpoint page of the manual on the base
// template: a site served by python3, checkpoint v1 (memory) and v2 (disk
// only), break things, restore v1 (the file is back and the same server
// process runs), auto-1 is listed, and a fork of v1 runs the same process.
func TestSeedStory(t *testing.T) {
	t.Parallel()
	seedStory(t, harness.StartDaemon(t), "")
}

// seedStory plays the story through d; with node set (d a node of a
// cluster), the sandbox is made on that node (an operator's pin), and the
// story told through d, every call passed on to it.
func seedStory(t *testing.T, d *harness.Daemon, node string) {
	ctx := harness.Ctx(t)
	var out, errOut string
	var code int
	if node == "" {
		out, errOut, code = d.CLI("", "create", "scratch", "--template", "base")
	} else {
		status, body := d.Curl("POST", "/v1/sandboxes", `{"name":"scratch","template":"base","node":"`+node+`"}`)
		out, code = body, status-201
	}
	if code != 0 {
		t.Fatalf("create: %d %s %s", code, out, errOut)
	}
	d.Run("scratch", "sh", "-c", `mkdir -p /home/loam/site && echo hello > /home/loam/site/index.html && echo v1 > /home/loam/state.txt &&
		nohup python3 -m http.server 8080 --directory /home/loam/site >/dev/null 2>&1 &`)
	waitFor(t, func() bool {
		_, _, code, _ := d.C.Output(ctx, "scratch", "python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/')")
		return code == 0
	})
	pidBefore := d.Run("scratch", "pgrep", "-a", "python3")
	if !strings.HasSuffix(pidBefore, " python3 -m http.server 8080 --directory /home/loam/site\n") {
		t.Fatalf("server: %q", pidBefore)
	}

	// $ loam checkpoint create scratch --comment 'site up, state v1'
	out, errOut, code = d.CLI("", "checkpoint", "create", "scratch", "--comment", "site up, state v1")
	if code != 0 || out != "v1\n" {
		t.Fatalf("checkpoint create: %d %q %q", code, out, errOut)
	}
	// curl … /checkpoints -d '{"comment":"disk only","memory":false}'
	status, body := d.Curl("POST", "/v1/sandboxes/scratch/checkpoints", `{"comment":"disk only","memory":false}`)
	m := cpJSON.FindStringSubmatch(body)
	if status != 201 || m == nil || m[1] != "v2" || m[3] != "disk only" || m[4] != "false" {
		t.Fatalf("disk-only checkpoint: %d %s", status, body)
	}
	sbID := m[2]

	// $ loam checkpoint ls scratch
	out, _, code = d.CLI("", "checkpoint", "ls", "scratch")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 0 || len(lines) != 3 || !lsHeader.MatchString(lines[0]) ||
		!regexp.MustCompile(`^v1  memory  no    \d{4}-\d\d-\d\d \d\d:\d\d:\d\d  site up, state v1$`).MatchString(lines[1]) ||
		!regexp.MustCompile(`^v2  disk    no    \d{4}-\d\d-\d\d \d\d:\d\d:\d\d  disk only$`).MatchString(lines[2]) {
		t.Fatalf("checkpoint ls:\n%s", out)
	}
	// curl … /checkpoints/v1
	status, body = d.Curl("GET", "/v1/sandboxes/scratch/checkpoints/v1", "")
	if m := cpJSON.FindStringSubmatch(body); status != 200 || m == nil || m[1] != "v1" || m[2] != sbID || m[3] != "site up, state v1" || m[4] != "true" {
		t.Fatalf("get v1: %d %s", status, body)
	}

	// Break things, then restore v1.
	// As in the seed; pkill -f also matches the shell running it (exit 143).
	d.C.Output(ctx, "scratch", "sh", "-c", "echo v2 > /home/loam/state.txt; pkill -f http.server")
	if out, _, code, _ := d.C.Output(ctx, "scratch", "pgrep", "-a", "python3"); code != 1 {
		t.Fatalf("the server still runs: %q", out)
	}
	out, errOut, code = d.CLI("", "checkpoint", "restore", "-y", "scratch", "v1")
	if code != 0 || out != "scratch\trunning\n" {
		t.Fatalf("restore: %d %q %q", code, out, errOut)
	}
	got := d.Run("scratch", "sh", "-c", "cat /home/loam/state.txt; pgrep -a python3")
	if got != "v1\n"+pidBefore {
		t.Fatalf("after restore: %q, want v1 and %q", got, pidBefore)
	}
	d.Run("scratch", "python3", "-c", "import urllib.request; assert urllib.request.urlopen('http://127.0.0.1:8080/').read() == b'hello\\n'")

	out, _, _ = d.CLI("", "checkpoint", "ls", "scratch")
	lines = strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 4 || !regexp.MustCompile(`^auto-1  memory  yes   \d{4}-\d\d-\d\d \d\d:\d\d:\d\d  before restoring v1$`).MatchString(lines[3]) ||
		!strings.HasPrefix(lines[1], "v1      memory  no    ") {
		t.Fatalf("checkpoint ls after restore:\n%s", out)
	}

	// $ curl -X DELETE …/checkpoints/v2 → 204; loam checkpoint rm scratch auto-1
	if status, body := d.Curl("DELETE", "/v1/sandboxes/scratch/checkpoints/v2", ""); status != 204 || body != "" {
		t.Fatalf("delete v2: %d %q", status, body)
	}
	if out, errOut, code := d.CLI("", "checkpoint", "rm", "-y", "scratch", "auto-1"); code != 0 || out != "" {
		t.Fatalf("rm auto-1: %d %q %q", code, out, errOut)
	}
	if status, body := d.Curl("GET", "/v1/sandboxes/scratch/checkpoints/v2", ""); status != 404 || !strings.Contains(body, `"code":"not_found"`) {
		t.Fatalf("get deleted v2: %d %s", status, body)
	}

	// Forks: a disk-only one over curl, a memory one with the CLI.
	status, body = d.Curl("POST", "/v1/sandboxes", `{"name":"scratch-disk","from":{"sandbox":"scratch","checkpoint":"v1"},"template":"base"}`)
	if status != 400 || body != `{"error":{"code":"invalid","message":"a fork takes its template or image and its resources from the checkpoint; don't give them"}}`+"\n" {
		t.Fatalf("fork with template: %d %s", status, body)
	}
	out, errOut, code = d.CLI("", "fork", "scratch", "v1", "scratch-copy")
	if code != 0 || !regexp.MustCompile(`^name:        scratch-copy\nid:          sb-[a-z0-9]{12}\nstate:       running\nurl:         http://scratch-copy--default\.localhost:7070\n`).MatchString(out) {
		t.Fatalf("fork: %d %q %q", code, out, errOut)
	}
	if got := d.Run("scratch-copy", "pgrep", "-a", "python3"); got != pidBefore {
		t.Fatalf("fork runs %q, want %q", got, pidBefore)
	}
	d.Run("scratch-copy", "python3", "-c", "import urllib.request; assert urllib.request.urlopen('http://127.0.0.1:8080/').read() == b'hello\\n'")
	// The fork is independent of its source.
	d.Run("scratch-copy", "sh", "-c", "echo fork > /home/loam/state.txt")
	if got := d.Run("scratch", "cat", "/home/loam/state.txt"); got != "v1\n" {
		t.Fatalf("source sees the fork's write: %q", got)
	}
	if err := d.C.DeleteSandbox(ctx, "scratch"); err != nil {
		t.Fatal(err)
	}
	if got := d.Run("scratch-copy", "sh", "-c", "cat /home/loam/state.txt; pgrep -a python3"); got != "fork\n"+pidBefore {
		t.Fatalf("fork after its source is gone: %q", got)
	}
	if sb, err := d.C.GetSandbox(ctx, "scratch-copy"); node != "" && (err != nil || sb.Node != node) {
		t.Errorf("the fork of a checkpoint on node %s: %+v, %v; want it there", node, sb, err)
	}
}

// counter starts a process that counts in memory (and writes each number
// to /tmp/count, a file outside the checkpointed home).
func counter(t *testing.T, d *harness.Daemon, sb string) {
	d.Run(sb, "sh", "-c", `i=0; while true; do i=$((i+1)); echo $i > /tmp/count.tmp; mv /tmp/count.tmp /tmp/count; sleep 0.05; done >/dev/null 2>&1 &`)
	waitFor(t, func() bool { return readCount(t, d, sb) > 0 })
}

// countWindow brackets the count a memory checkpoint of a counter's
// sandbox holds: read just before it was taken and just after. A look
// taken once, after the checkpoint, is no bound on a loaded host: the
// counter runs on while the look's exec arrives.
type countWindow struct{ before, after int }

// checkpointCounting reads sb's count around take, which checkpoints it.
func checkpointCounting(t *testing.T, d *harness.Daemon, sb string, take func()) countWindow {
	t.Helper()
	before := readCount(t, d, sb)
	take()
	return countWindow{before, readCount(t, d, sb)}
}

// startsFrom checks that sandbox sb, started from the checkpoint by a call
// made at since, counts on from it: its count is at least the one before
// the checkpoint, and at most the one after it plus a tick (50 ms) for
// each moment since. It returns the count.
func (w countWindow) startsFrom(t *testing.T, d *harness.Daemon, sb string, since time.Time) int {
	t.Helper()
	n := readCount(t, d, sb)
	most := w.after + int(time.Since(since)/(50*time.Millisecond)) + 1
	if n < w.before || n > most {
		t.Errorf("%s starts at %d; the checkpoint was between %d and %d, so want %d to %d", sb, n, w.before, w.after, w.before, most)
	}
	return n
}

func readCount(t *testing.T, d *harness.Daemon, sb string) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, _, _, err := d.C.Output(ctx, sb, "cat", "/tmp/count")
	if err != nil {
		t.Fatalf("reading count in %s: %v", sb, err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

// counts checks the counter moves on from at least from.
func counts(t *testing.T, d *harness.Daemon, sb string, from int) int {
	t.Helper()
	var n int
	waitFor(t, func() bool { n = readCount(t, d, sb); return n > from })
	return n
}

// TestCounter is gVisor's classic: a counter in memory keeps counting across
// a checkpoint, a restore and forks; the source keeps running unharmed.
func TestCounter(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "count"}); err != nil {
		t.Fatal(err)
	}
	counter(t, d, "count")
	win := checkpointCounting(t, d, "count", func() {
		cp, err := d.C.CreateCheckpoint(ctx, "count", api.CreateCheckpoint{Comment: "counting", Name: "tick"})
		if err != nil || cp.ID != "v1" || cp.Name != "tick" || !cp.Memory || cp.Auto {
			t.Fatalf("%v %+v", err, cp)
		}
	})
	atCP := win.after
	counts(t, d, "count", atCP+5) // the source carries on

	// Many forks of one checkpoint, at once: each counts on from about where
	// the checkpoint was, on its own.
	var wg sync.WaitGroup
	errs := make([]error, 3)
	forked := time.Now()
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = d.C.ForkWith(ctx, "count", "tick", api.CreateSandbox{Name: fmt.Sprintf("fork-%d", i), Labels: map[string]string{"fork": "yes"}})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("fork %d: %v", i, err)
		}
		name := fmt.Sprintf("fork-%d", i)
		counts(t, d, name, win.startsFrom(t, d, name, forked))
	}
	// Far enough on (5 s) that a count the restore did not roll back
	// cannot pass for one it did, however long the restore's look takes.
	srcNow := counts(t, d, "count", win.after+100)

	// Restore in place goes back to about the checkpoint's count and counts on.
	restored := time.Now()
	sb, err := d.C.RestoreCheckpoint(ctx, "count", "v1")
	if err != nil || sb.State != api.StateRunning || sb.Name != "count" {
		t.Fatalf("restore: %v %+v", err, sb)
	}
	n := win.startsFrom(t, d, "count", restored)
	if n >= srcNow {
		t.Errorf("after restore the count is %d, before it was %d: not rolled back", n, srcNow)
	}
	counts(t, d, "count", n)
	// Restoring auto-1 undoes the restore.
	if _, err := d.C.RestoreCheckpoint(ctx, "count", "auto-1"); err != nil {
		t.Fatal(err)
	}
	if n := readCount(t, d, "count"); n < srcNow {
		t.Errorf("after undoing the restore the count is %d, want at least %d", n, srcNow)
	}
}

// TestDiskOnlyAndIDs: a disk-only restore boots fresh with the files; ids
// are never reused; the limit; 404s; many changes then a restore.
func TestDiskOnlyAndIDs(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t, "--checkpoint-limit", "3")
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "disky"}); err != nil {
		t.Fatal(err)
	}
	counter(t, d, "disky")
	d.Run("disky", "sh", "-c", "echo one > /home/loam/f")
	f := false
	cp, err := d.C.CreateCheckpoint(ctx, "disky", api.CreateCheckpoint{Memory: &f, Comment: "files"})
	if err != nil || cp.ID != "v1" || cp.Memory {
		t.Fatalf("%v %+v", err, cp)
	}
	for i := range 20 {
		d.Run("disky", "sh", "-c", fmt.Sprintf("echo change-%d > /home/loam/f; echo %d > /home/loam/extra-%d", i, i, i))
	}
	if _, err := d.C.RestoreCheckpoint(ctx, "disky", "v1"); err != nil {
		t.Fatal(err)
	}
	if got := d.Run("disky", "sh", "-c", "cat /home/loam/f; ls /home/loam"); got != "one\nf\n" {
		t.Fatalf("after disk-only restore: %q", got)
	}
	// A fresh boot: the counter of before is not running.
	if ps := d.Run("disky", "ps", "-o", "args"); strings.Contains(ps, "count.tmp") {
		t.Fatalf("after a disk-only restore the counter of before runs:\n%s", ps)
	}
	// The auto checkpoint taken before that restore was a memory one.
	cps, err := d.C.ListCheckpoints(ctx, "disky")
	if err != nil || len(cps) != 2 || cps[1].ID != "auto-1" || !cps[1].Memory || !cps[1].Auto || cps[1].Comment != "before restoring v1" {
		t.Fatalf("%v %+v", err, cps)
	}

	// Ids are never reused, and the limit counts only checkpoints taken on request.
	v2, _ := d.C.CreateCheckpoint(ctx, "disky", api.CreateCheckpoint{Memory: &f})
	if err := d.C.DeleteCheckpoint(ctx, "disky", "v2"); err != nil || v2 == nil {
		t.Fatal(err)
	}
	v3, err := d.C.CreateCheckpoint(ctx, "disky", api.CreateCheckpoint{Memory: &f})
	if err != nil || v3.ID != "v3" {
		t.Fatalf("%v %+v", err, v3)
	}
	if _, err := d.C.CreateCheckpoint(ctx, "disky", api.CreateCheckpoint{Memory: &f, Name: "third"}); err != nil {
		t.Fatal(err)
	}
	_, err = d.C.CreateCheckpoint(ctx, "disky", api.CreateCheckpoint{Memory: &f})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeLimit || !strings.Contains(ae.Message, "remove one first") {
		t.Fatalf("over the limit: %v", err)
	}
	if _, err := d.C.CreateCheckpoint(ctx, "disky", api.CreateCheckpoint{Memory: &f, Name: "third"}); !errors.Is(err, api.ErrLimit) {
		t.Fatalf("over the limit with a name: %v", err)
	}
	if err := d.C.DeleteCheckpoint(ctx, "disky", "third"); err != nil {
		t.Fatal(err)
	}
	if cp, err := d.C.CreateCheckpoint(ctx, "disky", api.CreateCheckpoint{Memory: &f, Name: "third"}); err != nil || cp.ID != "v5" {
		t.Fatalf("%v %+v", err, cp)
	}

	for _, tc := range []struct{ method, path string }{
		{"GET", "/v1/sandboxes/disky/checkpoints/v2"},
		{"DELETE", "/v1/sandboxes/disky/checkpoints/v2"},
		{"POST", "/v1/sandboxes/disky/checkpoints/v2/restore"},
		{"GET", "/v1/sandboxes/nope/checkpoints"},
		{"POST", "/v1/sandboxes/nope/checkpoints"},
	} {
		status, body := d.Curl(tc.method, tc.path, "")
		var eb api.ErrorBody
		if json.Unmarshal([]byte(body), &eb); status != 404 || eb.Error == nil || eb.Error.Code != api.CodeNotFound {
			t.Errorf("%s %s: %d %s", tc.method, tc.path, status, body)
		}
	}
	status, body := d.Curl("POST", "/v1/sandboxes", `{"name":"x","from":{"sandbox":"disky","checkpoint":"v9"}}`)
	if status != 404 {
		t.Errorf("fork of a missing checkpoint: %d %s", status, body)
	}
	status, body = d.Curl("POST", "/v1/sandboxes/disky/checkpoints", `{"name":"v7"}`)
	if status != 400 {
		t.Errorf("a name like an id: %d %s", status, body)
	}
	sbs, _ := d.C.ListSandboxes(ctx, client.ListOptions{})
	if len(sbs) != 1 {
		t.Errorf("failed forks left sandboxes: %+v", sbs)
	}
}

// TestAutoPrune: restores keep the newest five automatic checkpoints, and
// GET /v1/templates lists both templates.
func TestAutoPrune(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	tpls, err := d.C.Templates(ctx)
	if err != nil || len(tpls) != 2 || tpls[0].Name != "base" || tpls[1].Name != "busybox" || !tpls[1].Default {
		t.Fatalf("templates: %v %+v", err, tpls)
	}
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "prune"}); err != nil {
		t.Fatal(err)
	}
	f := false
	if _, err := d.C.CreateCheckpoint(ctx, "prune", api.CreateCheckpoint{Memory: &f}); err != nil {
		t.Fatal(err)
	}
	for range 7 {
		if _, err := d.C.RestoreCheckpoint(ctx, "prune", "v1"); err != nil {
			t.Fatal(err)
		}
	}
	cps, err := d.C.ListCheckpoints(ctx, "prune")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, cp := range cps {
		ids = append(ids, cp.ID)
	}
	if got := strings.Join(ids, " "); got != "v1 auto-3 auto-4 auto-5 auto-6 auto-7" {
		t.Fatalf("checkpoints after 7 restores: %s", got)
	}
	snaps, _ := filepath.Glob(filepath.Join(d.DataDir, "disk", "mnt", "snapshots", "*"))
	if len(snaps) != 6 {
		t.Errorf("%d snapshots for 6 checkpoints: %v", len(snaps), snaps)
	}
}

// TestMemoryCheckpointDiskAgrees: a memory checkpoint's disk is the disk
// its memory saw. A shell appends 1, 2, 3… to a file as fast as it can,
// without syncing (its writes sit in the sandbox's page cache); after each
// checkpoint a fork of it, and after a restore the sandbox itself, carry on
// with no number missing or repeated. The disk snapshot is taken while the
// memory image is still being written, once runsc says the sandbox's
// filesystems are flushed: a snapshot taken before that flush loses lines
// the memory wrote, one taken after a resume holds lines it did not.
func TestMemoryCheckpointDiskAgrees(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "seq"}); err != nil {
		t.Fatal(err)
	}
	d.Run("seq", "sh", "-c", `cd /home/loam && (i=0; while :; do i=$((i+1)); echo $i >>seq; done) >/dev/null 2>&1 & echo $! >/home/loam/pid`)
	lines := func(sb string) int {
		t.Helper()
		n, _ := strconv.Atoi(strings.TrimSpace(d.Run(sb, "sh", "-c", "wc -l </home/loam/seq")))
		return n
	}
	// check lets the writer in sandbox sb go on, stops it, and checks its
	// file is 1..n.
	check := func(sb string) {
		t.Helper()
		from := lines(sb)
		waitFor(t, func() bool { return lines(sb) > from+10 })
		out := d.Run(sb, "sh", "-c", `p=$(cat /home/loam/pid); kill $p; while kill -0 $p 2>/dev/null; do sleep 0.01; done; awk 'NR != $1 {print "line " NR " is " $1; exit 1} END {print NR}' /home/loam/seq`)
		if _, err := strconv.Atoi(strings.TrimSpace(out)); err != nil {
			t.Errorf("%s: the file is not 1..n: %q", sb, out)
		}
	}
	waitFor(t, func() bool { return lines("seq") > 10 })
	for i := 1; i <= 3; i++ {
		cp, err := d.C.CreateCheckpoint(ctx, "seq", api.CreateCheckpoint{})
		if err != nil {
			t.Fatal(err)
		}
		fork := fmt.Sprintf("seq-fork-%d", i)
		if _, err := d.C.ForkWith(ctx, "seq", cp.ID, api.CreateSandbox{Name: fork}); err != nil {
			t.Fatal(err)
		}
		check(fork)
	}
	if _, err := d.C.RestoreCheckpoint(ctx, "seq", "v2"); err != nil {
		t.Fatal(err)
	}
	check("seq")
}
