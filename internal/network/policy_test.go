package network

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/testenv"
)

// The firewall tests run in a namespace of their own that plays the host,
// with its own subnet and names, so that they neither change the real
// host's forwarding and rules nor meet another package's tests.
const (
	fwSubnet      = "10.250.3.0/24"
	fwOtherSubnet = "10.250.4.0/24"
	fwNetnsPrefix = "loamtest-fw-"
	fwVethPrefix  = "ltf"
	fwHostNetns   = "loamtest-fwhost"
	// fwInsidePort is not DefaultInsidePort, to show the port is taken
	// from the configuration.
	fwInsidePort = 7172
	// fwOtherPort is a port the host listens on that sandboxes must not
	// reach, as the daemon's API on 7070.
	fwOtherPort = 7070
	// fwAgentPort is where the fake sandboxes listen, as agents on 7071.
	fwAgentPort = agent.DefaultPort
)

// Deadlines of connections that must fail (the firewall drops, so they
// time out) and of those that must succeed.
const (
	blockedWait = 700 * time.Millisecond
	allowedWait = 5 * time.Second
)

func TestTableName(t *testing.T) {
	tests := []struct{ subnet, want string }{
		{"10.88.0.0/16", "loam_10_88_0_0_16"},
		{"10.88.7.9/16", "loam_10_88_0_0_16"},
		{"192.168.100.0/22", "loam_192_168_100_0_22"},
	}
	for _, tt := range tests {
		if got := TableName(netip.MustParsePrefix(tt.subnet)); got != tt.want {
			t.Errorf("TableName(%s) = %q, want %q", tt.subnet, got, tt.want)
		}
	}
	m, err := New(Config{Subnet: netip.MustParsePrefix("10.88.0.0/16")})
	if err != nil {
		t.Fatal(err)
	}
	if fw := m.Firewall(); fw.Table() != "loam_10_88_0_0_16" || fw.port != DefaultInsidePort {
		t.Errorf("default firewall = %+v, want table loam_10_88_0_0_16 and port %d", fw, DefaultInsidePort)
	}
	if _, err := New(Config{Subnet: netip.MustParsePrefix("10.88.0.0/16"), FirewallTable: "a b"}); err == nil {
		t.Error(`New with table "a b": nil error, want one`)
	}
}

func TestFirewall(t *testing.T) {
	testenv.Root(t)
	ctx := context.Background()
	enterTestHost(t)
	m := newFirewallManager(t, fwSubnet)
	a := newTestEndpoint(t, m, "sb-fwtest0000a", 0)
	b := newTestEndpoint(t, m, "sb-fwtest0000b", 1)
	// X, from another subnet, stands for the rest of the world: what the
	// host routes to and from that is no sandbox of this subnet's.
	m2 := newFirewallManager(t, fwOtherSubnet)
	x := newTestEndpoint(t, m2, "sb-fwtest0000x", 0)
	for _, c := range []struct {
		m  *Manager
		ep Endpoint
	}{{m, a}, {m, b}, {m2, x}} {
		if err := c.m.Create(ctx, c.ep); err != nil {
			t.Fatalf("Create(%s): %v", c.ep.Name, err)
		}
	}
	fw := m.Firewall()
	t.Cleanup(func() { _ = fw.Remove(context.Background()) })

	l := listeners{
		agentA:    listenIn(t, a.Netns, netip.AddrPortFrom(a.SandboxIP, fwAgentPort)),
		agentB:    listenIn(t, b.Netns, netip.AddrPortFrom(b.SandboxIP, fwAgentPort)),
		world:     listenIn(t, x.Netns, netip.AddrPortFrom(x.SandboxIP, fwAgentPort)),
		inside:    listenIn(t, "", netip.AddrPortFrom(a.HostIP, fwInsidePort)),
		insideOut: listenIn(t, "", netip.AddrPortFrom(x.HostIP, fwInsidePort)),
		other:     listenIn(t, "", netip.AddrPortFrom(a.HostIP, fwOtherPort)),
		udpA:      netip.AddrPortFrom(a.SandboxIP, fwAgentPort),
	}

	// Without the firewall, what it must stop works: A reaches B's agent
	// through the host, which forwards, the world, and every port of the
	// host; the world reaches A.
	expectReach(t, a.Netns, l.agentB, allowedWait, true)
	expectReach(t, a.Netns, l.world, allowedWait, true)
	expectReach(t, a.Netns, l.other, allowedWait, true)
	expectReach(t, a.Netns, l.insideOut, allowedWait, true)
	expectDatagram(t, x.Netns, a.Netns, l.udpA, allowedWait, true)

	if err := fw.Install(ctx); err != nil {
		t.Fatalf("Install: %v", err)
	}
	logTable(t, fw.Table())
	checkFirewall(t, a, b, x, l)

	// A second Install (a restarted daemon) replaces the rules, and a
	// second daemon's firewall, with another subnet, leaves ours alone.
	if err := fw.Install(ctx); err != nil {
		t.Fatalf("Install again: %v", err)
	}
	fw2 := m2.Firewall()
	if fw2.Table() == fw.Table() {
		t.Fatalf("two subnets share table %s", fw.Table())
	}
	if err := fw2.Install(ctx); err != nil {
		t.Fatalf("Install of %s: %v", fw2.Table(), err)
	}
	if err := fw2.Remove(ctx); err != nil {
		t.Fatalf("Remove of %s: %v", fw2.Table(), err)
	}
	checkRules(t, fw.Table(), map[string]int{"forward": 3, "input": 6, "postrouting": 1, "prerouting": 2})
	checkFirewall(t, a, b, x, l)

	for range 2 {
		if err := fw.Remove(ctx); err != nil {
			t.Fatalf("Remove: %v", err)
		}
	}
	if tableExists(t, fw.Table()) {
		t.Errorf("after Remove, table %s still exists", fw.Table())
	}
	expectReach(t, a.Netns, l.agentB, allowedWait, true)
}

