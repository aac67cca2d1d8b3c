package sandbox

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agentconn"
	"loam.dev/loam/internal/network"
	"loam.dev/loam/internal/store"
)

// TestWithinNeedsItsOperation: the core's door to an agent (within) lets
// a call through only for the operation that holds the sandbox now, and
// refuses it, as an internal error and before anything reaches the agent,
// when the sandbox is in another operation or in none. The call it lets
// through presents the operation's token and nothing else, and is not the
// sandbox's activity: no refresh, no registration on the live object.
func TestWithinNeedsItsOperation(t *testing.T) {
	var mu sync.Mutex
	var seen []string // the tokens the agent was called with
	agentSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true,"version":5}`))
	}))
	defer agentSrv.Close()
	addr := netip.MustParseAddrPort(agentSrv.Listener.Addr().(*net.TCPAddr).String())

	m := &Manager{conns: agentconn.NewConns(int(addr.Port()))}
	defer m.conns.Close()
	m.agents = &agentLink{m: m}
	sb := &store.Sandbox{Sandbox: api.Sandbox{ID: "sb-w", Name: "w"}}
	ep := network.Endpoint{SandboxIP: addr.Addr()}
	ctx := t.Context()
	calls := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}

	refused := func(op operation, have string) {
		t.Helper()
		c, err := m.agents.within(ctx, sb, op, ep, "tok")
		var out *outsideOpError
		if !errors.As(err, &out) || !errors.Is(err, api.ErrInternal) {
			t.Fatalf("within(%q) while %s holds the sandbox: %v, %v; want an internal refusal", op, have, c, err)
		}
		if !strings.Contains(err.Error(), have) {
			t.Errorf("refusal %q does not say %q holds the sandbox", err, have)
		}
	}
	refused(opCheckpoint, "no operation") // no live object yet
	end, err := m.begin(sb, opCheckpoint)
	if err != nil {
		t.Fatal(err)
	}
	refused(opRestore, "a checkpoint")
	refused(opNone, "a checkpoint")
	if got := calls(); len(got) != 0 {
		t.Fatalf("a refused call reached the agent: %q", got)
	}

	c, err := m.agents.within(ctx, sb, opCheckpoint, ep, "tok")
	if err != nil {
		t.Fatalf("within the operation that holds the sandbox: %v", err)
	}
	if c.Agent.Token != "tok" || c.Agent.Refresh != nil {
		t.Errorf("the core's call presents %q (refresh set: %v), want the operation's token alone", c.Agent.Token, c.Agent.Refresh != nil)
	}
	if h, err := c.Agent.Health(c.Ctx); err != nil || h.Version != 5 {
		t.Fatalf("the core's call to the agent: %+v, %v", h, err)
	}
	l := m.peek(sb.ID)
	l.mu.Lock()
	registered := len(l.calls)
	l.mu.Unlock()
	if registered != 0 {
		t.Errorf("the core's call is registered as a user's (%d calls)", registered)
	}
	c.End()
	c.End()
	if c.Ctx.Err() == nil {
		t.Error("the call's context outlived its End")
	}
	l.mu.Lock()
	used := l.used
	l.mu.Unlock()
	if !used.IsZero() {
		t.Error("the core's call counted as the sandbox's activity")
	}
	if got := calls(); len(got) != 1 || got[0] != "tok" {
		t.Errorf("the agent was called with %q, want the operation's token once", got)
	}

	end()
	refused(opCheckpoint, "no operation")
}
