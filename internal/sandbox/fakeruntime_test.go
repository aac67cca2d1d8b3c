package sandbox_test

// The fake runtime, for fast tests of the Manager's state machine without
// root or runsc (the real runtime is tested for real in test/).
//
// The agent is not served in the test process itself: its reaper collects
// every child with wait4(-1), and the copy pool runs cp through os/exec,
// whose Wait would then find its child already reaped. Each fake container
// is the test binary run again as the agent (see TestMain), which is also
// closer to the truth: an agent that is paused stops answering, and one
// that is deleted is gone.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
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

// agentModeEnv, set in a child's environment, makes the test binary run as
// a fake container's init: the agent.
const agentModeEnv = "SANDBOXTEST_RUN_AGENT"

func TestMain(m *testing.M) {
	if os.Getenv(agentModeEnv) != "" {
		os.Exit(agentMain())
	}
	os.Exit(m.Run())
}

// agentMain runs the real agent, configured from the environment as in a
// sandbox, until the test process goes away (its stdin, a pipe from the
// test process, ends) or it is killed.
func agentMain() int {
	os.Unsetenv(agentModeEnv)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	if err := agent.Run(ctx, agent.ConfigFromEnv()); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		return 1
	}
	return 0
}

// fakeRuntime is a runtime.Runtime whose containers are agents in child
// processes, listening on the loopback address their fake network
// namespace names (see fakeNetworks). Pause and Resume stop and continue
// the process; a memory image is a small file that names the sandbox it was
// taken from and the token its agent held, and Restore starts a new agent
// with that token, as a restored sandbox wakes up holding it.
type fakeRuntime struct {
	exe string

	mu         sync.Mutex
	containers map[string]*container
	calls      []string         // "op id" for every call but State, in order
	failures   map[string]error // op -> error for its next call
	hook       func(op, id string)
	after      func(op, id string) // runs when a checkpoint has done its work
	noAgent    bool                // containers start no agent: it never answers
	// tokens lists the tokens the daemon may have handed container id's
	// agent since it started (it derives them; see sandbox.AgentToken), for
	// finding out which one the agent holds when its memory is "written".
	tokens func(id string) []string
}

// container is one fake container.
type container struct {
	spec   runtime.Spec
	status runtime.Status
	addr   string // where its agent listens
	token  string // the token its agent was started with
	held   string // the token its agent held when it was paused
	from   string // the sandbox whose memory image it was restored from
	cmd    *exec.Cmd
	stdin  *os.File
	exited chan struct{}

	limits *runtime.Limits // given by the last SetLimits, if any
}

// fakeImage is the content of a fake memory image.
type fakeImage struct {
	Sandbox string `json:"sandbox"`
	Token   string `json:"token"`
}

const imageFile = "image.json"

var _ runtime.Runtime = (*fakeRuntime)(nil)

func newFakeRuntime(t testing.TB) *fakeRuntime {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r := &fakeRuntime{exe: exe, containers: map[string]*container{}, failures: map[string]error{}}
	t.Cleanup(r.killAll)
	return r
}

