// Package runtimetest is the suite every runtime.Runtime implementation
// must pass, so that the fake runtime the sandbox Manager's fast tests use
// cannot drift from what runsc does:
//
//	func TestConformance(t *testing.T) {
//		runtimetest.Run(t, func(t *testing.T) runtimetest.Env { … })
//	}
//
// Each container runs loam's real agent as init. The suite observes a
// container from outside as the daemon does: its State, and whether its
// agent answers, with which token. A token the suite hands the agent after
// it started (agent.Client.RotateToken) lives only in the agent's memory,
// so it shows what a memory image carries: a restored agent holds it
// although its spec still names the token it was started with.
package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/runtime"
)

// Env is one implementation under test, new for each test of the suite.
type Env struct {
	// Runtime is the runtime under test. It starts with no container.
	Runtime runtime.Runtime
	// NewSandbox returns what a container named id needs to start or be
	// restored: a spec with ID, BundleDir, Rootfs, Netns, Hostname and
	// AgentBinary set (the suite sets Env and may set limits), and the
	// address its agent is reached at. It removes the container and all
	// it made when t ends, whatever happened.
	NewSandbox func(t *testing.T, id string) Sandbox
}

// Sandbox is one container's spec and where its agent answers.
type Sandbox struct {
	Spec runtime.Spec
	// Addr is the address of the sandbox's eth0, reachable from the test;
	// the agent listens on every address of the sandbox at Port.
	Addr netip.Addr
	// Prepare, if not nil, readies the sandbox's network namespace again
	// before a restore into it (network.Manager.Prepare).
	Prepare func(t *testing.T)
}

// Port is the TCP port the suite's agents listen on.
const Port = agent.DefaultPort

// Token is the gen-th token the suite gives container id's agent: it
// starts with gen 0, and RotateToken hands it later ones.
func Token(id string, gen int) string { return "runtimetest-" + id + "-" + strconv.Itoa(gen) }

// Tokens lists every token the suite may give container id's agent, for a
// fake runtime that cannot read its agent's memory and must ask the agent
// which one it holds (fake.Runtime.Tokens).
func Tokens(id string) []string {
	toks := make([]string, maxGen)
	for gen := range maxGen {
		toks[gen] = Token(id, gen)
	}
	return toks
}

const maxGen = 4

// Timeouts of the suite's waits: generous for a loaded machine, as none of
// them bounds a measurement.
const (
	readyTimeout  = 30 * time.Second
	silentAttempt = 700 * time.Millisecond
	stopTimeout   = 15 * time.Second
)

// Run runs the suite, each test as a subtest with its own Env from newEnv.
func Run(t *testing.T, newEnv func(t *testing.T) Env) {
	tests := []struct {
		name string
		fn   func(t *testing.T, e *env)
	}{
		{"StartStateDelete", testStartStateDelete},
		{"UnknownID", testUnknownID},
		{"StartFailure", testStartFailure},
		{"PauseResume", testPauseResume},
		{"SetLimits", testSetLimits},
		{"CheckpointLeaveRunning", testCheckpointLeaveRunning},
		{"CheckpointWhilePaused", testCheckpointWhilePaused},
		{"CheckpointStops", testCheckpointStops},
		{"Fork", testFork},
		{"RestoreFailure", testRestoreFailure},
		{"RestoreOtherMemory", testRestoreOtherMemory},
		{"CheckpointHeld", testCheckpointHeld},
		{"CheckpointHeldFailure", testCheckpointHeldFailure},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &env{Env: newEnv(t), t: t, ctx: t.Context()}
			tt.fn(t, e)
		})
	}
}

// env is one test's Env with the suite's helpers.
type env struct {
	Env
	t   *testing.T
	ctx context.Context
}

// box is a container under test: its sandbox and the token its agent is
// believed to hold.
type box struct {
	Sandbox
	e *env
	// tokens names the container whose tokens the agent holds: its own,
	// or the one whose memory it was restored from.
	tokens string
	gen    int // of the token the agent holds
}

// sandbox makes a new sandbox for id whose agent starts with token 0.
func (e *env) sandbox(id string) *box {
	e.t.Helper()
	sb := e.NewSandbox(e.t, id)
	sb.Spec.Env = append(sb.Spec.Env,
		agent.EnvToken+"="+Token(id, 0),
		agent.EnvListen+"=:"+strconv.Itoa(Port),
		"LOAM_RUNTIMETEST=1")
	return &box{Sandbox: sb, e: e, tokens: id}
}

// started is a sandbox for id, started, its agent answering.
func (e *env) started(id string) *box {
	e.t.Helper()
	b := e.sandbox(id)
	if err := e.Runtime.Start(e.ctx, b.Spec); err != nil {
		e.t.Fatalf("Start(%s): %v", id, err)
	}
	b.wantAnswer(0)
	return b
}