// listeners are the test's servers: the agents of sandboxes A and B, a
// server in the world, the in-sandbox API on A's host address and on a
// host address outside the subnet, another port (the daemon's API) on A's
// host address, and a UDP address in A.
type listeners struct {
	agentA, agentB, world, inside, insideOut, other netip.AddrPort
	udpA                                            netip.AddrPort
}

// checkFirewall checks each rule of an installed firewall with real
// connections; each check fails if its rule is missing.
func checkFirewall(t *testing.T, a, b, x Endpoint, l listeners) {
	t.Helper()
	// forward, saddr: no sandbox reaches another (whether at its own
	// host address's port or straight at the other's), nor the world.
	expectReach(t, a.Netns, l.agentB, blockedWait, false)
	expectReach(t, b.Netns, l.agentA, blockedWait, false)
	expectReach(t, a.Netns, l.world, blockedWait, false)
	// forward, daddr: nothing new from the world reaches a sandbox (a
	// datagram, since a TCP reply would be dropped by the saddr rule).
	expectDatagram(t, x.Netns, a.Netns, l.udpA, blockedWait, false)
	// input: a sandbox reaches the in-sandbox API on its host address and
	// nothing else of the host's, not even the API's port on a host
	// address outside the subnet.
	expectReach(t, a.Netns, l.inside, allowedWait, true)
	expectReach(t, a.Netns, l.insideOut, blockedWait, false)
	expectReach(t, a.Netns, l.other, blockedWait, false)
	expectReach(t, b.Netns, l.other, blockedWait, false)
	// input, established: the host still reaches the agents, whose
	// replies come back through the input chain.
	expectReach(t, "", l.agentA, allowedWait, true)
	expectReach(t, "", l.agentB, allowedWait, true)
}

// enterTestHost makes a fresh network namespace with forwarding on and
// moves the test's goroutine into it for good: its thread is never given
// back, so it dies with the test, and what the test makes in the "host"
// namespace (veths, the table) dies with the namespace. The real host's
// forwarding is checked to be left as it was.
func enterTestHost(t *testing.T) {
	t.Helper()
	path := filepath.Join(NetnsDir, fwHostNetns)
	forwarding := readForwarding(t, "/proc/self/ns/net")
	if err := ensureNetnsDir(); err != nil {
		t.Fatal(err)
	}
	if err := deleteNetns(path); err != nil {
		t.Fatal(err)
	}
	if err := createNetns(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := deleteNetns(path); err != nil {
			t.Errorf("cleaning up: %v", err)
		}
		if got := readForwarding(t, "/proc/self/ns/net"); got != forwarding {
			t.Errorf("the host's ip_forward went from %q to %q", forwarding, got)
		}
	})
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	runtime.LockOSThread() // never unlocked: the thread dies with the test
	if err := netns.Set(ns); err != nil {
		t.Fatalf("entering %s: %v", path, err)
	}
	// The sysctl is the namespace's of the thread that writes it.
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
}