// enter records a call, runs the hook and returns the failure injected for op.
func (r *fakeRuntime) enter(op, id string) error {
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

// failNext makes the next call of op fail with err.
func (r *fakeRuntime) failNext(op string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures[op] = err
}

// setHook makes every call run fn(op, id) first; fn may block.
func (r *fakeRuntime) setHook(fn func(op, id string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hook = fn
}

func (r *fakeRuntime) setNoAgent(v bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.noAgent = v
}

// callsOf lists the operations called on id, in order.
func (r *fakeRuntime) callsOf(id string) []string {
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

// get returns a copy of container id's state, or false.
func (r *fakeRuntime) get(id string) (container, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[id]
	if !ok {
		return container{}, false
	}
	return *c, true
}

// ids lists the containers.
func (r *fakeRuntime) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	for id := range r.containers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// vanish makes container id disappear as in a reboot of the host.
func (r *fakeRuntime) vanish(id string) {
	r.mu.Lock()
	c := r.containers[id]
	delete(r.containers, id)
	r.mu.Unlock()
	if c != nil {
		c.kill()
	}
}

func (r *fakeRuntime) killAll() {
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
func (r *fakeRuntime) spawn(spec runtime.Spec, token string) (*container, error) {
	if fi, err := os.Stat(spec.Rootfs); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("fake runtime: rootfs %s: not a directory (%v)", spec.Rootfs, err)
	}
	if fi, err := os.Stat(spec.BundleDir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("fake runtime: bundle %s: not a directory (%v)", spec.BundleDir, err)
	}
	ip := strings.TrimPrefix(spec.Netns, fakeNetnsDir+"/")
	if _, err := netip.ParseAddr(ip); err != nil {
		return nil, fmt.Errorf("fake runtime: netns %q is not one of fakeNetworks'", spec.Netns)
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
func (r *fakeRuntime) add(c *container) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.containers[c.spec.ID]; ok {
		return fmt.Errorf("fake runtime: %s: %w", c.spec.ID, runtime.ErrExist)
	}
	r.containers[c.spec.ID] = c
	return nil
}

func (r *fakeRuntime) lookup(id string) (*container, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.containers[id]
	if !ok {
		return nil, fmt.Errorf("fake runtime: %s: %w", id, runtime.ErrNotExist)
	}
	return c, nil
}

func (r *fakeRuntime) Start(ctx context.Context, spec runtime.Spec) error {
	if err := r.enter("start", spec.ID); err != nil {
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

func (r *fakeRuntime) State(ctx context.Context, id string) (runtime.Status, error) {
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

func (r *fakeRuntime) Delete(ctx context.Context, id string) error {
	if err := r.enter("delete", id); err != nil {
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

func (r *fakeRuntime) Pause(ctx context.Context, id string) error {
	if err := r.enter("pause", id); err != nil {
		return err
	}
	c, err := r.lookup(id)
	if err != nil {
		return err
	}
	if st, _ := r.State(ctx, id); st != runtime.StatusRunning {
		return fmt.Errorf("fake runtime: pausing %s: it is %s", id, st)
	}
	held := c.heldToken(ctx, r.candidates(id))
	if c.cmd != nil {
		if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c.status, c.held = runtime.StatusPaused, held
	return nil
}

func (r *fakeRuntime) Resume(ctx context.Context, id string) error {
	if err := r.enter("resume", id); err != nil {
		return err
	}
	c, err := r.lookup(id)
	if err != nil {
		return err
	}
	if st, _ := r.State(ctx, id); st != runtime.StatusPaused {
		return fmt.Errorf("fake runtime: resuming %s: it is %s", id, st)
	}
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

// candidates are the derived tokens container id's agent may hold.
func (r *fakeRuntime) candidates(id string) []string {
	if r.tokens == nil {
		return nil
	}
	return r.tokens(id)
}

// heldToken finds which token the agent holds now: the one it was started
// with, or the sandbox's own that the daemon has given it since.
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

func (r *fakeRuntime) Checkpoint(ctx context.Context, id, imageDir string, opts runtime.CheckpointOptions) error {
	if err := r.enter("checkpoint", id); err != nil {
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
	if err := os.Mkdir(imageDir, 0o700); err != nil {
		return fmt.Errorf("fake runtime: checkpointing %s: %w", id, err)
	}
	b, _ := json.Marshal(fakeImage{Sandbox: id, Token: held})
	if err := os.WriteFile(filepath.Join(imageDir, imageFile), b, 0o600); err != nil {
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
	r.mu.Lock()
	after := r.after
	r.mu.Unlock()
	if after != nil {
		after("checkpoint", id)
	}
	return nil
}

// setAfter makes fn run at the end of every checkpoint that succeeded.
func (r *fakeRuntime) setAfter(fn func(op, id string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.after = fn
}

func (r *fakeRuntime) Restore(ctx context.Context, spec runtime.Spec, imageDir string) error {
	if err := r.enter("restore", spec.ID); err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(imageDir, imageFile))
	if err != nil {
		return fmt.Errorf("fake runtime: restoring %s: %w", spec.ID, err)
	}
	var img fakeImage
	if err := json.Unmarshal(b, &img); err != nil {
		return err
	}
	if _, err := r.lookup(spec.ID); err == nil {
		return fmt.Errorf("fake runtime: %s: %w", spec.ID, runtime.ErrExist)
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

// SetLimits records the call ("setlimits id") and keeps l on the container.
func (r *fakeRuntime) SetLimits(ctx context.Context, id string, l runtime.Limits) error {
	if err := r.enter("setlimits", id); err != nil {
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
