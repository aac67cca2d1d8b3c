package network

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// sandboxLink is the name of the veth end inside every namespace.
const sandboxLink = "eth0"

// Create makes ep's namespace and veth pair, addresses the host end and
// prepares the sandbox end (see Prepare). What already exists is kept, so
// Create can be called again after a crash; on failure it removes what it
// made itself.
func (m *Manager) Create(ctx context.Context, ep Endpoint) (err error) {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("creating network of %s: %w", ep.Name, err)
	}
	if err := ep.check(); err != nil {
		return fmt.Errorf("creating network of %s: %w", ep.Name, err)
	}
	if err := ensureNetnsDir(); err != nil {
		return fmt.Errorf("creating network of %s: %w", ep.Name, err)
	}
	nsCreated := false
	if !isNetns(ep.Netns) {
		if err := createNetns(ep.Netns); err != nil {
			return fmt.Errorf("creating network of %s: %w", ep.Name, err)
		}
		nsCreated = true
	}
	vethCreated := false
	defer func() {
		if err == nil {
			return
		}
		if vethCreated {
			_ = deleteLink(ep.HostVeth)
		}
		if nsCreated {
			_ = deleteNetns(ep.Netns)
		}
	}()

	ns, err := netns.GetFromPath(ep.Netns)
	if err != nil {
		return fmt.Errorf("creating network of %s: opening namespace: %w", ep.Name, err)
	}
	defer ns.Close()

	host, err := netlink.LinkByName(ep.HostVeth)
	switch {
	case err == nil && nsCreated:
		// A veth whose namespace is new is left from an earlier sandbox
		// (its peer went with the old namespace, or lives elsewhere).
		if err := netlink.LinkDel(host); err != nil {
			return fmt.Errorf("creating network of %s: deleting stale %s: %w", ep.Name, ep.HostVeth, err)
		}
		host = nil
	case err == nil:
	case isLinkNotFound(err):
		host = nil
	default:
		return fmt.Errorf("creating network of %s: looking up %s: %w", ep.Name, ep.HostVeth, err)
	}
	if host == nil {
		// The peer is made inside the namespace under its final name, so
		// that no two sandboxes' peers ever meet in the host's namespace.
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: ep.HostVeth},
			PeerName:      sandboxLink,
			PeerNamespace: netlink.NsFd(ns),
		}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("creating network of %s: adding veth %s: %w", ep.Name, ep.HostVeth, err)
		}
		vethCreated = true
		if host, err = netlink.LinkByName(ep.HostVeth); err != nil {
			return fmt.Errorf("creating network of %s: looking up %s: %w", ep.Name, ep.HostVeth, err)
		}
	}
	if err := netlink.AddrReplace(host, &netlink.Addr{IPNet: ipNet(ep.HostIP, ep.Bits)}); err != nil {
		return fmt.Errorf("creating network of %s: addressing %s: %w", ep.Name, ep.HostVeth, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("creating network of %s: bringing %s up: %w", ep.Name, ep.HostVeth, err)
	}
	if err := prepare(ns, ep); err != nil {
		return fmt.Errorf("creating network of %s: %w", ep.Name, err)
	}
	return nil
}

// Prepare (re-)configures the inside of ep's namespace: lo up, eth0 up with
// SandboxIP, and a default route through HostIP. gVisor takes these away at
// every start and restore, so Prepare runs right before each; it must not
// run while a container uses the namespace, or the host kernel would answer
// for the sandbox's address. It replaces rather than adds, so running it
// twice is harmless.
func (m *Manager) Prepare(ctx context.Context, ep Endpoint) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("preparing network of %s: %w", ep.Name, err)
	}
	if err := ep.check(); err != nil {
		return fmt.Errorf("preparing network of %s: %w", ep.Name, err)
	}
	ns, err := netns.GetFromPath(ep.Netns)
	if err != nil {
		return fmt.Errorf("preparing network of %s: opening namespace: %w", ep.Name, err)
	}
	defer ns.Close()
	if err := prepare(ns, ep); err != nil {
		return fmt.Errorf("preparing network of %s: %w", ep.Name, err)
	}
	return nil
}