func readForwarding(t *testing.T, nsPath string) string {
	t.Helper()
	var (
		b   []byte
		err error
	)
	inNetns(t, nsPath, func() { b, err = os.ReadFile("/proc/sys/net/ipv4/ip_forward") })
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func newFirewallManager(t *testing.T, subnet string) *Manager {
	t.Helper()
	m, err := New(Config{
		Subnet:      netip.MustParsePrefix(subnet),
		NetnsPrefix: fwNetnsPrefix,
		VethPrefix:  fwVethPrefix,
		InsidePort:  fwInsidePort,
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// listenIn listens on addr in the namespace at nsPath (the test's host
// namespace when empty) and greets every connection with a line.
func listenIn(t *testing.T, nsPath string, addr netip.AddrPort) netip.AddrPort {
	t.Helper()
	var (
		ln  net.Listener
		err error
	)
	listen := func() { ln, err = net.Listen("tcp", addr.String()) }
	if nsPath == "" {
		listen()
	} else {
		// A socket stays in the namespace it was made in.
		inNetns(t, nsPath, listen)
	}
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
			_, _ = c.Write([]byte("hello\n"))
			c.Close()
		}
	}()
	return addr
}

// expectReach connects from the namespace at nsPath (the test's host
// namespace when empty) to addr and reads its greeting, within wait, and
// fails the test unless that succeeds exactly when want is true.
func expectReach(t *testing.T, nsPath string, addr netip.AddrPort, wait time.Duration, want bool) {
	t.Helper()
	var (
		c   net.Conn
		err error
	)
	dial := func() { c, err = net.DialTimeout("tcp", addr.String(), wait) }
	if nsPath == "" {
		dial()
	} else {
		inNetns(t, nsPath, dial)
	}
	if err == nil {
		_ = c.SetDeadline(time.Now().Add(wait))
		var line string
		line, err = bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err == nil && line != "hello\n" {
			t.Fatalf("from %q, %s greeted %q", nsPath, addr, line)
		}
	}
	from := nsPath
	if from == "" {
		from = "the host"
	}
	switch {
	case want && err != nil:
		t.Errorf("from %s, connecting to %s: %v, want a connection", from, addr, err)
	case !want && err == nil:
		t.Errorf("from %s, connected to %s, want no connection", from, addr)
	}
}

// expectDatagram sends a datagram from the namespace at fromNs to addr, in
// the namespace at toNs, and fails the test unless it arrives within wait
// exactly when want is true.
func expectDatagram(t *testing.T, fromNs, toNs string, addr netip.AddrPort, wait time.Duration, want bool) {
	t.Helper()
	var (
		conn *net.UDPConn
		err  error
	)
	inNetns(t, toNs, func() { conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr)) })
	if err != nil {
		t.Fatalf("listening on udp %s: %v", addr, err)
	}
	defer conn.Close()
	inNetns(t, fromNs, func() {
		var c net.Conn
		if c, err = net.Dial("udp", addr.String()); err == nil {
			_, err = c.Write([]byte("hello\n"))
			c.Close()
		}
	})
	if err != nil {
		t.Fatalf("sending from %s to udp %s: %v", fromNs, addr, err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 16)
	n, _, err := conn.ReadFrom(buf)
	switch {
	case want && err != nil:
		t.Errorf("from %s, a datagram to udp %s: %v, want it to arrive", fromNs, addr, err)
	case !want && err == nil:
		t.Errorf("from %s, a datagram to udp %s arrived (%q), want none", fromNs, addr, buf[:n])
	}
}

// checkRules counts the rules of each chain of table in the calling
// thread's namespace, and checks it has no other chains.
func checkRules(t *testing.T, table string, want map[string]int) {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, ch := range chains {
		if ch.Table.Name != table {
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			t.Fatal(err)
		}
		got[ch.Name] = len(rules)
	}
	if len(got) != len(want) {
		t.Errorf("table %s has chains with rules %v, want %v", table, got, want)
	}
	for name, n := range want {
		if got[name] != n {
			t.Errorf("table %s has chains with rules %v, want %v", table, got, want)
			break
		}
	}
}

func tableExists(t *testing.T, table string) bool {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == table {
			return true
		}
	}
	return false
}

// logTable logs the table as nft prints it, if nft is installed.
func logTable(t *testing.T, table string) {
	t.Helper()
	nft, err := exec.LookPath("nft")
	if err != nil {
		return
	}
	// Started from this goroutine's thread, nft is in the test's host
	// namespace.
	out, err := exec.Command(nft, "list", "table", "ip", table).CombinedOutput()
	if err != nil {
		t.Logf("nft list table ip %s: %v\n%s", table, err, out)
		return
	}
	t.Logf("nft list table ip %s:\n%s", table, out)
}
