package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"loam.dev/loam/client"
)

// Links is a test's own small network of machines on this one: a bridge
// on the host, with the first address of a test subnet, and a network
// namespace per machine (a node daemon of a cluster), each joined to the
// bridge by a veth pair, with an address of its own. Dropping a machine's
// link (Cut) cuts it off from everything else at once, the database and
// the other nodes, as a pulled cable would: no reset, the packets just
// stop.
type Links struct {
	t      testing.TB
	name   string // the bridge's, and the base of every other name
	prefix netip.Prefix

	mu    sync.Mutex
	links []*Link
}

// Link is one machine of Links: its namespace and its end of the link.
type Link struct {
	// Netns is the namespace's path; Addr its address on the bridge.
	Netns string
	Addr  netip.Addr
	host  string // the host's end of the veth pair
	t     testing.TB
}

// Links' subnets are fixed ones (see Subnets), beside the daemons': a
// daemon's subnet comes round again once the package's block is used up,
// and a bridge's on the host must never meet a daemon's gateway. linksCount
// bounds how many Links a package has at once.
const linksFirst, linksCount = 252, 3

var linksSeq atomic.Int64

// NewLinks makes a bridge on a subnet of its own; it is removed, with
// every machine's namespace, when t ends. What a killed run of the same
// subnet left is removed first.
func NewLinks(t testing.TB) *Links {
	t.Helper()
	prefix := netip.MustParsePrefix(Subnet(linksFirst + int(linksSeq.Add(1)-1)%linksCount))
	b := prefix.Addr().As4()
	l := &Links{t: t, prefix: prefix, name: fmt.Sprintf("lk%dx%d", b[1], b[2])}
	l.sweep()
	host := netip.AddrFrom4([4]byte{b[0], b[1], b[2], 1})
	t.Cleanup(l.sweep)
	for _, args := range [][]string{
		// A bridge takes the lowest MAC address of its ports unless given
		// one: a machine added later could change it under the others,
		// whose neighbour entries for the host then point at a MAC the
		// bridge no longer answers for, and they lose the database for
		// half a minute (until the entry goes stale). A locally
		// administered address of its own, fixed.
		{"link", "add", l.name, "address", fmt.Sprintf("02:6c:6b:%02x:%02x:01", b[1], b[2]), "type", "bridge"},
		{"addr", "add", netip.PrefixFrom(host, 24).String(), "dev", l.name},
		{"link", "set", l.name, "up"},
	} {
		ip(t, args...)
	}
	return l
}

// Host is the host's address on the bridge: where a server the machines
// reach (the database) listens.
func (l *Links) Host() netip.Addr {
	b := l.prefix.Addr().As4()
	return netip.AddrFrom4([4]byte{b[0], b[1], b[2], 1})
}

// Add makes the next machine: a namespace with lo up and an eth0 on the
// bridge, its address the subnet's 10+n-th.
func (l *Links) Add() *Link {
	l.t.Helper()
	l.mu.Lock()
	n := len(l.links)
	l.mu.Unlock()
	b := l.prefix.Addr().As4()
	name := fmt.Sprintf("%sn%d", l.name, n)
	k := &Link{Netns: "/run/netns/" + name, Addr: netip.AddrFrom4([4]byte{b[0], b[1], b[2], byte(10 + n)}), host: name + "h", t: l.t}
	for _, args := range [][]string{
		{"netns", "add", name},
		{"link", "add", k.host, "type", "veth", "peer", "name", name + "p"},
		{"link", "set", name + "p", "netns", name},
		{"link", "set", k.host, "master", l.name},
		{"link", "set", k.host, "up"},
		{"-n", name, "link", "set", name + "p", "name", "eth0"},
		{"-n", name, "addr", "add", netip.PrefixFrom(k.Addr, 24).String(), "dev", "eth0"},
		{"-n", name, "link", "set", "eth0", "up"},
		{"-n", name, "link", "set", "lo", "up"},
		{"-n", name, "route", "add", "default", "via", l.Host().String()},
	} {
		ip(l.t, args...)
	}
	l.mu.Lock()
	l.links = append(l.links, k)
	l.mu.Unlock()
	return k
}

// Cut drops the machine's link: its traffic to and from anywhere but
// itself stops.
func (k *Link) Cut() { ip(k.t, "link", "set", k.host, "down") }

// Heal brings the link back.
func (k *Link) Heal() { ip(k.t, "link", "set", k.host, "up") }

// Client is a client of the API at url, token, that connects from inside
// the machine's namespace: the way to a node's own API while its link is
// cut (its own address answers from inside whatever its link does).
func (k *Link) Client(url, token string) *client.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = k.dial
	return client.New(url, token, client.WithHTTPClient(&http.Client{Transport: tr}))
}

// dial connects from inside the namespace: a socket belongs to the
// namespace of the thread that makes it, so a thread enters it, makes the
// connection, and is thrown away (never unlocked: the runtime ends it
// rather than run other goroutines in the wrong namespace).
func (k *Link) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(k.Netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			done <- result{nil, fmt.Errorf("opening %s: %w", k.Netns, err)}
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			done <- result{nil, fmt.Errorf("entering %s: %w", k.Netns, err)}
			return
		}
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		done <- result{c, err}
	}()
	r := <-done
	return r.c, r.err
}

// sweep removes the bridge, every machine's veth pair and its namespace.
// The host's end of each pair is deleted first, which deletes the pair at
// once: a namespace's own devices go only when the kernel gets round to
// destroying it, after its last user is gone.
func (l *Links) sweep() {
	var errs []error
	ifs, _ := net.Interfaces()
	for _, i := range ifs {
		if strings.HasPrefix(i.Name, l.name+"n") {
			if out, err := exec.Command("ip", "link", "del", i.Name).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("deleting link %s: %w: %s", i.Name, err, out))
			}
		}
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(line, " ")
		if strings.HasPrefix(name, l.name+"n") {
			if err := exec.Command("ip", "netns", "del", name).Run(); err != nil {
				errs = append(errs, fmt.Errorf("deleting netns %s: %w", name, err))
			}
		}
	}
	if _, err := net.InterfaceByName(l.name); err == nil {
		if out, err := exec.Command("ip", "link", "del", l.name).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("deleting bridge %s: %w: %s", l.name, err, out))
		}
	}
	if err := errors.Join(errs...); err != nil {
		l.t.Errorf("cleanup: %v", err)
	}
}

// ip runs ip(8) with args, failing t on an error.
func ip(t testing.TB, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}
