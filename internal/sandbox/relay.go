package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/network"
	"loam.dev/loam/internal/store"
)

// The one path to a sandbox's agent. Nothing in the core dials an agent
// but through one of the two doors here, which make the same *Call, with
// the same client, token and registration rules:
//
//   - Relay, a user's call (exec, sessions, services, files, ports,
//     watches; package guest). It applies the sandbox's holds, checkpoint
//     and sleep semantics the same way to all of them: a sleeping sandbox
//     is woken, a call that comes while a memory checkpoint holds calls
//     waits for it and goes in with the agent's new token, a call in
//     flight counts as the sandbox's activity (idle sleep waits for it),
//     and the calls that ask to be (Need.Cut) are cut by a memory
//     checkpoint or a restore.
//   - agentLink.within, the core's own call made inside the operation
//     that holds the sandbox (begin): the connect after a boot, a restore
//     or a wake with the token the agent holds then, its identity, its
//     token's rotation, a checkpoint's sync, a create's services. It
//     cannot go through Relay, which waits for that very operation (it
//     would wait for itself), so it takes the operation as proof instead,
//     and refuses a caller whose operation does not hold the sandbox.
//
// What the agent answers becomes an API error only through agentconn.Map
// (publicError for a failed operation).

// Need is what a relay needs of a sandbox and its agent.
type Need struct {
	// Protocol is the first agent protocol that serves the relay (0: any);
	// What names the relay in the refusal an older agent gets.
	Protocol int
	What     string
	// Cut has a memory checkpoint or a restore cut the relay while it is
	// in flight (Call.Ctx ends, Call.Cut says why), so that no connection
	// into the sandbox is in its memory image: the files calls. Streams are
	// ended by them whatever Cut says.
	Cut bool
}

// Call is one relay in flight to a running sandbox's agent, from Relay to
// End.
type Call struct {
	// Sandbox is the sandbox's record, read once it was awake.
	Sandbox *store.Sandbox
	// Agent is a client of its agent, which presents the sandbox's token
	// and, refused, the one a memory checkpoint moved it on to.
	Agent *agent.Client
	// Ctx is the call's context: the caller's, and cut by a checkpoint when
	// the relay needs it (Need.Cut). End cancels it.
	Ctx context.Context

	m     *Manager
	l     *live
	ep    network.Endpoint
	token string // the sandbox's agent token, as read
	c     *relayCall
	start time.Time
}

// relayCall is a call registered on its sandbox's live object.
type relayCall struct {
	cancel context.CancelCauseFunc
	cut    bool
}

// errCallEnded is the cause a call is cut with; its text says why.
type errCallEnded struct{ reason string }

func (e *errCallEnded) Error() string { return e.reason }

// errHeld is tryRelay's: calls were held (a memory checkpoint began) after
// the sandbox was read; read it again once they go on.
var errHeld = errors.New("calls held")

// Relay begins a call to the agent of sandbox ref, which must be running
// (it is woken if it sleeps) and run an agent that serves need. The caller
// calls End when the call is over; a Stream it opened lives on.
func (m *Manager) Relay(ctx context.Context, ref string, need Need) (*Call, error) {
	for {
		c, err := m.tryRelay(ctx, ref, need)
		if !errors.Is(err, errHeld) {
			return c, err
		}
	}
}

func (m *Manager) tryRelay(ctx context.Context, ref string, need Need) (*Call, error) {
	// A hold may begin and end (the checkpoint taken, the agent's token
	// moved on) between the look at the sandbox and the registration
	// below: the sandbox's live object tells (heldSince), and the sandbox
	// is read again.
	start := time.Now()
	sb, err := m.awake(ctx, ref)
	if err == nil {
		err = requireState(sb.Name, sb.State, api.StateRunning)
	}
	if err == nil && need.Protocol > 0 {
		err = m.agents.require(sb, need.Protocol, need.What)
	}
	if err != nil {
		return nil, err
	}
	ep, err := m.Endpoint(sb)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancelCause(ctx)
	c := &relayCall{cancel: cancel, cut: need.Cut}
	l := m.live(sb.ID)
	l.mu.Lock()
	// A call registered before a checkpoint holds calls is cut by it (or,
	// not Cut, carries its token's refresh); one that comes after must wait
	// (in awake), or it would carry the token read above past the
	// checkpoint's new one.
	if l.heldSinceLocked(start) {
		l.mu.Unlock()
		cancel(nil)
		return nil, errHeld
	}
	if l.calls == nil {
		l.calls = map[*relayCall]bool{}
	}
	l.calls[c] = true
	l.mu.Unlock()
	return m.agents.newCall(cctx, sb, l, ep, m.agents.token(sb), true, c, start), nil
}

