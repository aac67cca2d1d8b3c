// Package fake is a runtime.Runtime without root or runsc, for fast tests of
// the code above the runtime (the sandbox Manager's state machine). It is
// held to what runsc does by the suite in package runtimetest, which runs
// against both; the real runtime is tested for real in runtime/gvisor and
// test/.
//
// A fake container is the test binary run again as loam's real agent (the
// test binary's TestMain calls RunAgentIfChild), listening on the loopback
// address its fake network namespace names: Netns(addr). Pause and Resume
// stop and continue that process. A memory image is a small file that
// names the container it was taken from and the token its agent held, and
// Restore starts a new agent with that token, as a restored sandbox wakes
// up holding it.
package fake

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/runtime"
)

// NetnsDir prefixes the fake network namespaces: what follows it in a
// Spec's Netns is the loopback address that stands for the namespace's
// eth0 (Linux routes all of 127/8 to lo, so each container's agent has an
// address of its own).
const NetnsDir = "/fake/netns"

// Netns is the fake namespace whose eth0 is addr.
func Netns(addr netip.Addr) string { return NetnsDir + "/" + addr.String() }

// ImageFile is the file of a fake memory image in its directory.
const ImageFile = "image.json"

// Image is the content of a fake memory image.
type Image struct {
	// Sandbox is the container the image was taken from.
	Sandbox string `json:"sandbox"`
	// Token is the token its agent held.
	Token string `json:"token"`
	// MemoryMiB is the memory limit of the spec the container was started
	// (or restored) with. runsc refuses to restore an image into a spec
	// whose rlimits differ from the image's, and RLIMIT_NPROC follows the
	// memory limit (gvisor's processes): the fake refuses any other limit.
	MemoryMiB int `json:"memory_mib"`
}

// Operations, as CallsOf, SetHook and FailNext name them.
const (
	OpStart          = "start"
	OpDelete         = "delete"
	OpPause          = "pause"
	OpResume         = "resume"
	OpCheckpoint     = "checkpoint"
	OpCheckpointHeld = "checkpointheld"
	OpRestore        = "restore"
	OpSetLimits      = "setlimits"
)

// Runtime is the fake runtime. Its methods are safe for concurrent use.
type Runtime struct {
	exe string

	// Tokens, if set, lists the tokens a caller may have handed container
	// id's agent since it started (the daemon derives them: see
	// sandbox.AgentToken), for finding out which one the agent holds when
	// its memory is "written". Set it before the first call.
	Tokens func(id string) []string

	mu         sync.Mutex
	containers map[string]*container
	calls      []string         // "op id" for every call but State, in order
	failures   map[string]error // op -> error for its next call
	hook       func(op, id string)
	after      func(op, id string) // runs when a checkpoint has done its work
	noAgent    bool                // containers start no agent: it never answers
}

// container is one fake container; its fields but cmd, stdin and exited
// are guarded by the Runtime's mu.
type container struct {
	spec   runtime.Spec
	status runtime.Status
	addr   string // where its agent listens
	token  string // the token its agent was started with
	held   string // the token its agent held when it was paused
	from   string // the container whose memory image it was restored from
	cmd    *exec.Cmd
	stdin  *os.File
	exited chan struct{}

	limits *runtime.Limits // given by the last SetLimits, if any
}

// Container is what a test may see of a fake container: a copy of its
// state when Get was called, and its process.
type Container struct {
	// Spec is the spec it was started or restored with.
	Spec runtime.Spec
	// Status is its status as the fake keeps it (State tells a dead agent
	// as stopped too).
	Status runtime.Status
	// From is the container whose memory image it was restored from, ""
	// when it was started.
	From string
	// Limits are the limits of the last SetLimits, nil before one.
	Limits *runtime.Limits

	c *container
}

// Kill kills the container's agent, as when a sandbox's init dies, and
// waits for it to exit. The container stays, stopped.
func (c Container) Kill() { c.c.kill() }

