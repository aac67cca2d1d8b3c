package network

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"loam.dev/loam/internal/testenv"
)

// The egress tests' subnets: the sandboxes', and the "world" (two
// namespaces standing for the internet, routed through the test's host).
const (
	egSubnet      = "10.250.5.0/24"
	egWorldSubnet = "10.250.6.0/24"
)

func TestEgressPolicy(t *testing.T) {
	testenv.Root(t)
	ctx := context.Background()
	enterTestHost(t)
	m := newFirewallManager(t, egSubnet)
	a := newTestEndpoint(t, m, "sb-egtest0000a", 0)
	b := newTestEndpoint(t, m, "sb-egtest0000b", 1)
	mw := newFirewallManager(t, egWorldSubnet)
	w1 := newTestEndpoint(t, mw, "sb-egtest000w1", 0)
	w2 := newTestEndpoint(t, mw, "sb-egtest000w2", 1)
	for _, c := range []struct {
		m  *Manager
		ep Endpoint
	}{{m, a}, {m, b}, {mw, w1}, {mw, w2}} {
		if err := c.m.Create(ctx, c.ep); err != nil {
			t.Fatalf("Create(%s): %v", c.ep.Name, err)
		}
	}
	fw := m.Firewall()
	t.Cleanup(func() { _ = fw.Remove(context.Background()) })
	if err := fw.Install(ctx); err != nil {
		t.Fatalf("Install: %v", err)
	}
	world1 := listenEcho(t, w1.Netns, netip.AddrPortFrom(w1.SandboxIP, fwAgentPort))
	world2 := listenEcho(t, w2.Netns, netip.AddrPortFrom(w2.SandboxIP, fwAgentPort))
	agentB := listenIn(t, b.Netns, netip.AddrPortFrom(b.SandboxIP, fwAgentPort))
	other := listenIn(t, "", netip.AddrPortFrom(a.HostIP, fwOtherPort))
	otherOut := listenIn(t, "", netip.AddrPortFrom(w1.HostIP, fwOtherPort))

	set := func(p Policy) {
		t.Helper()
		if err := fw.SetPolicy(ctx, a.SandboxIP, p, Learned{}); err != nil {
			t.Fatalf("SetPolicy(%+v): %v", p, err)
		}
	}
	expect := func(w1ok, w2ok bool) {
		t.Helper()
		expectEcho(t, a.Netns, world1, w1ok)
		expectEcho(t, a.Netns, world2, w2ok)
		// Whatever the policy: no other sandbox, nothing of the host's.
		expectReach(t, a.Netns, agentB, blockedWait, false)
		expectReach(t, a.Netns, other, blockedWait, false)
		expectReach(t, a.Netns, otherOut, blockedWait, false)
	}
	pfx := func(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, 32) }

	// Steps, not subtests: a subtest's goroutine would be on another
	// thread, outside the test's host namespace.
	step := func(name string, f func()) {
		t.Logf("step: %s", name)
		f()
	}
	step("no policy", func() { expect(false, false) })
	step("all", func() {
		set(Policy{Egress: EgressAll})
		expect(true, true)
		// Masqueraded: the world sees the host's address, not the sandbox's.
		if got := echoFrom(t, a.Netns, world1, allowedWait); got != w1.HostIP.String() {
			t.Errorf("the world saw the sandbox come from %q, want %s", got, w1.HostIP)
		}
	})
	step("none", func() {
		set(Policy{Egress: EgressNone})
		expect(false, false)
	})
	step("none, allow one IP", func() {
		set(Policy{Egress: EgressNone, Allow: []netip.Prefix{pfx(w1.SandboxIP)}})
		expect(true, false)
	})
	step("all, deny one IP", func() {
		set(Policy{Egress: EgressAll, Deny: []netip.Prefix{pfx(w2.SandboxIP)}})
		expect(true, false)
	})
	step("allow wins over deny", func() {
		set(Policy{Egress: EgressNone, Allow: []netip.Prefix{pfx(w1.SandboxIP)}, Deny: []netip.Prefix{netip.MustParsePrefix(egWorldSubnet)}})
		expect(true, false)
	})
	step("an allow rule opens exactly the host's address or the sandbox it names", func() {
		// B has a policy of its own, egress all: it reaches A no more
		// than before, whatever A's rules say.
		if err := fw.SetPolicy(ctx, b.SandboxIP, Policy{Egress: EgressAll}, Learned{}); err != nil {
			t.Fatal(err)
		}
		agentA := listenIn(t, a.Netns, netip.AddrPortFrom(a.SandboxIP, fwAgentPort))
		for _, allow := range []struct {
			what string
			pf   netip.Prefix
			to   netip.AddrPort
		}{{"another sandbox", pfx(b.SandboxIP), agentB}, {"the host's address", pfx(a.HostIP), other}, {"another host address", pfx(w1.HostIP), otherOut}} {
			set(Policy{Egress: EgressNone, Allow: []netip.Prefix{allow.pf}})
			for _, to := range []netip.AddrPort{agentB, other, otherOut} {
				expectReach(t, a.Netns, to, allowedWait, to == allow.to)
			}
			expectEcho(t, a.Netns, world1, false)
			expectReach(t, b.Netns, agentA, blockedWait, false)
		}
		// Egress all and names open none of them (expect checks).
		if err := fw.RemovePolicy(ctx, b.SandboxIP); err != nil {
			t.Fatal(err)
		}
	})
	step("a change cuts an open connection", func() {
		set(Policy{Egress: EgressAll})
		var (
			c   net.Conn
			err error
		)
		inNetns(t, a.Netns, func() { c, err = net.DialTimeout("tcp", world1.String(), allowedWait) })
		if err != nil {
			t.Fatalf("connecting to %s: %v", world1, err)
		}
		defer c.Close()
		r := bufio.NewReader(c)
		if _, err := r.ReadString('\n'); err != nil { // the greeting
			t.Fatal(err)
		}
		echo := func(wait time.Duration) error {
			_ = c.SetDeadline(time.Now().Add(wait))
			if _, err := c.Write([]byte("ping\n")); err != nil {
				return err
			}
			_, err := r.ReadString('\n')
			return err
		}
		if err := echo(allowedWait); err != nil {
			t.Fatalf("echo before the change: %v", err)
		}
		set(Policy{Egress: EgressNone})
		if err := echo(blockedWait); err == nil {
			t.Error("echo after the change to none: answered, want the connection cut")
		}
	})
	step("a second Install keeps the policies and learned addresses; PrunePolicies drops them", func() {
		set(Policy{Egress: EgressNone})
		if err := fw.Resolved(ctx, a.SandboxIP, map[netip.Addr]time.Duration{w1.SandboxIP: time.Minute}, false); err != nil {
			t.Fatal(err)
		}
		expect(true, false)
		// A restarted daemon: no SetPolicy follows at once.
		if err := fw.Install(ctx); err != nil {
			t.Fatalf("Install again: %v", err)
		}
		expect(true, false)
		// The restarted daemon's first SetPolicy keeps what the sets hold
		// (its resolver knows nothing yet).
		if err := fw.SetPolicy(ctx, a.SandboxIP, Policy{Egress: EgressNone}, Learned{Keep: true}); err != nil {
			t.Fatal(err)
		}
		expect(true, false)
		if err := fw.PrunePolicies(ctx, map[netip.Addr]bool{a.SandboxIP: true}); err != nil {
			t.Fatal(err)
		}
		expect(true, false)
		if err := fw.PrunePolicies(ctx, nil); err != nil {
			t.Fatal(err)
		}
		expect(false, false)
		set(Policy{Egress: EgressNone})
		expect(false, false) // a new policy starts with nothing learned
	})
	step("removed", func() {
		for range 2 {
			if err := fw.RemovePolicy(ctx, a.SandboxIP); err != nil {
				t.Fatalf("RemovePolicy: %v", err)
			}
		}
		expect(false, false)
		checkRules(t, fw.Table(), map[string]int{"forward": 3, "input": 6, "postrouting": 1, "prerouting": 2})
	})
	if err := fw.SetPolicy(ctx, netip.MustParseAddr("10.1.2.3"), Policy{Egress: EgressAll}, Learned{}); err == nil {
		t.Error("SetPolicy of an address outside the subnet: nil error, want one")
	}
	if err := fw.SetPolicy(ctx, a.SandboxIP, Policy{Egress: "some"}, Learned{}); err == nil {
		t.Error(`SetPolicy with egress "some": nil error, want one`)
	}
	logTable(t, fw.Table())
}