// within begins a call to the agent of sandbox sb at ep, presenting token,
// for the operation op that holds the sandbox and runs the call: the
// core's own calls (see the two doors above). op is the caller's proof: a
// sandbox not in op now (another operation, or none) is refused with an
// internal error, never reached, since a call from outside its operation
// could race a restore, a sleep or a delete the way a user's call may not.
//
// It neither waits for held calls nor wakes the sandbox: the operation is
// what holds them, and waiting would be waiting for itself. The call is
// not registered on the live object: it is not a user's activity (it
// must not keep a sandbox from its idle sleep), and no checkpoint cuts it,
// since only the operation that runs it could take one. Its client
// presents token alone, with no refresh: the operation chose it (the one
// the agent holds before a rotation, say) and no hold moves it on
// meanwhile.
func (a *agentLink) within(ctx context.Context, sb *store.Sandbox, op operation, ep network.Endpoint, token string) (*Call, error) {
	l := a.m.peek(sb.ID)
	have := opNone
	if l != nil {
		have, _ = l.current()
	}
	if op == opNone || have != op {
		return nil, &outsideOpError{id: sb.ID, want: op, have: have}
	}
	cctx, cancel := context.WithCancelCause(ctx)
	return a.newCall(cctx, sb, l, ep, token, false, &relayCall{cancel: cancel}, time.Now()), nil
}

// outsideOpError is within's refusal of a call made by an operation that
// does not hold the sandbox: a fault of the core's, an internal error to
// the API.
type outsideOpError struct {
	id         string
	want, have operation
}

func (e *outsideOpError) Error() string {
	have := e.have.String()
	if e.have == opNone {
		have = "no operation"
	}
	return fmt.Sprintf("a call to the agent of %s for %q while %s holds the sandbox", e.id, e.want.String(), have)
}

// Is makes the refusal an api.ErrInternal.
func (e *outsideOpError) Is(target error) bool { return target == api.ErrInternal }

// newCall is the one place a Call is made, for both doors: its client of
// the agent at ep presenting token (for a user's call, refreshing it
// across a memory checkpoint's rotation; see refreshing), and its
// registration c on live object l, which the door made (Relay registers
// it, within does not).
func (a *agentLink) newCall(ctx context.Context, sb *store.Sandbox, l *live, ep network.Endpoint, token string, user bool, c *relayCall, start time.Time) *Call {
	ac := a.agentClient(ep, token)
	if user {
		a.refreshing(ac, sb.ID)
	}
	return &Call{Sandbox: sb, Agent: ac, Ctx: ctx, m: a.m, l: l, ep: ep, token: token, c: c, start: start}
}

// refreshing has ac, a client for a user's call to sandbox id's agent,
// present, when refused, the token the agent holds once a memory
// checkpoint that moved it on is done (see agent.Client's Refresh).
func (a *agentLink) refreshing(ac *agent.Client, id string) {
	m := a.m
	ac.Refresh = func(ctx context.Context) []string {
		if held := m.live(id).heldOn(); held != nil {
			select {
			case <-held:
			case <-ctx.Done():
				return nil
			}
		}
		now, err := m.store.GetSandbox(ctx, "", id)
		if err != nil {
			return nil
		}
		// The stored generation, then the one before: the agent may not
		// have taken the new one yet. Both are this sandbox's own, sent
		// only to its own address.
		toks := []string{a.token(now)}
		if now.AgentGen > 0 {
			toks = append(toks, AgentToken(m.cfg.Secret, now.ID, now.AgentGen-1))
		}
		return toks
	}
}

// agentClient is a client of the agent at ep that presents token: the
// connections are agentconn's. Only the doors above (and a Call's own
// sockets) use it.
func (a *agentLink) agentClient(ep network.Endpoint, token string) *agent.Client {
	return a.m.conns.Client(ep.SandboxIP, token)
}