// Exited is closed once the container's agent has exited; never, for a
// container started without one (SetNoAgent).
func (c Container) Exited() <-chan struct{} { return c.c.exited }

var (
	_ runtime.Runtime          = (*Runtime)(nil)
	_ runtime.HeldCheckpointer = (*HeldRuntime)(nil)
)

// New returns a fake runtime whose containers are all killed when t ends.
func New(t testing.TB) *Runtime {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r := &Runtime{exe: exe, containers: map[string]*container{}, failures: map[string]error{}}
	t.Cleanup(r.killAll)
	return r
}

// enter records a call, runs the hook and returns the failure injected for op.
func (r *Runtime) enter(op, id string) error {
	r.mu.Lock()
	r.calls = append(r.calls, op+" "+id)
	hook := r.hook
	r.mu.Unlock()
	if hook != nil {
		hook(op, id)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.failures[op]
	delete(r.failures, op)
	return err
}

// FailNext makes the next call of op fail with err, before it does anything.
func (r *Runtime) FailNext(op string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures[op] = err
}

// SetHook makes every call but State run fn(op, id) first; fn may block.
func (r *Runtime) SetHook(fn func(op, id string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hook = fn
}

// SetAfter makes fn run at the end of every checkpoint that succeeded.
func (r *Runtime) SetAfter(fn func(op, id string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.after = fn
}

// SetNoAgent makes the containers started from now on run no agent (v
// true): they never answer, as a sandbox whose agent hangs.
func (r *Runtime) SetNoAgent(v bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.noAgent = v
}

// CallsOf lists the operations called on id, in order.
func (r *Runtime) CallsOf(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ops []string
	for _, c := range r.calls {
		if op, cid, _ := strings.Cut(c, " "); cid == id {
			ops = append(ops, op)
		}
	}
	return ops
}

// Get returns container id's state, or false.
func (r *Runtime) Get(id string) (Container, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[id]
	if !ok {
		return Container{}, false
	}
	return Container{Spec: c.spec, Status: c.status, From: c.from, Limits: c.limits, c: c}, true
}

// IDs lists the containers, sorted.
func (r *Runtime) IDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, 0, len(r.containers))
	for id := range r.containers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Pid is the host pid of container id's agent, as runsc tells its sandbox
// process's. It is not named SandboxPid, so that a caller that looks for
// that ability by a type check finds it only in a wrapper that forwards.
func (r *Runtime) Pid(id string) (int, error) {
	c, err := r.lookup(id)
	if err != nil {
		return 0, err
	}
	if c.cmd == nil {
		return 0, fmt.Errorf("fake runtime: %s runs no agent", id)
	}
	return c.cmd.Process.Pid, nil
}

// Vanish makes container id disappear as in a reboot of the host.
func (r *Runtime) Vanish(id string) {
	r.mu.Lock()
	c := r.containers[id]
	delete(r.containers, id)
	r.mu.Unlock()
	if c != nil {
		c.kill()
	}
}

func (r *Runtime) killAll() {
	r.mu.Lock()
	cs := r.containers
	r.containers = map[string]*container{}
	r.mu.Unlock()
	for _, c := range cs {
		c.kill()
	}
}

func (c *container) kill() {
	if c.cmd == nil {
		return
	}
	_ = c.cmd.Process.Kill()
	<-c.exited
	c.stdin.Close()
}

func (c *container) dead() bool {
	if c.cmd == nil {
		return false
	}
	select {
	case <-c.exited:
		return true
	default:
		return false
	}
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// spawn starts a container's agent with token, on the address of the
// spec's namespace and the port of its LOAM_AGENT_LISTEN.
func (r *Runtime) spawn(spec runtime.Spec, token string) (*container, error) {
	if fi, err := os.Stat(spec.Rootfs); err != nil {
		return nil, fmt.Errorf("fake runtime: checking rootfs: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("fake runtime: rootfs %s is not a directory", spec.Rootfs)
	}
	if !filepath.IsAbs(spec.BundleDir) {
		return nil, fmt.Errorf("fake runtime: bundle dir %q is not an absolute path", spec.BundleDir)
	}
	ip, ok := strings.CutPrefix(spec.Netns, NetnsDir+"/")
	if _, err := netip.ParseAddr(ip); !ok || err != nil {
		return nil, fmt.Errorf("fake runtime: netns %q is not a fake one (see Netns)", spec.Netns)
	}
	_, port, err := net.SplitHostPort(envValue(spec.Env, agent.EnvListen))
	if err != nil {
		return nil, fmt.Errorf("fake runtime: %s: %w", agent.EnvListen, err)
	}
	c := &container{
		spec: spec, status: runtime.StatusRunning, token: token,
		addr: net.JoinHostPort(ip, port), exited: make(chan struct{}),
	}
	r.mu.Lock()
	noAgent := r.noAgent
	r.mu.Unlock()
	if noAgent {
		return c, nil
	}
	var env []string
	for _, kv := range spec.Env {
		if !strings.HasPrefix(kv, "LOAM_AGENT_") {
			env = append(env, kv)
		}
	}
	env = append(env, agentModeEnv+"=1", agent.EnvToken+"="+token, agent.EnvListen+"="+c.addr)
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer pr.Close()
	cmd := exec.Command(r.exe)
	cmd.Env = env
	cmd.Dir = spec.Rootfs
	cmd.Stdin = pr
	if os.Getenv("LOAM_TEST_LOG") != "" {
		cmd.Stderr = os.Stderr
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		pw.Close()
		return nil, fmt.Errorf("fake runtime: starting agent: %w", err)
	}
	c.cmd, c.stdin = cmd, pw
	go func() {
		_ = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

// add registers c unless its id is taken.
func (r *Runtime) add(c *container) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.containers[c.spec.ID]; ok {
		return fmt.Errorf("fake runtime: %s: %w", c.spec.ID, runtime.ErrExist)
	}
	r.containers[c.spec.ID] = c
	return nil
}

func (r *Runtime) lookup(id string) (*container, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[id]
	if !ok {
		return nil, fmt.Errorf("fake runtime: %s: %w", id, runtime.ErrNotExist)
	}
	return c, nil
}

// Start implements runtime.Runtime.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) error {
	if err := r.enter(OpStart, spec.ID); err != nil {
		return err
	}
	if _, err := r.lookup(spec.ID); err == nil {
		return fmt.Errorf("fake runtime: %s: %w", spec.ID, runtime.ErrExist)
	}
	c, err := r.spawn(spec, envValue(spec.Env, agent.EnvToken))
	if err != nil {
		return err
	}
	if err := r.add(c); err != nil {
		c.kill()
		return err
	}
	return nil
}

// State implements runtime.Runtime.
func (r *Runtime) State(ctx context.Context, id string) (runtime.Status, error) {
	c, err := r.lookup(id)
	if err != nil {
		return "", err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.dead() {
		return runtime.StatusStopped, nil
	}
	return c.status, nil
}

// Delete implements runtime.Runtime.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if err := r.enter(OpDelete, id); err != nil {
		return err
	}
	r.mu.Lock()
	c := r.containers[id]
	delete(r.containers, id)
	r.mu.Unlock()
	if c != nil {
		c.kill()
	}
	return nil
}

// Pause implements runtime.Runtime.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	if err := r.enter(OpPause, id); err != nil {
		return err
	}
	c, err := r.lookup(id)
	if err != nil {
		return err
	}
	if st, _ := r.State(ctx, id); st != runtime.StatusRunning {
		return fmt.Errorf("fake runtime: pausing %s: it is %s", id, st)
	}
	return r.stop(ctx, c)
}

// stop pauses c, a running container, noting the token its agent holds.
func (r *Runtime) stop(ctx context.Context, c *container) error {
	held := c.heldToken(ctx, r.candidates(c.spec.ID))
	if c.cmd != nil {
		if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			return err
		}
		// The signal is sent, not yet taken: runsc's pause returns once
		// the sandbox is frozen, and so must this.
		if err := waitStopped(ctx, c.cmd.Process.Pid); err != nil {
			return fmt.Errorf("fake runtime: pausing %s: %w", c.spec.ID, err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c.status, c.held = runtime.StatusPaused, held
	return nil
}

// waitStopped waits until every thread of process pid is stopped by a
// signal (or the process is gone). Nothing tells a parent that but polling
// /proc: wait4's WUNTRACED would race the reaper goroutine's Wait.
func waitStopped(ctx context.Context, pid int) error {
	for {
		stopped := true
		stats, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		for _, f := range stats {
			b, err := os.ReadFile(f)
			if err != nil {
				continue // the thread exited
			}
			// pid (comm) S ...: the state follows the last ')'.
			if i := bytes.LastIndexByte(b, ')'); i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 'Z' && b[i+2] != 'X') {
				stopped = false
				break
			}
		}
		if stopped {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for process %d to stop: %w", pid, context.Cause(ctx))
		case <-time.After(time.Millisecond):
		}
	}
}

// cont resumes c, a paused container.
func (r *Runtime) cont(c *container) error {
	if c.cmd != nil {
		if err := c.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c.status = runtime.StatusRunning
	return nil
}

// Resume implements runtime.Runtime.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	if err := r.enter(OpResume, id); err != nil {
		return err
	}
	c, err := r.lookup(id)
	if err != nil {
		return err
	}
	if st, _ := r.State(ctx, id); st != runtime.StatusPaused {
		return fmt.Errorf("fake runtime: resuming %s: it is %s", id, st)
	}
	return r.cont(c)
}

// candidates are the tokens container id's agent may hold.
func (r *Runtime) candidates(id string) []string {
	if r.Tokens == nil {
		return nil
	}
	return r.Tokens(id)
}

// heldToken finds which token the agent holds now: the one it was started
// with, or one the caller has given it since.
func (c *container) heldToken(ctx context.Context, more []string) string {
	for _, tok := range append([]string{envValue(c.spec.Env, agent.EnvToken), c.token}, more...) {
		cl := &agent.Client{
			BaseURL: "http://" + c.addr, Token: tok,
			HTTP: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
		}
		hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := cl.Health(hctx)
		cancel()
		if err == nil {
			return tok
		}
	}
	return ""
}

// writeImage writes c's memory image into imageDir, which must not exist.
func writeImage(c *container, imageDir, held string) error {
	id := c.spec.ID
	if err := os.Mkdir(imageDir, 0o700); err != nil {
		return fmt.Errorf("fake runtime: checkpointing %s: %w", id, err)
	}
	b, _ := json.Marshal(Image{Sandbox: id, Token: held, MemoryMiB: c.spec.MemoryMiB})
	if err := os.WriteFile(filepath.Join(imageDir, ImageFile), b, 0o600); err != nil {
		_ = os.RemoveAll(imageDir)
		return fmt.Errorf("fake runtime: checkpointing %s: %w", id, err)
	}
	return nil
}

// Checkpoint implements runtime.Runtime.
func (r *Runtime) Checkpoint(ctx context.Context, id, imageDir string, opts runtime.CheckpointOptions) error {
	if err := r.enter(OpCheckpoint, id); err != nil {
		return err
	}
	c, err := r.lookup(id)
	if err != nil {
		return err
	}
	st, _ := r.State(ctx, id)
	var held string
	switch st {
	case runtime.StatusPaused:
		r.mu.Lock()
		held = c.held
		r.mu.Unlock()
	case runtime.StatusRunning:
		held = c.heldToken(ctx, r.candidates(id))
	default:
		return fmt.Errorf("fake runtime: checkpointing %s: it is %s", id, st)
	}
	if err := writeImage(c, imageDir, held); err != nil {
		return err
	}
	if !opts.LeaveRunning {
		c.kill()
		r.mu.Lock()
		c.status = runtime.StatusStopped
		r.mu.Unlock()
	}
	if opts.Flushed != nil {
		if err := opts.Flushed(); err != nil {
			return err
		}
	}
	r.ran(OpCheckpoint, id)
	return nil
}

// ran calls the function of SetAfter.
func (r *Runtime) ran(op, id string) {
	r.mu.Lock()
	after := r.after
	r.mu.Unlock()
	if after != nil {
		after(op, id)
	}
}

// Restore implements runtime.Runtime.
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec, imageDir string) error {
	if err := r.enter(OpRestore, spec.ID); err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(imageDir, ImageFile))
	if err != nil {
		return fmt.Errorf("fake runtime: restoring %s: %w", spec.ID, err)
	}
	var img Image
	if err := json.Unmarshal(b, &img); err != nil {
		return fmt.Errorf("fake runtime: restoring %s: %w", spec.ID, err)
	}
	if _, err := r.lookup(spec.ID); err == nil {
		return fmt.Errorf("fake runtime: %s: %w", spec.ID, runtime.ErrExist)
	}
	if spec.MemoryMiB != img.MemoryMiB {
		return fmt.Errorf("fake runtime: restoring %s: memory limit %d MiB, the image's is %d MiB: rlimits do not match across checkpoint restore",
			spec.ID, spec.MemoryMiB, img.MemoryMiB)
	}
	c, err := r.spawn(spec, img.Token)
	if err != nil {
		return err
	}
	c.from = img.Sandbox
	if err := r.add(c); err != nil {
		c.kill()
		return err
	}
	return nil
}