// listenEcho listens on addr in the namespace at nsPath, greets every
// connection with the address it comes from and then echoes its lines.
func listenEcho(t *testing.T, nsPath string, addr netip.AddrPort) netip.AddrPort {
	t.Helper()
	var (
		ln  net.Listener
		err error
	)
	inNetns(t, nsPath, func() { ln, err = net.Listen("tcp", addr.String()) })
	if err != nil {
		t.Fatalf("listening on %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				from, _, _ := net.SplitHostPort(c.RemoteAddr().String())
				if _, err := c.Write([]byte(from + "\n")); err != nil {
					return
				}
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return addr
}

// echoFrom connects from nsPath to an echo listener, giving up after dial,
// and returns the address it says the connection came from, or "" when it
// cannot connect. A connection expected to work gets allowedWait: on a
// loaded machine a dial may take longer than blockedWait (seen in CI).
func echoFrom(t *testing.T, nsPath string, addr netip.AddrPort, dial time.Duration) string {
	t.Helper()
	wait := allowedWait
	var (
		c   net.Conn
		err error
	)
	inNetns(t, nsPath, func() { c, err = net.DialTimeout("tcp", addr.String(), dial) })
	if err != nil {
		return ""
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(wait))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return ""
	}
	return line[:len(line)-1]
}

// expectEcho fails the test unless a connection from nsPath to the echo
// listener at addr succeeds exactly when want is true.
func expectEcho(t *testing.T, nsPath string, addr netip.AddrPort, want bool) {
	t.Helper()
	dial := blockedWait
	if want {
		dial = allowedWait
	}
	got := echoFrom(t, nsPath, addr, dial) != ""
	if got != want {
		t.Errorf("from %s, reached %s: %v, want %v", nsPath, addr, got, want)
	}
}