// Delete removes ep's veth pair and namespace. What is already gone is no
// error. A container still running in the namespace keeps it alive (but
// unreachable) until it exits.
func (m *Manager) Delete(ctx context.Context, ep Endpoint) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("deleting network of %s: %w", ep.Name, err)
	}
	// Deleting one end of a veth pair deletes the other.
	if err := deleteLink(ep.HostVeth); err != nil {
		return fmt.Errorf("deleting network of %s: %w", ep.Name, err)
	}
	if err := deleteNetns(ep.Netns); err != nil {
		return fmt.Errorf("deleting network of %s: %w", ep.Name, err)
	}
	return nil
}

// check refuses an endpoint that Manager.Endpoint would not have made, up
// to the addresses, before anything is changed on the host.
func (ep Endpoint) check() error {
	if !ep.HostIP.Is4() || !ep.SandboxIP.Is4() || ep.Bits < 1 || ep.Bits > 32 {
		return fmt.Errorf("invalid endpoint addresses %s and %s /%d", ep.HostIP, ep.SandboxIP, ep.Bits)
	}
	if err := checkName(ep.Name); err != nil {
		return fmt.Errorf("invalid endpoint: %w", err)
	}
	if err := checkName(ep.HostVeth); err != nil || len(ep.HostVeth) > maxLinkName {
		return fmt.Errorf("invalid endpoint veth name %q", ep.HostVeth)
	}
	if filepath.Dir(ep.Netns) != NetnsDir {
		return fmt.Errorf("invalid endpoint: namespace %s is not in %s", ep.Netns, NetnsDir)
	}
	return nil
}

// prepare configures the inside of namespace ns through a netlink handle
// opened in it, so the calling thread never changes namespace.
func prepare(ns netns.NsHandle, ep Endpoint) error {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("opening netlink in namespace: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("looking up lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("bringing lo up: %w", err)
	}
	eth, err := h.LinkByName(sandboxLink)
	if err != nil {
		return fmt.Errorf("looking up %s: %w", sandboxLink, err)
	}
	if err := h.AddrReplace(eth, &netlink.Addr{IPNet: ipNet(ep.SandboxIP, ep.Bits)}); err != nil {
		return fmt.Errorf("addressing %s: %w", sandboxLink, err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("bringing %s up: %w", sandboxLink, err)
	}
	def := &netlink.Route{
		LinkIndex: eth.Attrs().Index,
		Dst:       &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
		Gw:        net.IP(ep.HostIP.AsSlice()),
	}
	if err := h.RouteReplace(def); err != nil {
		return fmt.Errorf("adding default route via %s: %w", ep.HostIP, err)
	}
	return nil
}

// ensureNetnsDir makes NetnsDir a shared mount point, as iproute2 does, so
// that a namespace unmounted here is unmounted in every mount namespace
// that was copied from ours (runsc's gofer makes one) and can be freed.
func ensureNetnsDir() error {
	if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
		return fmt.Errorf("making %s: %w", NetnsDir, err)
	}
	err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) {
		// Not a mount point yet: make it one, then share it.
		if err := unix.Mount(NetnsDir, NetnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mounting %s on itself: %w", NetnsDir, err)
		}
		err = unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("making %s a shared mount: %w", NetnsDir, err)
	}
	return nil
}

// isNetns reports whether path is a mounted network namespace (and not,
// say, the empty file a crash between creating and mounting left).
func isNetns(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}

// createNetns makes a new network namespace and bind-mounts it at path. The
// namespace is made by a thread that is then thrown away, so no goroutine
// ever runs in the wrong namespace.
func createNetns(path string) error {
	// A leftover plain file (from a crash before the mount) is in the way.
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing stale %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("making mount point %s: %w", path, err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: when this goroutine returns, the runtime ends the
		// thread instead of reusing it in the new namespace.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unsharing network namespace: %w", err)
			return
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind-mounting namespace at %s: %w", path, err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		_ = os.Remove(path)
		return err
	}
	return nil
}

// deleteNetns unmounts and removes a namespace's file; gone is no error.
func deleteNetns(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	return nil
}

// deleteLink deletes a link in the host's namespace; gone is no error.
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if isLinkNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

func isLinkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, a.BitLen())}
}