// SetLimits implements runtime.Runtime: it keeps l on the container.
func (r *Runtime) SetLimits(ctx context.Context, id string, l runtime.Limits) error {
	if err := r.enter(OpSetLimits, id); err != nil {
		return err
	}
	c, err := r.lookup(id)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c.limits = &l
	return nil
}

// HeldRuntime is the fake runtime with runtime.HeldCheckpointer, as
// runsc's driver has it. It is a type of its own so that a test chooses
// which way a caller that looks for the ability by a type check goes.
type HeldRuntime struct{ *Runtime }

// Held returns r with runtime.HeldCheckpointer.
func (r *Runtime) Held() HeldRuntime { return HeldRuntime{r} }

// CheckpointHeld implements runtime.HeldCheckpointer: it pauses the
// container, writes its image, calls whilePaused and resumes it.
func (r HeldRuntime) CheckpointHeld(ctx context.Context, id, imageDir string, whilePaused func() error) (err error) {
	if err := r.enter(OpCheckpointHeld, id); err != nil {
		return err
	}
	if _, err := os.Lstat(imageDir); err == nil {
		return fmt.Errorf("fake runtime: checkpointing %s: image directory %s: %w", id, imageDir, fs.ErrExist)
	}
	c, err := r.lookup(id)
	if err != nil {
		return err
	}
	if st, _ := r.State(ctx, id); st != runtime.StatusRunning {
		return fmt.Errorf("fake runtime: checkpointing %s: it is %s", id, st)
	}
	if err := r.stop(ctx, c); err != nil {
		return fmt.Errorf("fake runtime: checkpointing %s: %w", id, err)
	}
	r.mu.Lock()
	held := c.held
	r.mu.Unlock()
	err = writeImage(c, imageDir, held)
	if err == nil {
		err = whilePaused()
		if err != nil {
			_ = os.RemoveAll(imageDir)
		}
	}
	if cerr := r.cont(c); cerr != nil {
		err = errors.Join(err, fmt.Errorf("fake runtime: resuming %s: %w", id, cerr))
	}
	if err == nil {
		r.ran(OpCheckpointHeld, id)
	}
	return err
}
