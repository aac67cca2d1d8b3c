package gvisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"loam.dev/loam/internal/network"
	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/internal/testenv"
)

// This package's tests' subnet and name prefixes, distinct from every other
// test package's, so that packages can run at the same time.
const (
	testSubnet      = "10.250.2.0/24"
	testNetnsPrefix = "loamtest-gv-"
	testVethPrefix  = "ltg"
	defaultRunsc    = "/var/cache/loam/bin/runsc-160fafc42237"
	counterPort     = 8080
)

// helperEnv, when set, makes the test binary act as a short-lived daemon
// that starts the container described by the variable's JSON and exits.
const helperEnv = "LOAM_GVISOR_TEST_START"

func TestMain(m *testing.M) {
	if v := os.Getenv(helperEnv); v != "" {
		os.Exit(startHelper(v))
	}
	code := m.Run()
	if agentDir != "" {
		os.RemoveAll(agentDir)
	}
	os.Exit(code)
}

// helperStart is what a helper process is asked to do.
type helperStart struct {
	Runsc, Root string
	Spec        runtime.Spec
}

func startHelper(v string) int {
	var h helperStart
	if err := json.Unmarshal([]byte(v), &h); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rt, err := New(Config{Runsc: h.Runsc, Root: h.Root})
	if err == nil {
		err = rt.Start(context.Background(), h.Spec)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// rlimit is the soft limit of typ in s, which must equal the hard one; 0
// when s sets none.
func rlimit(s *specs.Spec, typ string) uint64 {
	for _, r := range s.Process.Rlimits {
		if r.Type == typ && r.Soft == r.Hard {
			return r.Soft
		}
	}
	return 0
}

func TestOCISpec(t *testing.T) {
	spec := runtime.Spec{
		ID: "sb-000000000000", BundleDir: "/b", Rootfs: "/r", Netns: "/var/run/netns/n",
		Hostname: "h", AgentBinary: "/loam", Env: []string{"A=1"}, CPUs: 1.5, MemoryMiB: 512,
	}
	s := ociSpec(spec)
	if s.Root.Path != "/r" || s.Root.Readonly {
		t.Errorf("root = %+v, want /r writable", s.Root)
	}
	if !slices.Equal(s.Process.Args, runtime.AgentArgs) {
		t.Errorf("args = %v, want %v", s.Process.Args, runtime.AgentArgs)
	}
	if want := []string{defaultPath, "A=1"}; !slices.Equal(s.Process.Env, want) {
		t.Errorf("env = %v, want %v", s.Process.Env, want)
	}
	if s.Hostname != "h" || s.Linux.CgroupsPath != "/loam/sb-000000000000" {
		t.Errorf("hostname %q, cgroups path %q", s.Hostname, s.Linux.CgroupsPath)
	}
	var agent, netns bool
	for _, m := range s.Mounts {
		if m.Destination == runtime.AgentPath && m.Source == "/loam" && slices.Contains(m.Options, "ro") {
			agent = true
		}
	}
	for _, ns := range s.Linux.Namespaces {
		if ns.Type == "network" && ns.Path == "/var/run/netns/n" {
			netns = true
		}
	}
	if !agent || !netns {
		t.Errorf("agent mounted read-only: %v; network namespace joined: %v", agent, netns)
	}
	r := s.Linux.Resources
	if r == nil || *r.Memory.Limit != 512<<20 || *r.CPU.Quota != 150000 || *r.CPU.Period != 100000 {
		t.Errorf("resources = %+v, want 512 MiB and 150000/100000", r)
	}
	if got := rlimit(s, "RLIMIT_NPROC"); got != 512 {
		t.Errorf("RLIMIT_NPROC at 512 MiB = %d, want 512", got)
	}
	if got := rlimit(s, "RLIMIT_NOFILE"); got != 1<<20 {
		t.Errorf("RLIMIT_NOFILE = %d, want %d", got, 1<<20)
	}
	if len(s.Annotations) != 0 {
		t.Errorf("annotations without a disk quota = %v, want none", s.Annotations)
	}
	withQuota := spec
	withQuota.DiskQuota = "/sys/fs/btrfs/x/qgroups/0_256"
	if got := ociSpec(withQuota).Annotations[QuotaAnnotation]; got != withQuota.DiskQuota {
		t.Errorf("annotation %s = %q, want %q", QuotaAnnotation, got, withQuota.DiskQuota)
	}
	for mib, want := range map[int]uint64{64: 128, 2048: 2048, 1 << 20: 4096, 0: 4096} {
		spec.MemoryMiB = mib
		if got := rlimit(ociSpec(spec), "RLIMIT_NPROC"); got != want {
			t.Errorf("RLIMIT_NPROC at %d MiB = %d, want %d", mib, got, want)
		}
	}
	spec.CPUs, spec.MemoryMiB = 0, 0
	spec.Env = []string{"PATH=/x"}
	s = ociSpec(spec)
	if s.Linux.Resources != nil || !slices.Equal(s.Process.Env, spec.Env) {
		t.Errorf("without limits: resources %+v, env %v", s.Linux.Resources, s.Process.Env)
	}
}

func TestLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.newSandbox(t, "sb-gvtestlife00", 0)
	if err := e.rt.Start(ctx, sb.spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	checkNoChildren(t)
	e.wantState(t, sb.spec.ID, runtime.StatusRunning)
	r := sb.ask(t)
	if r.N != 1 || r.PID != 1 || r.UID != 0 || r.Hostname != sb.spec.Hostname {
		t.Errorf("first answer = %+v, want n 1, pid 1, uid 0, hostname %s", r, sb.spec.Hostname)
	}
	if !slices.Equal(r.Args, runtime.AgentArgs) || !slices.Contains(r.Env, "LOAM_TEST=1") {
		t.Errorf("init's args %v, env %v", r.Args, r.Env)
	}
	sb.waitLog(t, "counter: served 1")

	// The sandbox process's pid, from the state file, is runsc's and its
	// process is runsc's sandbox, whose command line names the container.
	pid, err := e.rt.SandboxPid(ctx, sb.spec.ID)
	if err != nil {
		t.Fatalf("SandboxPid: %v", err)
	}
	out, err := e.rt.run(ctx, sb.spec.ID, "state", sb.spec.ID)
	var st struct{ Pid int }
	if err != nil || json.Unmarshal(out, &st) != nil || st.Pid != pid {
		t.Errorf("SandboxPid %d, runsc state says %s (%v)", pid, out, err)
	}
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err != nil || !strings.Contains(string(cmdline), sb.spec.ID) {
		t.Errorf("process %d: %q %v", pid, cmdline, err)
	}
	if n, err := e.rt.OOMKills(sb.spec.ID); err != nil || n != 0 {
		t.Errorf("OOMKills = %d, %v; want 0", n, err)
	}

	if err := e.rt.Start(ctx, sb.spec); !errors.Is(err, runtime.ErrExist) {
		t.Errorf("Start of a running id: %v, want ErrExist", err)
	}

	if err := e.rt.Pause(ctx, sb.spec.ID); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	e.wantState(t, sb.spec.ID, runtime.StatusPaused)
	if err := e.rt.Resume(ctx, sb.spec.ID); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	e.wantState(t, sb.spec.ID, runtime.StatusRunning)
	if r := sb.ask(t); r.N != 2 {
		t.Errorf("after resume n = %d, want 2", r.N)
	}

	for range 2 {
		if err := e.rt.Delete(ctx, sb.spec.ID); err != nil {
			t.Fatalf("Delete: %v", err)
		}
	}
	if _, err := e.rt.State(ctx, sb.spec.ID); !errors.Is(err, runtime.ErrNotExist) {
		t.Errorf("State after Delete: %v, want ErrNotExist", err)
	}
	checkNoChildren(t)
}

func TestUnknownID(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const id = "sb-gvtestnone00"
	if _, err := e.rt.State(ctx, id); !errors.Is(err, runtime.ErrNotExist) {
		t.Errorf("State: %v, want ErrNotExist", err)
	}
	if err := e.rt.Pause(ctx, id); !errors.Is(err, runtime.ErrNotExist) {
		t.Errorf("Pause: %v, want ErrNotExist", err)
	}
	if err := e.rt.Resume(ctx, id); !errors.Is(err, runtime.ErrNotExist) {
		t.Errorf("Resume: %v, want ErrNotExist", err)
	}
	img := filepath.Join(t.TempDir(), "img")
	if err := e.rt.Checkpoint(ctx, id, img, runtime.CheckpointOptions{}); !errors.Is(err, runtime.ErrNotExist) {
		t.Errorf("Checkpoint: %v, want ErrNotExist", err)
	}
	if err := e.rt.Delete(ctx, id); err != nil {
		t.Errorf("Delete: %v, want nil", err)
	}
	if _, err := e.rt.State(ctx, "bad/id"); err == nil {
		t.Error("State of an id with a slash: nil error, want one")
	}
}

func TestStartFailure(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.newSandbox(t, "sb-gvtestfail00", 1)
	// A file that is not a namespace passes the driver's checks and
	// fails in runsc's sandbox process.
	notNetns := filepath.Join(t.TempDir(), "not-a-netns")
	if err := os.WriteFile(notNetns, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sb.spec.Netns = notNetns
	err := e.rt.Start(ctx, sb.spec)
	if err == nil {
		t.Fatal("Start with a bad namespace: nil error, want one")
	}
	t.Logf("Start failed as it should: %v", err)
	if !strings.Contains(err.Error(), "not-a-netns") {
		t.Errorf("error %q does not tell what runsc said", err)
	}
	if _, err := e.rt.State(ctx, sb.spec.ID); !errors.Is(err, runtime.ErrNotExist) {
		t.Errorf("State after a failed Start: %v, want ErrNotExist", err)
	}
	if cgs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", CgroupParent, sb.spec.ID)); len(cgs) > 0 {
		t.Errorf("cgroups left after a failed Start: %v", cgs)
	}
	checkNoChildren(t)

	sb.spec.Netns = sb.ep.Netns
	sb.spec.AgentBinary = filepath.Join(t.TempDir(), "missing")
	if err := e.rt.Start(ctx, sb.spec); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Start with a missing agent binary: %v, want ErrNotExist", err)
	}
}

// TestOutlivesCaller starts a container from another process that then
// exits, as a daemon that is restarted would.
func TestOutlivesCaller(t *testing.T) {
	e := newEnv(t)
	sb := e.newSandbox(t, "sb-gvtestdetach", 2)
	b, err := json.Marshal(helperStart{Runsc: e.runsc, Root: e.root, Spec: sb.spec})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(b))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helper: %v: %s", err, out)
	}
	e.wantState(t, sb.spec.ID, runtime.StatusRunning)
	if r := sb.ask(t); r.N != 1 {
		t.Errorf("n = %d, want 1", r.N)
	}
}