// End ends the call: the sandbox's activity (a user's call only: see
// within), and the call's context. It is safe to call more than once.
func (c *Call) End() {
	c.l.mu.Lock()
	if c.l.calls[c.c] {
		delete(c.l.calls, c.c)
		c.l.used = time.Now()
	}
	c.l.mu.Unlock()
	c.c.cancel(nil)
}

// Activate keeps the sandbox active (no idle sleep) until release is
// called, beyond the call's end: for a caller whose next call comes after
// a wait on its client, as an exec's does after the WebSocket handshake.
func (c *Call) Activate() (release func()) { return c.l.activate() }

// Cut is why a checkpoint or a restore cut the call, "" when none did.
func (c *Call) Cut() string {
	var ended *errCallEnded
	if errors.As(context.Cause(c.Ctx), &ended) {
		return ended.reason
	}
	return ""
}

// Held reports whether calls to the sandbox were held (a memory checkpoint
// began or ended) since the call began to read the sandbox: what it sent
// the agent may have gone with the token of before (see guest's Exec).
func (c *Call) Held() bool {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	return c.l.heldSinceLocked(c.start)
}

// RequireAgent refuses, with a clear error, a part of the call (what) that
// needs an agent of protocol min or newer when the sandbox runs an older
// one.
func (c *Call) RequireAgent(min int, what string) error {
	return c.m.agents.require(c.Sandbox, min, what)
}

// Stream makes a Stream of conn, a socket to the sandbox's agent (nil for a
// call that must end as streams do), that a checkpoint, a restore or a
// delete of the sandbox ends; fromAgent rewrites what the agent sends (see
// Stream.FromAgent). The stream outlives the call.
func (c *Call) Stream(conn *websocket.Conn, fromAgent func([]byte) []byte) *Stream {
	s := newStream(conn, fromAgent)
	c.m.addStream(c.Sandbox.ID, s)
	return s
}

// TakeSpare returns an exec socket to the agent opened ahead (see
// agentconn.Conns), nil when there is none that can be used.
func (c *Call) TakeSpare() *websocket.Conn {
	return c.m.conns.TakeSpare(c.Sandbox.ID, c.token)
}

// DialExec opens an exec socket to the agent.
func (c *Call) DialExec(ctx context.Context) (*websocket.Conn, error) {
	return c.m.agents.agentClient(c.ep, c.token).DialExec(ctx)
}

// OpenSpares has exec sockets opened ahead for the next execs.
func (c *Call) OpenSpares() {
	c.m.conns.OpenSpares(c.Sandbox.ID, c.ep.SandboxIP, c.token)
}

// Volume is the host path of the sandbox's disk: where an upload's room
// is looked for.
func (c *Call) Volume() string { return c.m.disks.VolumePath(c.Sandbox.ID) }

// GuestCore is the core as the guest data plane (package guest) sees it
// (it implements guest.Core): the one entry point to a sandbox's agent
// (Relay, the Manager's: its holds, checkpoint and sleep semantics are
// the core's) and the agent's own port, which no user's call may reach.
// It is a type of its own so that what only the data plane asks is not
// part of the Manager's surface. Make it with NewGuestCore; the daemon
// gives it to guest.New.
type GuestCore struct{ m *Manager }

// NewGuestCore is the guest data plane's side of m.
func NewGuestCore(m *Manager) *GuestCore { return &GuestCore{m: m} }

// Relay begins a call to the agent of sandbox ref (see Manager.Relay).
func (g *GuestCore) Relay(ctx context.Context, ref string, need Need) (*Call, error) {
	return g.m.Relay(ctx, ref, need)
}

// AgentPort is the TCP port of the agent inside every sandbox: no user's
// port stream may reach it.
func (g *GuestCore) AgentPort() int { return g.m.cfg.AgentPort }

// endCalls cuts every call in flight to sandbox id that a checkpoint cuts
// (Need.Cut).
func (m *Manager) endCalls(id, reason string) {
	l := m.peek(id)
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.calls {
		if c.cut {
			c.cancel(&errCallEnded{reason: reason})
		}
	}
}

// View is the sandbox as the API shows it.
func (c *Call) View() *api.Sandbox { return c.m.view(c.Sandbox) }
