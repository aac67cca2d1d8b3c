package network

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"loam.dev/loam/internal/testenv"
)

// The subnet and names of this package's tests, distinct from every other
// test package's, so that packages can run at the same time.
const (
	testSubnet      = "10.250.1.0/24"
	testNetnsPrefix = "loamtest-net-"
	testVethPrefix  = "ltn"
)

func TestNewRejects(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no subnet", Config{}},
		{"ipv6", Config{Subnet: netip.MustParsePrefix("fd00::/64")}},
		{"too small", Config{Subnet: netip.MustParsePrefix("10.0.0.0/31")}},
		{"bad netns prefix", Config{Subnet: netip.MustParsePrefix("10.0.0.0/24"), NetnsPrefix: "a/b"}},
		{"bad veth prefix", Config{Subnet: netip.MustParsePrefix("10.0.0.0/24"), VethPrefix: "a b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg); err == nil {
				t.Fatalf("New(%+v) = nil error, want one", tt.cfg)
			}
		})
	}
}

func TestEndpoint(t *testing.T) {
	m, err := New(Config{Subnet: netip.MustParsePrefix("10.88.7.9/16")})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.MaxIndex(), 1<<14-1; got != want {
		t.Errorf("MaxIndex() = %d, want %d", got, want)
	}
	tests := []struct {
		id               string
		index            int
		host, sandbox    string
		netnsName, hostV string
	}{
		{"sb-0123456789ab", 0, "10.88.0.1", "10.88.0.2", "loam-sb-0123456789ab", "lm0123456789ab"},
		{"sb-0123456789ab", 1, "10.88.0.5", "10.88.0.6", "loam-sb-0123456789ab", "lm0123456789ab"},
		{"sb-aaaaaaaaaaaa", 64, "10.88.1.1", "10.88.1.2", "loam-sb-aaaaaaaaaaaa", "lmaaaaaaaaaaaa"},
		{"x", 1<<14 - 1, "10.88.255.253", "10.88.255.254", "loam-x", "lmx"},
	}
	for _, tt := range tests {
		ep, err := m.Endpoint(tt.id, tt.index)
		if err != nil {
			t.Errorf("Endpoint(%q, %d): %v", tt.id, tt.index, err)
			continue
		}
		want := Endpoint{
			Name:      tt.netnsName,
			Netns:     "/var/run/netns/" + tt.netnsName,
			HostVeth:  tt.hostV,
			HostIP:    netip.MustParseAddr(tt.host),
			SandboxIP: netip.MustParseAddr(tt.sandbox),
			Bits:      30,
		}
		if ep != want {
			t.Errorf("Endpoint(%q, %d) = %+v, want %+v", tt.id, tt.index, ep, want)
		}
	}
	for _, bad := range []struct {
		id    string
		index int
	}{
		{"sb-0123456789ab", -1},
		{"sb-0123456789ab", 1 << 14},
		{"sb-0123456789abcdef", 0}, // veth name too long
		{"../etc", 0},
		{"", 0},
	} {
		if ep, err := m.Endpoint(bad.id, bad.index); err == nil {
			t.Errorf("Endpoint(%q, %d) = %+v, want an error", bad.id, bad.index, ep)
		}
	}
}

func TestCreatePrepareDelete(t *testing.T) {
	testenv.Root(t)
	ctx := context.Background()
	m := newTestManager(t)
	a := newTestEndpoint(t, m, "sb-nettest0000a", 0)
	b := newTestEndpoint(t, m, "sb-nettest0000b", 1)

	for _, ep := range []Endpoint{a, b} {
		if err := m.Create(ctx, ep); err != nil {
			t.Fatalf("Create(%s): %v", ep.Name, err)
		}
	}
	names, err := m.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(names, a.Name) || !slices.Contains(names, b.Name) {
		t.Errorf("List() = %v, want %s and %s in it", names, a.Name, b.Name)
	}
	checkInside(t, a)
	checkReachable(t, a)
	checkReachable(t, b)

	// Again, as after a crash: nothing changes, nothing breaks.
	if err := m.Create(ctx, a); err != nil {
		t.Fatalf("Create again: %v", err)
	}
	checkReachable(t, a)

	// What gVisor does at start: the namespace loses eth0's address and
	// routes. Prepare brings them back, as often as it is called.
	stripInside(t, a)
	for range 2 {
		if err := m.Prepare(ctx, a); err != nil {
			t.Fatalf("Prepare: %v", err)
		}
	}
	checkInside(t, a)
	checkReachable(t, a)

	for range 2 {
		if err := m.Delete(ctx, a); err != nil {
			t.Fatalf("Delete: %v", err)
		}
	}
	if _, err := os.Stat(a.Netns); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Delete, stat %s: %v, want not exist", a.Netns, err)
	}
	if _, err := netlink.LinkByName(a.HostVeth); !isLinkNotFound(err) {
		t.Errorf("after Delete, %s still exists (err %v)", a.HostVeth, err)
	}
	if names, _ := m.List(ctx); slices.Contains(names, a.Name) {
		t.Errorf("after Delete, List() = %v still has %s", names, a.Name)
	}
	// The other sandbox is untouched.
	checkReachable(t, b)
	if err := m.Prepare(ctx, a); err == nil {
		t.Error("Prepare of a deleted endpoint: nil error, want one")
	}
}