func TestCheckpointLeaveRunning(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.newSandbox(t, "sb-gvtestleave0", 3)
	sb.spec.CPUs = 0.5
	if err := e.rt.Start(ctx, sb.spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	sb.ask(t)
	img := filepath.Join(t.TempDir(), "img")
	if err := e.rt.Checkpoint(ctx, sb.spec.ID, img, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	// The quota is lifted during the checkpoint only.
	if q, err := cpuQuota(sb.spec.ID); err != nil || q != 0.5 {
		t.Errorf("CPU quota after a checkpoint = %g, %v; want 0.5", q, err)
	}
	if _, err := os.Stat(filepath.Join(img, "checkpoint.img")); err != nil {
		t.Errorf("image: %v", err)
	}
	e.wantState(t, sb.spec.ID, runtime.StatusRunning)
	if r := sb.ask(t); r.N != 2 {
		t.Errorf("after checkpoint n = %d, want 2", r.N)
	}
	err := e.rt.Checkpoint(ctx, sb.spec.ID, img, runtime.CheckpointOptions{LeaveRunning: true})
	if !errors.Is(err, fs.ErrExist) {
		t.Errorf("Checkpoint into an existing directory: %v, want ErrExist", err)
	}

	// A memory checkpoint with a disk snapshot: pause, checkpoint,
	// (snapshot the disk), resume.
	if err := e.rt.Pause(ctx, sb.spec.ID); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	img2 := filepath.Join(t.TempDir(), "img")
	if err := e.rt.Checkpoint(ctx, sb.spec.ID, img2, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatalf("Checkpoint while paused: %v", err)
	}
	e.wantState(t, sb.spec.ID, runtime.StatusPaused)
	if err := e.rt.Resume(ctx, sb.spec.ID); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if r := sb.ask(t); r.N != 3 {
		t.Errorf("after checkpoint while paused n = %d, want 3", r.N)
	}
	checkNoChildren(t)
}

// TestRestoreInPlace is a sleep and a wake: checkpoint, delete, restore
// into the same id, and the counter goes on.
func TestRestoreInPlace(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.newSandbox(t, "sb-gvtestplace0", 4)
	if err := e.rt.Start(ctx, sb.spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	sb.ask(t)
	sb.ask(t)
	img := filepath.Join(t.TempDir(), "img")
	if err := e.rt.Checkpoint(ctx, sb.spec.ID, img, runtime.CheckpointOptions{}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if err := e.rt.Restore(ctx, sb.spec, img); !errors.Is(err, runtime.ErrExist) {
		t.Errorf("Restore onto an id that still exists: %v, want ErrExist", err)
	}
	if err := e.rt.Delete(ctx, sb.spec.ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	sb.prepare(t)
	if err := e.rt.Restore(ctx, sb.spec, img); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	checkNoChildren(t)
	e.wantState(t, sb.spec.ID, runtime.StatusRunning)
	if r := sb.ask(t); r.N != 3 {
		t.Errorf("after restore n = %d, want 3", r.N)
	}
	// Lines from before and after the restore, none written over.
	sb.waitLog(t, "counter: served 1\ncounter: served 2\ncounter: served 3\n")
}

// TestFork restores a checkpoint of a running sandbox into a new id in a
// new namespace: both go on counting, each on its own.
func TestFork(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a := e.newSandbox(t, "sb-gvtestforka0", 5)
	if err := e.rt.Start(ctx, a.spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	a.ask(t)
	img := filepath.Join(t.TempDir(), "img")
	if err := e.rt.Checkpoint(ctx, a.spec.ID, img, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	b := e.newSandbox(t, "sb-gvtestforkb0", 6)
	b.spec.CPUs = 0.5
	if err := e.rt.Restore(ctx, b.spec, img); err != nil {
		t.Fatalf("Restore as a fork: %v", err)
	}
	// The quota, lifted while the memory loads, is in place once it has.
	if q, err := filepath.Glob(filepath.Join("/sys/fs/cgroup/cpu*", CgroupParent, b.spec.ID, "cpu.cfs_quota_us")); err != nil || len(q) == 0 {
		t.Errorf("no cpu cgroup for the fork: %v", err)
	} else if got, _ := os.ReadFile(q[0]); strings.TrimSpace(string(got)) != "50000" {
		t.Errorf("fork's CPU quota = %q, want 50000", got)
	}
	if r := b.ask(t); r.N != 2 || r.Hostname != b.spec.Hostname {
		t.Errorf("fork's answer = %+v, want n 2 and hostname %s", r, b.spec.Hostname)
	}
	if r := b.ask(t); r.N != 3 {
		t.Errorf("fork's n = %d, want 3", r.N)
	}
	if r := a.ask(t); r.N != 2 {
		t.Errorf("original's n = %d, want 2", r.N)
	}
	e.wantState(t, a.spec.ID, runtime.StatusRunning)
	e.wantState(t, b.spec.ID, runtime.StatusRunning)
}

func TestLimits(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.newSandbox(t, "sb-gvtestlimit0", 7)
	sb.spec.MemoryMiB = 256
	sb.spec.CPUs = 0.5
	if err := e.rt.Start(ctx, sb.spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	sb.ask(t)
	cg := filepath.Join(CgroupParent, sb.spec.ID)
	for _, c := range []struct{ v1, v2, want string }{
		{"memory" + cg + "/memory.limit_in_bytes", cg + "/memory.max", strconv.Itoa(256 << 20)},
		{"cpu" + cg + "/cpu.cfs_quota_us", cg + "/cpu.max", "50000"},
	} {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", c.v1))
		if errors.Is(err, fs.ErrNotExist) {
			b, err = os.ReadFile(filepath.Join("/sys/fs/cgroup", c.v2))
		}
		if err != nil {
			t.Errorf("reading the container's cgroup: %v", err)
			continue
		}
		if got := strings.Fields(string(b)); len(got) == 0 || got[0] != c.want {
			t.Errorf("%s = %q, want %s", c.v1, b, c.want)
		}
	}
	if err := e.rt.Delete(ctx, sb.spec.ID); err != nil {
		t.Fatal(err)
	}
	if cgs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", cg)); len(cgs) > 0 {
		t.Errorf("cgroups left after Delete: %v", cgs)
	}
}

// env is one test's runtime, with its own runsc root, and network.
type env struct {
	rt    *Runtime
	net   *network.Manager
	runsc string
	root  string
}

func newEnv(tb testing.TB) *env {
	tb.Helper()
	runsc := requireRunsc(tb)
	buildAgent(tb)
	root := filepath.Join(tb.TempDir(), "runsc")
	rt, err := New(Config{Runsc: runsc, Root: root})
	if err != nil {
		tb.Fatal(err)
	}
	// Before the TempDir's removal, which null-netns would block.
	tb.Cleanup(func() {
		if err := rt.Close(); err != nil {
			tb.Error(err)
		}
	})
	nm, err := network.New(network.Config{
		Subnet:      netip.MustParsePrefix(testSubnet),
		NetnsPrefix: testNetnsPrefix,
		VethPrefix:  testVethPrefix,
	})
	if err != nil {
		tb.Fatal(err)
	}
	return &env{rt: rt, net: nm, runsc: runsc, root: root}
}

// sandbox is a container's spec and endpoint, made by newSandbox.
type sandbox struct {
	spec runtime.Spec
	ep   network.Endpoint
	net  *network.Manager
}

// newSandbox makes a rootfs, a bundle dir and a prepared network namespace
// for id in slot index, and removes the container and the namespace when
// the test ends, whatever happened.
func (e *env) newSandbox(tb testing.TB, id string, index int) *sandbox {
	tb.Helper()
	ctx := context.Background()
	dir := tb.TempDir() // removed after the cleanups below: they run first
	ep, err := e.net.Endpoint(id, index)
	if err != nil {
		tb.Fatal(err)
	}
	// A crashed earlier run may have left the namespace.
	if err := e.net.Delete(ctx, ep); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := e.rt.Delete(ctx, id); err != nil {
			tb.Errorf("cleaning up: %v", err)
		}
		if err := e.net.Delete(ctx, ep); err != nil {
			tb.Errorf("cleaning up: %v", err)
		}
	})
	if err := e.net.Create(ctx, ep); err != nil {
		tb.Fatal(err)
	}
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{"proc", "dev", "sys", "tmp", ".loam"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	return &sandbox{
		spec: runtime.Spec{
			ID:          id,
			BundleDir:   filepath.Join(dir, "bundle"),
			Rootfs:      rootfs,
			Netns:       ep.Netns,
			Hostname:    strings.TrimPrefix(id, "sb-"),
			AgentBinary: agentPath,
			Env:         []string{"LOAM_TEST=1"},
		},
		ep:  ep,
		net: e.net,
	}
}

// prepare re-addresses the namespace, as before every restore.
func (sb *sandbox) prepare(tb testing.TB) {
	tb.Helper()
	if err := sb.net.Prepare(context.Background(), sb.ep); err != nil {
		tb.Fatal(err)
	}
}

// counterReply is what the counter answers.
type counterReply struct {
	N        int
	PID      int
	UID      int
	Hostname string
	Env      []string
	Args     []string
}

// ask connects to the counter in the sandbox, retrying while it comes up,
// and returns its answer.
func (sb *sandbox) ask(tb testing.TB) counterReply {
	tb.Helper()
	r, err := sb.tryAsk(10 * time.Second)
	if err != nil {
		tb.Fatalf("asking the counter in %s: %v", sb.spec.ID, err)
	}
	return r
}

func (sb *sandbox) tryAsk(timeout time.Duration) (counterReply, error) {
	addr := netip.AddrPortFrom(sb.ep.SandboxIP, counterPort).String()
	deadline := time.Now().Add(timeout)
	for {
		r, err := askOnce(addr)
		if err == nil || time.Now().After(deadline) {
			return r, err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func askOnce(addr string) (counterReply, error) {
	var r counterReply
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return r, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(line, &r)
}

// waitLog waits until init.log holds want.
func (sb *sandbox) waitLog(tb testing.TB, want string) {
	tb.Helper()
	path := filepath.Join(sb.spec.BundleDir, initLogFile)
	var b []byte
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, _ = os.ReadFile(path)
		if strings.Contains(string(b), want) {
			return
		}
	}
	tb.Errorf("init.log = %q, want it to hold %q", b, want)
}

func (e *env) wantState(tb testing.TB, id string, want runtime.Status) {
	tb.Helper()
	got, err := e.rt.State(context.Background(), id)
	if err != nil || got != want {
		tb.Errorf("State(%s) = %q, %v; want %q", id, got, err, want)
	}
}

// checkNoChildren checks that no runsc process is left as our child (a
// zombie, or a sandbox still tied to us).
func checkNoChildren(tb testing.TB) {
	tb.Helper()
	tasks, _ := filepath.Glob("/proc/self/task/*/children")
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if s := strings.TrimSpace(string(b)); s != "" {
			tb.Errorf("child processes left: %s", s)
		}
	}
}

// requireRunsc returns the runsc binary to test with: $LOAM_RUNSC, the
// pinned build, or runsc on PATH. Without it or without root the test is
// skipped, or fails under CI.
func requireRunsc(tb testing.TB) string {
	tb.Helper()
	return testenv.Runsc(tb, defaultRunsc)
}

var (
	agentOnce sync.Once
	agentDir  string
	agentPath string
	agentErr  error
)

// buildAgent builds testdata/counter statically, once per test binary; it
// stands in for loam's agent as init.
func buildAgent(tb testing.TB) string {
	tb.Helper()
	agentOnce.Do(func() {
		agentDir, agentErr = os.MkdirTemp("", "loam-gvisor-test-")
		if agentErr != nil {
			return
		}
		agentPath = filepath.Join(agentDir, "counter")
		cmd := exec.Command("go", "build", "-o", agentPath, "./testdata/counter")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentErr = fmt.Errorf("building testdata/counter: %w: %s", err, out)
		}
	})
	if agentErr != nil {
		tb.Fatal(agentErr)
	}
	return agentPath
}

func TestDebugLogs(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rt, err := New(Config{Runsc: e.runsc, Root: e.root, Debug: true})
	if err != nil {
		t.Fatal(err)
	}
	e.rt = rt
	sb := e.newSandbox(t, "sb-gvtestdebug0", 8)
	if err := rt.Start(ctx, sb.spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	sb.ask(t)
	if err := rt.Delete(ctx, sb.spec.ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	for _, dir := range []string{filepath.Join(sb.spec.BundleDir, debugDir), filepath.Join(e.root, debugDir, sb.spec.ID)} {
		logs, _ := filepath.Glob(filepath.Join(dir, "runsc.log.*"))
		if len(logs) == 0 {
			t.Errorf("no debug logs in %s", dir)
		}
	}
}

// TestFastPathFlag: DisableFastPath reaches every runsc command as
// --systrap-disable-fast-path, and only on systrap, whose fast path it is.
// (Every end-to-end test's daemon runs with it, so runsc taking it is
// tested there.)
func TestFastPathFlag(t *testing.T) {
	for _, off := range []bool{false, true} {
		rt, err := New(Config{Runsc: "/bin/true", Root: t.TempDir(), DisableFastPath: off})
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(rt.global, "--systrap-disable-fast-path"); got != off {
			t.Errorf("DisableFastPath %v: runsc's flags %v", off, rt.global)
		}
	}
	if _, err := New(Config{Runsc: "/bin/true", Root: t.TempDir(), Platform: "ptrace", DisableFastPath: true}); err == nil {
		t.Error("DisableFastPath on ptrace: no error")
	}
}