func (b *box) id() string { return b.Spec.ID }

func (b *box) client(gen int) *agent.Client {
	return &agent.Client{
		BaseURL: "http://" + net.JoinHostPort(b.Addr.String(), strconv.Itoa(Port)),
		Token:   Token(b.tokens, gen),
		HTTP:    &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}},
	}
}

// wantAnswer waits until the agent answers to token gen. An agent that
// refuses the token fails the test at once: no wait changes that.
func (b *box) wantAnswer(gen int) {
	b.e.t.Helper()
	ctx, cancel := context.WithTimeout(b.e.ctx, readyTimeout)
	defer cancel()
	if _, err := b.client(gen).WaitReady(ctx); err != nil {
		b.e.t.Fatalf("%s's agent with token %d: %v", b.id(), gen, err)
	}
}

// wantRefused checks that the agent answers, and refuses token gen.
func (b *box) wantRefused(gen int) {
	b.e.t.Helper()
	ctx, cancel := context.WithTimeout(b.e.ctx, readyTimeout)
	defer cancel()
	if _, err := b.client(gen).WaitReady(ctx); !agent.IsUnauthorized(err) {
		b.e.t.Errorf("%s's agent with token %d: %v, want it refused", b.id(), gen, err)
	}
}

// wantSilent checks that the agent does not answer: it is paused, stopped
// or gone.
func (b *box) wantSilent() {
	b.e.t.Helper()
	if err := b.silent(); err != nil {
		b.e.t.Error(err)
	}
}

func (b *box) silent() error {
	ctx, cancel := context.WithTimeout(b.e.ctx, silentAttempt)
	defer cancel()
	if h, err := b.client(b.gen).Health(ctx); err == nil || agent.IsUnauthorized(err) {
		return fmt.Errorf("%s's agent answers (%+v, %v), want it silent", b.id(), h, err)
	}
	return nil
}

// forkOf notes that b's agent was restored from a's memory: it holds a's
// token.
func (b *box) forkOf(a *box) { b.tokens, b.gen = a.tokens, a.gen }

// rotate hands the agent the next token, which only its memory keeps.
func (b *box) rotate() {
	b.e.t.Helper()
	if b.gen+1 >= maxGen {
		b.e.t.Fatal("runtimetest: out of tokens")
	}
	if err := b.client(b.gen).RotateToken(b.e.ctx, Token(b.tokens, b.gen+1)); err != nil {
		b.e.t.Fatalf("rotating %s's token: %v", b.id(), err)
	}
	b.gen++
	b.wantAnswer(b.gen)
}

func (b *box) wantState(want runtime.Status) {
	b.e.t.Helper()
	got, err := b.e.Runtime.State(b.e.ctx, b.id())
	if err != nil || got != want {
		b.e.t.Errorf("State(%s) = %q, %v; want %q", b.id(), got, err, want)
	}
}

// wantGone checks that the runtime has no container id.
func (e *env) wantGone(id string) {
	e.t.Helper()
	if st, err := e.Runtime.State(e.ctx, id); !errors.Is(err, runtime.ErrNotExist) {
		e.t.Errorf("State(%s) = %q, %v; want ErrNotExist", id, st, err)
	}
}

// imageDir is a path for a memory image: its parent exists, it does not.
func (e *env) imageDir() string { return filepath.Join(e.t.TempDir(), "image") }

// wantImage checks that dir holds a memory image: a directory, not empty.
func (e *env) wantImage(dir string) {
	e.t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) == 0 {
		e.t.Errorf("image %s: %d entries, %v; want some", dir, len(ents), err)
	}
}

// wantNoDir checks that dir does not exist.
func (e *env) wantNoDir(dir string) {
	e.t.Helper()
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		e.t.Errorf("%s after a failed call: %v, want it absent", dir, err)
	}
}

// prepare readies b's namespace for a restore.
func (b *box) prepare() {
	if b.Prepare != nil {
		b.Prepare(b.e.t)
	}
}

// held is the runtime's HeldCheckpointer, or a skip.
func (e *env) held() runtime.HeldCheckpointer {
	e.t.Helper()
	hc, ok := e.Runtime.(runtime.HeldCheckpointer)
	if !ok {
		e.t.Skipf("%T is no runtime.HeldCheckpointer", e.Runtime)
	}
	return hc
}

// counter counts calls of a callback and runs check in each.
type counter struct {
	n     atomic.Int32
	check func() error
}

func (c *counter) call() error {
	c.n.Add(1)
	if c.check != nil {
		return c.check()
	}
	return nil
}

func (c *counter) want(t *testing.T, what string, n int) {
	t.Helper()
	if got := int(c.n.Load()); got != n {
		t.Errorf("%s called %d times, want %d", what, got, n)
	}
}