func TestCreateUndoesOnFailure(t *testing.T) {
	testenv.Root(t)
	ctx := context.Background()
	m := newTestManager(t)
	ep := newTestEndpoint(t, m, "sb-nettest0000c", 2)
	// A gateway outside eth0's /30 fails Create at the default route,
	// after the namespace and the veth are made.
	ep.SandboxIP = ep.SandboxIP.Next().Next().Next().Next()
	if err := m.Create(ctx, ep); err == nil {
		t.Fatal("Create with an unreachable gateway: nil error, want one")
	} else {
		t.Logf("Create failed as it should: %v", err)
	}
	if _, err := os.Stat(ep.Netns); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after a failed Create, stat %s: %v, want not exist", ep.Netns, err)
	}
	if _, err := netlink.LinkByName(ep.HostVeth); !isLinkNotFound(err) {
		t.Errorf("after a failed Create, %s still exists (err %v)", ep.HostVeth, err)
	}
}

func newTestManager(t *testing.T) *Manager {
	t.Helper()
	m, err := New(Config{
		Subnet:      netip.MustParsePrefix(testSubnet),
		NetnsPrefix: testNetnsPrefix,
		VethPrefix:  testVethPrefix,
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// newTestEndpoint computes an endpoint and removes it before (a crashed
// earlier run may have left it) and after the test.
func newTestEndpoint(t *testing.T, m *Manager, id string, index int) Endpoint {
	t.Helper()
	ep, err := m.Endpoint(id, index)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Delete(context.Background(), ep); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Delete(context.Background(), ep); err != nil {
			t.Errorf("cleaning up: %v", err)
		}
	})
	return ep
}

// inNetns runs f on a thread in the namespace at path. The thread is
// thrown away afterwards.
func inNetns(t *testing.T, path string, f func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with us
		ns, err := netns.GetFromPath(path)
		if err != nil {
			done <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			done <- err
			return
		}
		f()
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatalf("entering %s: %v", path, err)
	}
}

// checkReachable listens on ep's sandbox address inside its namespace and
// connects to it from the host.
func checkReachable(t *testing.T, ep Endpoint) {
	t.Helper()
	var (
		ln  net.Listener
		err error
	)
	// A socket stays in the namespace it was made in.
	inNetns(t, ep.Netns, func() { ln, err = net.Listen("tcp", netip.AddrPortFrom(ep.SandboxIP, 0).String()) })
	if err != nil {
		t.Fatalf("listening in %s: %v", ep.Name, err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write([]byte("hello from " + ep.Name + "\n"))
	}()
	c, err := net.DialTimeout("tcp", ln.Addr().String(), 3*time.Second)
	if err != nil {
		t.Fatalf("connecting from the host to %s in %s: %v", ln.Addr(), ep.Name, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("reading from %s: %v", ep.Name, err)
	}
	if want := "hello from " + ep.Name + "\n"; line != want {
		t.Errorf("read %q, want %q", line, want)
	}
}

// checkInside checks eth0's address, lo and the default route in ep's
// namespace.
func checkInside(t *testing.T, ep Endpoint) {
	t.Helper()
	h := handleIn(t, ep)
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.AddrList(eth, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	want := netip.PrefixFrom(ep.SandboxIP, ep.Bits).String()
	if len(addrs) != 1 || addrs[0].IPNet.String() != want {
		t.Errorf("eth0 addresses = %v, want just %s", addrs, want)
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if lo.Attrs().Flags&net.FlagUp == 0 {
		t.Error("lo is down")
	}
	routes, err := h.RouteList(eth, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var defaults []string
	for _, r := range routes {
		if r.Dst == nil || r.Dst.String() == "0.0.0.0/0" {
			defaults = append(defaults, r.Gw.String())
		}
	}
	if len(defaults) != 1 || defaults[0] != ep.HostIP.String() {
		t.Errorf("default routes via %v, want one via %s", defaults, ep.HostIP)
	}
}

// stripInside does to ep's namespace what runsc does at start: eth0 keeps
// no address, so no routes either.
func stripInside(t *testing.T, ep Endpoint) {
	t.Helper()
	h := handleIn(t, ep)
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.AddrList(eth, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if err := h.AddrDel(eth, &a); err != nil {
			t.Fatal(err)
		}
	}
	routes, _ := h.RouteList(eth, netlink.FAMILY_V4)
	if len(routes) != 0 {
		t.Fatalf("routes left after removing eth0's addresses: %v", routes)
	}
}

func handleIn(t *testing.T, ep Endpoint) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromPath(ep.Netns)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestList(t *testing.T) {
	testenv.Root(t)
	m := newTestManager(t)
	ep := newTestEndpoint(t, m, "sb-nettest0000d", 3)
	if err := m.Create(context.Background(), ep); err != nil {
		t.Fatal(err)
	}
	names, err := m.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if !strings.HasPrefix(n, testNetnsPrefix) {
			t.Errorf("List() has %q, without our prefix %q", n, testNetnsPrefix)
		}
	}
	if !slices.Contains(names, ep.Name) {
		t.Errorf("List() = %v, want %s in it", names, ep.Name)
	}
}
