package crash

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/network"
	"loam.dev/loam/test/harness"
)

// crasher runs one daemon with crash points and checks it after each crash.
type crasher struct {
	d   *harness.Daemon
	ctx context.Context
	arm string
	// logs is every log of the daemon's runs but the current one: the
	// sandbox ids they name are the ones whose leftovers are looked for.
	logs strings.Builder
	// crashLog is the log of the run that crashed last.
	crashLog string
	// seen is every checkpoint id ever listed, per sandbox id.
	seen map[string]map[string]bool
	// mounts and loops are the host's, as the prepared daemon has them.
	mounts []string
	loops  int
}

func newCrasher(t *testing.T, bin string) *crasher {
	arm := filepath.Join(t.TempDir(), "crash-at")
	if err := os.WriteFile(arm, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dataDir, err := os.MkdirTemp("", "loam-e2e-crash-")
	if err != nil {
		t.Fatal(err)
	}
	d := &harness.Daemon{T: t, DataDir: dataDir, Subnet: harness.NextSubnet(), Bin: bin, Env: []string{"LOAM_CRASH_AT=@" + arm}}
	d.Start()
	t.Cleanup(func() { d.Destroy() })
	return &crasher{d: d, arm: arm, seen: map[string]map[string]bool{}}
}

// crash arms point, runs op, and waits for the daemon to die there; then
// it disarms it and starts the daemon again, which recovers.
func (c *crasher) crash(t *testing.T, point string, op func(ctx context.Context) error) {
	t.Helper()
	c.crashTwice(t, point, "", op)
}

// crashTwice is crash, but the start-up after the first crash is armed at
// recovering, a point its recovery passes: it dies there too, and the
// start after that recovers from both crashes at once.
func (c *crasher) crashTwice(t *testing.T, point, recovering string, op func(ctx context.Context) error) {
	t.Helper()
	if err := os.WriteFile(c.arm, []byte(point), 0o644); err != nil {
		t.Fatal(err)
	}
	exited := c.d.Exited
	cmd := c.d.Cmd
	ctx, cancel := context.WithTimeout(c.ctx, 2*time.Minute)
	defer cancel()
	opErr := make(chan error, 1)
	go func() { opErr <- op(ctx) }()
	var err error
	reached := false
	select {
	case <-exited:
		reached = true
	case err = <-opErr:
		select {
		case <-exited:
			reached = true
		case <-time.After(30 * time.Second):
		}
	case <-time.After(2 * time.Minute):
	}
	if !reached {
		_ = cmd.Process.Kill()
		<-exited
	}
	if werr := os.WriteFile(c.arm, []byte(recovering), 0o644); werr != nil {
		t.Fatal(werr)
	}
	log := c.d.Log.String()
	c.logs.WriteString(log)
	c.crashLog = log
	c.d.Cmd = nil
	if !reached || !strings.Contains(log, "crash point "+point+":") {
		// Start it again all the same: the next cases need a daemon.
		_ = os.WriteFile(c.arm, nil, 0o644)
		_ = c.d.Launch()
		t.Fatalf("the daemon did not die at %s (the operation returned %v)", point, err)
	}
	if recovering != "" {
		lerr := c.d.Launch()
		if werr := os.WriteFile(c.arm, nil, 0o644); werr != nil {
			t.Fatal(werr)
		}
		log := c.d.Log.String()
		c.logs.WriteString(log)
		c.crashLog += "\n--- the start-up that crashed while it recovered:\n" + log
		if lerr == nil {
			t.Fatalf("the recovery after the crash at %s did not pass %s", point, recovering)
		}
		c.d.Kill() // it has exited, unless it hung in its start-up
		if !errors.Is(lerr, harness.ErrDaemonExited) || !strings.Contains(log, "crash point "+recovering+":") {
			_ = c.d.Launch()
			t.Fatalf("the recovery after the crash at %s did not die at %s: %v", point, recovering, lerr)
		}
	}
	if err := c.d.Launch(); err != nil {
		t.Fatalf("starting again after the crash at %s: %v", point, err)
	}
}

func (c *crasher) create(t *testing.T, name string, template ...string) {
	t.Helper()
	req := api.CreateSandbox{Name: name}
	if len(template) > 0 {
		req.Template = template[0]
	}
	if _, err := c.d.C.CreateSandbox(c.ctx, req); err != nil {
		t.Fatal(err)
	}
}

func (c *crasher) delete(t *testing.T, name string) {
	t.Helper()
	if err := c.d.C.DeleteSandbox(c.ctx, name); err != nil {
		t.Fatal(err)
	}
}

func (c *crasher) out(t *testing.T, name string, cmd ...string) string {
	t.Helper()
	return c.d.RunB(t, name, cmd...)
}

// mark writes disk into the sandbox's disk and mem into its memory.
func (c *crasher) mark(t *testing.T, name, disk, mem string) {
	t.Helper()
	c.out(t, name, "sh", "-c", fmt.Sprintf("printf %s > /home/loam/disk && printf %s > /dev/shm/mem && sync", disk, mem))
}

// facts is "DISK|MEM" as the sandbox has them (MEM "none" when its memory
// was lost); it wakes a sleeping sandbox.
func (c *crasher) facts(t *testing.T, name string) string {
	t.Helper()
	out := c.out(t, name, "sh", "-c", "cat /home/loam/disk; printf '|'; cat /dev/shm/mem 2>/dev/null || printf none")
	return strings.TrimSpace(out)
}

func (c *crasher) expectFacts(t *testing.T, name, want string) {
	t.Helper()
	if got := c.facts(t, name); got != want {
		t.Errorf("%s: disk|memory %q, want %q", name, got, want)
	}
}

func (c *crasher) state(t *testing.T, name string) api.State {
	t.Helper()
	sb, err := c.d.C.GetSandbox(c.ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return sb.State
}

func (c *crasher) checkpoint(t *testing.T, name string, memory bool) string {
	t.Helper()
	cp, err := c.d.C.CreateCheckpoint(c.ctx, name, api.CreateCheckpoint{Memory: &memory})
	if err != nil {
		t.Fatal(err)
	}
	c.sawCP(t, name, cp.ID)
	return cp.ID
}

func (c *crasher) deleteCP(t *testing.T, name, id string) {
	t.Helper()
	if err := c.d.C.DeleteCheckpoint(c.ctx, name, id); err != nil {
		t.Fatal(err)
	}
}

func (c *crasher) listCPs(t *testing.T, name string) []api.Checkpoint {
	t.Helper()
	cps, err := c.d.C.ListCheckpoints(c.ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return cps
}

// sawCP records a checkpoint id handed out for the first time; one seen
// before is an id handed out twice.
func (c *crasher) sawCP(t *testing.T, name, id string) {
	t.Helper()
	sb := c.id(t, name)
	if c.seen[sb] == nil {
		c.seen[sb] = map[string]bool{}
	}
	if c.seen[sb][id] {
		t.Errorf("checkpoint id %s of %s was handed out before", id, name)
	}
	c.seen[sb][id] = true
}

// id is sandbox name's id.
func (c *crasher) id(t *testing.T, name string) string {
	t.Helper()
	sb, err := c.d.C.GetSandbox(c.ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return sb.ID
}

// newCheckpoints checks the checkpoints listed now that were not before:
// at most one, with an id never seen, that forks into want.
func (c *crasher) newCheckpoints(t *testing.T, name string, before []api.Checkpoint, want string) {
	t.Helper()
	var added []api.Checkpoint
	for _, cp := range c.listCPs(t, name) {
		if !slices.ContainsFunc(before, func(b api.Checkpoint) bool { return b.ID == cp.ID }) {
			added = append(added, cp)
		}
	}
	if len(added) > 1 {
		t.Errorf("%d new checkpoints after one operation: %+v", len(added), added)
	}
	for _, cp := range added {
		t.Logf("new checkpoint %s (memory %v)", cp.ID, cp.Memory)
		c.sawCP(t, name, cp.ID)
		if !cp.Memory {
			want = strings.Split(want, "|")[0] + "|none"
		}
		c.forkCheck(t, name, cp.ID, want)
	}
}

// forkCheck forks checkpoint id and checks the fork's disk and memory.
func (c *crasher) forkCheck(t *testing.T, name, id, want string) {
	t.Helper()
	if _, err := c.d.C.Fork(c.ctx, name, id, "check-fork"); err != nil {
		t.Fatalf("forking %s: %v", id, err)
	}
	c.expectFacts(t, "check-fork", want)
	c.delete(t, "check-fork")
}

// nextIDIsNew takes a checkpoint and checks that its id is one never seen
// (an id spent by the operation cut short is not handed out again), then
// deletes it.
func (c *crasher) nextIDIsNew(t *testing.T, name string) {
	t.Helper()
	high := 0
	for id := range c.seen[c.id(t, name)] {
		if n, err := strconv.Atoi(strings.TrimPrefix(id, "v")); err == nil {
			high = max(high, n)
		}
	}
	id := c.checkpoint(t, name, false)
	n, _ := strconv.Atoi(strings.TrimPrefix(id, "v"))
	// The operation cut short had spent high+1.
	if n < high+2 {
		t.Errorf("new checkpoint %s after a checkpoint cut short; the highest seen was v%d, so v%d was spent", id, high, high+1)
	}
	c.deleteCP(t, name, id)
}

// pruneAutos deletes the automatic checkpoints, so that they do not pile up.
func (c *crasher) pruneAutos(t *testing.T, name string) {
	t.Helper()
	for _, cp := range c.listCPs(t, name) {
		if cp.Auto {
			c.deleteCP(t, name, cp.ID)
		}
	}
}

// beforeOrAfterCreate checks a create cut short: no sandbox name, or one
// running with disk|memory want (when given); the one made is deleted.
func (c *crasher) beforeOrAfterCreate(t *testing.T, name, want, template string) {
	t.Helper()
	sb, err := c.d.C.GetSandbox(c.ctx, name)
	if errors.Is(err, api.ErrNotFound) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s was made: %s", name, sb.State)
	if sb.State != api.StateRunning {
		t.Errorf("%s is %s after a create cut short, want running or none", name, sb.State)
	}
	if want != "" {
		c.expectFacts(t, name, want)
	} else {
		c.out(t, name, "true")
	}
	c.delete(t, name)
}

func (c *crasher) hasTemplate(t *testing.T, name string) bool {
	t.Helper()
	tpls, err := c.d.C.Templates(c.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(tpls, func(tp api.Template) bool { return tp.Name == name })
}

// waitPool waits until the busybox pool has want members ready, and no
// member is left beyond them on disk.
func (c *crasher) waitPool(t *testing.T, want int) {
	t.Helper()
	harness.Eventually(t, 90*time.Second, fmt.Sprintf("%d members of the pool ready, none more on disk", want), func() error {
		p, err := c.d.C.TemplatePool(c.ctx, "busybox")
		if err != nil {
			t.Fatal(err)
		}
		sbs, err := c.d.C.ListSandboxes(c.ctx, client.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		dirs := dirNamesOf(filepath.Join(c.d.DataDir, "sandboxes"))
		if p.Ready == want && p.Starting == 0 && len(dirs) == len(sbs)+want {
			return nil
		}
		return fmt.Errorf("the pool has %+v, %d sandbox dirs for %d sandboxes", p, len(dirs), len(sbs))
	})
}

// nftChain is the firewall chain of sandbox name's address, which its
// handle (DATA_DIR/sandboxes/ID/handle.json) says.
func (c *crasher) nftChain(t *testing.T, name string) string {
	t.Helper()
	sb, err := c.d.C.GetSandbox(c.ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(c.d.DataDir, "sandboxes", sb.ID, "handle.json"))
	var h struct {
		SandboxIP string `json:"sandbox_ip"`
	}
	if err == nil {
		err = json.Unmarshal(b, &h)
	}
	if err != nil || h.SandboxIP == "" {
		t.Fatalf("reading the handle of %s: %v", name, err)
	}
	ch := "sb_" + strings.ReplaceAll(h.SandboxIP, ".", "_")
	out, err := exec.Command("nft", "list", "chain", "ip", c.table(), ch).CombinedOutput()
	if err != nil {
		t.Fatalf("listing chain %s: %v\n%s", ch, err, out)
	}
	return string(out)
}

func (c *crasher) table() string {
	return network.TableName(netip.MustParsePrefix(c.d.Subnet))
}

// nftChains lists the per-sandbox chains (sb_ADDRESS) of the daemon's table.
func (c *crasher) nftChains(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("nft", "list", "table", "ip", c.table()).Output()
	if err != nil {
		t.Fatalf("listing firewall %s: %v", c.table(), err)
	}
	var chains []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "chain" && strings.HasPrefix(f[1], "sb_") {
			chains = append(chains, f[1])
		}
	}
	return chains
}

// baseline records the host's mounts and loop devices of the prepared
// daemon: every later inventory must match.
func (c *crasher) baseline(t *testing.T) {
	c.mounts = harness.MountsUnder(c.d.DataDir)
	c.loops = harness.LoopsOf(c.d.DataDir)
	c.checkAll(t)
}

// checkAll checks what every recovery must leave: sandboxes running or
// asleep, every listed checkpoint whole, and nothing on the host that no
// record accounts for.
func (c *crasher) checkAll(t *testing.T) {
	t.Helper()
	sbs, err := c.d.C.ListSandboxes(c.ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data := c.d.DataDir
	ids, running := map[string]bool{}, map[string]bool{}
	var snaps []string
	cpDirs := map[string][]string{}
	for _, sb := range sbs {
		ids[sb.ID] = true
		switch sb.State {
		case api.StateRunning:
			running[sb.ID] = true
			if out := c.out(t, sb.Name, "sh", "-c", "cat /home/loam/inconsistent 2>/dev/null; true"); out != "" {
				t.Errorf("%s runs with a memory older than its disk: %s", sb.Name, out)
			}
		case api.StateSleeping:
		default:
			t.Errorf("sandbox %s is %s after recovery", sb.Name, sb.State)
		}
		_, err := os.Stat(filepath.Join(data, "sandboxes", sb.ID, "sleep"))
		if (err == nil) != (sb.State == api.StateSleeping) {
			t.Errorf("sandbox %s is %s, and its sleep dir: %v", sb.Name, sb.State, err)
		}
		if _, err := os.Stat(filepath.Join(data, "sandboxes", sb.ID, ".sleep-dropped")); err == nil {
			t.Errorf("sandbox %s keeps a dropped sleep image", sb.Name)
		}
		for _, cp := range c.listCPs(t, sb.Name) {
			c.seen[sb.ID] = mapOr(c.seen[sb.ID])
			c.seen[sb.ID][cp.ID] = true
			dir := filepath.Join(data, "checkpoints", sb.ID, cp.ID)
			if cp.Memory {
				dir = filepath.Join(dir, "mem")
			}
			if _, err := os.Stat(dir); err != nil {
				t.Errorf("checkpoint %s of %s is listed without its data: %v", cp.ID, sb.Name, err)
			}
			snaps = append(snaps, sb.ID+"."+cp.ID)
			cpDirs[sb.ID] = append(cpDirs[sb.ID], cp.ID)
		}
	}
	c.checkAudit(t, sbs)
	tplDir := filepath.Join(data, "checkpoint-templates")
	for _, name := range dirNamesOf(tplDir) {
		b, err := os.ReadFile(filepath.Join(tplDir, name, "manifest.json"))
		var man struct{ Snapshot string }
		if err == nil {
			err = json.Unmarshal(b, &man)
		}
		if err != nil {
			t.Errorf("template dir %s: %v", name, err)
			continue
		}
		snaps = append(snaps, man.Snapshot)
	}
	same := func(what string, got, want []string) {
		t.Helper()
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", what, got, want)
		}
	}
	same("sandbox dirs", dirNamesOf(filepath.Join(data, "sandboxes")), keys(ids))
	same("disk volumes", dirNamesOf(filepath.Join(data, "disk", "mnt", "volumes")), keys(ids))
	same("disk snapshots", dirNamesOf(filepath.Join(data, "disk", "mnt", "snapshots")), snaps)
	same("disk work in progress", dirNamesOf(filepath.Join(data, "disk", "mnt", "tmp")), nil)
	images, err := c.d.C.ListImages(c.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var imageTpls, wantTpls []string
	for _, im := range images {
		if hex := strings.TrimPrefix(im.Digest, "sha256:"); len(hex) >= 16 {
			wantTpls = append(wantTpls, "image-"+hex[:16])
		}
	}
	for _, name := range dirNamesOf(filepath.Join(data, "disk", "mnt", "templates")) {
		if strings.HasPrefix(name, "image-") {
			imageTpls = append(imageTpls, name)
		}
	}
	same("image templates in the disk pool", imageTpls, wantTpls)
	var withCPs []string
	for id, cps := range cpDirs {
		withCPs = append(withCPs, id)
		same("checkpoint data of "+id, dirNamesOf(filepath.Join(data, "checkpoints", id)), cps)
	}
	var cpParents []string
	for _, id := range dirNamesOf(filepath.Join(data, "checkpoints")) {
		if len(dirNamesOf(filepath.Join(data, "checkpoints", id))) > 0 || !ids[id] {
			cpParents = append(cpParents, id)
		}
	}
	same("checkpoint dirs", cpParents, withCPs)
	same("runsc containers", runscList(t, filepath.Join(data, "runsc")), keys(running))
	if c.mounts != nil {
		same("mounts under the data dir", harness.MountsUnder(data), slices.Clone(c.mounts))
		if n := harness.LoopsOf(data); n != c.loops {
			t.Errorf("%d loop devices on the pool's image, want %d", n, c.loops)
		}
	}
	if n := len(c.nftChains(t)); n != len(ids) {
		t.Errorf("%d sandbox chains in firewall %s for %d sandboxes", n, c.table(), len(ids))
	}
	// What the host holds of sandboxes this daemon ever named, and no
	// record has now.
	all := c.logs.String() + c.d.Log.String()
	for _, id := range uniqStrings(regexp.MustCompile(`\bsb-[a-z0-9]{12}\b`).FindAllString(all, -1)) {
		if ids[id] {
			continue
		}
		if _, err := os.Stat(filepath.Join("/run/netns", "loam-"+id)); err == nil {
			t.Errorf("network namespace loam-%s of a sandbox gone is left", id)
		}
		if _, err := os.Stat(filepath.Join("/sys/class/net", "lm"+strings.TrimPrefix(id, "sb-"))); err == nil {
			t.Errorf("veth of a sandbox gone (%s) is left", id)
		}
		if m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", "loam", id)); len(m) > 0 {
			t.Errorf("cgroups of a sandbox gone are left: %v", m)
		}
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", "loam", id)); err == nil {
			t.Errorf("cgroup of a sandbox gone (%s) is left", id)
		}
	}
	for _, id := range keys(ids) {
		if !running[id] {
			continue
		}
		if m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", "loam", id)); len(m) == 0 {
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", "loam", id)); err != nil {
				t.Logf("no cgroup found for running sandbox %s (cgroup layout?)", id)
			}
		}
	}
}

func mapOr(m map[string]bool) map[string]bool {
	if m == nil {
		return map[string]bool{}
	}
	return m
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func uniqStrings(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}

// dirNamesOf lists a directory's entries (none when it is missing).
func dirNamesOf(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// runscList lists the containers of a runsc root.
func runscList(t *testing.T, root string) []string {
	t.Helper()
	out, err := exec.Command(harness.Runsc(), "--root", root, "list", "-quiet").Output()
	if err != nil {
		t.Fatalf("runsc list: %v", err)
	}
	return strings.Fields(string(out))
}

// beforeOrRestored checks that main is as before a restore to the memory
// checkpoint of d0/m0 (d1|m1, its checkpoints as before, and in state
// asleep when that is given) or as after it (d0|m0, running, with one
// checkpoint more: the automatic one, holding d1/m1); then it marks d1/m1
// again and drops the automatic checkpoints, for the next case.
func (c *crasher) beforeOrRestored(t *testing.T, before []api.Checkpoint, asleep api.State) {
	t.Helper()
	st := c.state(t, "main")
	after := c.listCPs(t, "main")
	got := c.facts(t, "main") // wakes it
	switch {
	case got == "d1|m1" && len(after) == len(before) && (asleep == "" || st == asleep):
		t.Logf("%s, before the restore", st)
	case got == "d0|m0" && len(after) == len(before)+1 && st == api.StateRunning:
		t.Logf("restored")
		c.newCheckpoints(t, "main", before, "d1|m1")
		c.mark(t, "main", "d1", "m1")
	default:
		t.Errorf("after the crash: %s, disk|memory %q with %d checkpoints (%d before): neither before nor after the restore", st, got, len(after), len(before))
	}
	c.pruneAutos(t, "main")
}

// checkAudit checks the audit log against what the store holds, across
// every crash so far. Sandboxes: each listed one is named by one more ok
// sandbox.create or sandbox.fork record than ok sandbox.delete records,
// each unlisted name by as many (a create a crash cut short, which
// recovery deleted, has none: its record goes with the write that stores
// it running). Checkpoints, for sandbox main (made once, never deleted, so
// a record's target names one checkpoint of it): each checkpoint a call
// of the API made is named by exactly one checkpoint.create record,
// written with it; a checkpoint a crash left unmade (its id spent) has
// none.
func (c *crasher) checkAudit(t *testing.T, sbs []api.Sandbox) {
	t.Helper()
	// ok records of each action, by their target.
	okRecords := func(action string) map[string]int {
		out := map[string]int{}
		var seq int64
		for {
			page, err := c.d.C.Audit(c.ctx, client.AuditOptions{Action: action, SinceSeq: seq})
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range page {
				if ev.Outcome == "ok" {
					out[ev.Target]++
				}
				seq = ev.Seq
			}
			if len(page) < api.MaxAuditPage {
				return out
			}
		}
	}
	made := okRecords("sandbox.create")
	for target, n := range okRecords("sandbox.fork") {
		made[target] += n
	}
	deleted := okRecords("sandbox.delete")
	listedSB := map[string]bool{}
	for _, sb := range sbs {
		listedSB["sandboxes/"+sb.Name] = true
	}
	for target := range listedSB {
		if n := made[target] - deleted[target]; n != 1 {
			t.Errorf("%s is listed, and the audit log has %d ok creates of it, %d ok deletes", target, made[target], deleted[target])
		}
	}
	for target, n := range made {
		if !listedSB[target] && n != deleted[target] {
			t.Errorf("%s is not listed, and the audit log has %d ok creates of it, %d ok deletes", target, n, deleted[target])
		}
	}
	if !listedSB["sandboxes/main"] {
		return
	}
	const prefix = "sandboxes/main/checkpoints"
	ofMain := func(action string) map[string]int {
		out := map[string]int{}
		for target, n := range okRecords(action) {
			if strings.HasPrefix(target, prefix) {
				out[strings.TrimPrefix(strings.TrimPrefix(target, prefix), "/")] += n
			}
		}
		return out
	}
	records, deletes := ofMain("checkpoint.create"), ofMain("checkpoint.delete")
	listed := map[string]bool{}
	for _, cp := range c.listCPs(t, "main") {
		listed[cp.ID] = true
		if !cp.Auto && !cp.Inside && records[cp.ID] != 1 {
			t.Errorf("checkpoint %s of main is listed, and the audit log has %d records of it", cp.ID, records[cp.ID])
		}
	}
	for id := range records {
		if id == "" {
			t.Errorf("the audit log has a checkpoint.create of main that names no checkpoint")
		} else if !listed[id] && deletes[id] == 0 {
			t.Errorf("the audit log records checkpoint %s of main, which is neither listed nor deleted", id)
		}
	}
	for id, n := range records {
		if n > 1 {
			t.Errorf("the audit log has %d records of checkpoint %s of main", n, id)
		}
	}
}
