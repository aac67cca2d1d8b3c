// Package network gives each sandbox its own network namespace: a veth pair
// whose host end has the first address of a /30 from the daemon's subnet and
// whose sandbox end (eth0 in the namespace) has the second, with a default
// route through the host end. gVisor (--network=sandbox) moves the
// namespace's addresses and routes into its own network stack when a
// container starts or is restored, and deletes them from the namespace, so
// Prepare must run before every start and every restore.
package network

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// NetnsDir is where named network namespaces are bind-mounted, the same
// place iproute2 uses, so that `ip netns` sees ours.
const NetnsDir = "/var/run/netns"

// slotBits is the prefix length of one sandbox's slot: a /30 holds the host
// end, the sandbox end, and the network and broadcast addresses.
const slotBits = 30

// maxLinkName is the longest network interface name Linux accepts
// (IFNAMSIZ - 1).
const maxLinkName = 15

// idPrefix is the prefix of sandbox ids; it is dropped from veth names,
// which have no room for it.
const idPrefix = "sb-"

// Config configures a Manager.
type Config struct {
	// Subnet is the IPv4 range sandbox addresses come from, one /30 per
	// sandbox, e.g. 10.88.0.0/16. It must not overlap the host's networks.
	Subnet netip.Prefix
	// NetnsPrefix starts every namespace name; default "loam-". List finds
	// namespaces by it, so it must not be shared with anything else.
	NetnsPrefix string
	// VethPrefix starts every host veth name; default "lm".
	VethPrefix string
	// Node is the daemon's node of a cluster ("" alone). A sandbox brought
	// back on another node keeps its id, and two nodes may share a host
	// (and its namespace directory): a node's names are its own, the
	// namespace's with the node in it, the veth's a hash of both.
	Node string
	// InsidePort is the TCP port of the in-sandbox API on each sandbox's
	// host address, the one port of the host the firewall lets sandboxes
	// connect to; default DefaultInsidePort.
	InsidePort uint16
	// FirewallTable names the firewall's nftables table; default
	// TableName(Subnet), so that daemons with different subnets never
	// touch each other's table.
	FirewallTable string
	// DNSUpstreams, when given, are the servers (host:port) the
	// Manager's Resolver forwards to: with them the Manager serves DNS to
	// its sandboxes and enforces their name policies (see SetPolicy).
	DNSUpstreams []string
	// Log receives the Resolver's complaints; default slog.Default().
	Log *slog.Logger
}

// Manager creates and removes sandboxes' network namespaces. It keeps no
// state of its own but its DNS listeners: what exists is what the kernel
// has, so a restarted daemon finds its namespaces again with List. It is
// safe for concurrent use on different endpoints.
type Manager struct {
	cfg Config
	// resolver serves DNS; nil without DNSUpstreams.
	resolver *Resolver
}

// Endpoint is one sandbox's place on the network: a named namespace and the
// two ends of a veth pair with their addresses. Endpoint values are computed
// by Manager.Endpoint; they say nothing about whether the namespace exists.
type Endpoint struct {
	// Name is the namespace's name (as in `ip netns`).
	Name string
	// Netns is the namespace's path, for the runtime spec.
	Netns string
	// HostVeth is the name of the veth end in the host's namespace. The
	// sandbox's end is always eth0 inside Netns.
	HostVeth string
	// HostIP is the host end's address and the sandbox's default gateway.
	HostIP netip.Addr
	// SandboxIP is eth0's address inside the namespace.
	SandboxIP netip.Addr
	// Bits is the prefix length of both addresses.
	Bits int
}

// New checks cfg, fills in defaults and returns a Manager. It touches
// nothing on the host.
func New(cfg Config) (*Manager, error) {
	if !cfg.Subnet.IsValid() || !cfg.Subnet.Addr().Is4() {
		return nil, fmt.Errorf("configuring network: subnet %q is not an IPv4 prefix", cfg.Subnet)
	}
	if cfg.Subnet.Bits() > slotBits {
		return nil, fmt.Errorf("configuring network: subnet %s is smaller than one /%d", cfg.Subnet, slotBits)
	}
	cfg.Subnet = cfg.Subnet.Masked()
	if cfg.NetnsPrefix == "" {
		cfg.NetnsPrefix = "loam-"
	}
	if cfg.VethPrefix == "" {
		cfg.VethPrefix = "lm"
	}
	if cfg.InsidePort == 0 {
		cfg.InsidePort = DefaultInsidePort
	}
	if cfg.FirewallTable == "" {
		cfg.FirewallTable = TableName(cfg.Subnet)
	}
	if err := checkName(cfg.FirewallTable); err != nil || len(cfg.FirewallTable) > maxTableName {
		return nil, fmt.Errorf("configuring network: firewall table %q is not a valid name", cfg.FirewallTable)
	}
	if err := checkName(cfg.NetnsPrefix); err != nil {
		return nil, fmt.Errorf("configuring network: netns prefix: %w", err)
	}
	if err := checkName(cfg.VethPrefix); err != nil {
		return nil, fmt.Errorf("configuring network: veth prefix: %w", err)
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	m := &Manager{cfg: cfg}
	if len(cfg.DNSUpstreams) > 0 {
		r, err := NewResolver(m.Firewall(), cfg.DNSUpstreams, cfg.Log)
		if err != nil {
			return nil, fmt.Errorf("configuring network: %w", err)
		}
		m.resolver = r
	}
	return m, nil
}

// Close stops the Manager's DNS listeners. Namespaces and the firewall
// stay: sandboxes outlive the daemon.
func (m *Manager) Close() error {
	if m.resolver != nil {
		return m.resolver.Close()
	}
	return nil
}

// MaxIndex is the largest slot index Endpoint accepts: slots run from 0 to
// MaxIndex inclusive, one /30 of the subnet each.
func (m *Manager) MaxIndex() int {
	return 1<<(slotBits-m.cfg.Subnet.Bits()) - 1
}

// Endpoint computes the endpoint of sandbox id in slot index. It is pure:
// the caller allocates indices and keeps them unique among live sandboxes.
// The veth name is VethPrefix plus id without its "sb-" prefix, and must fit
// Linux's 15 bytes.
func (m *Manager) Endpoint(id string, index int) (Endpoint, error) {
	if err := checkName(id); err != nil {
		return Endpoint{}, fmt.Errorf("computing endpoint of %q: %w", id, err)
	}
	if index < 0 || index > m.MaxIndex() {
		return Endpoint{}, fmt.Errorf("computing endpoint of %s: index %d outside 0..%d of %s", id, index, m.MaxIndex(), m.cfg.Subnet)
	}
	veth := m.cfg.VethPrefix + strings.TrimPrefix(id, idPrefix)
	name := m.cfg.NetnsPrefix + id
	if m.cfg.Node != "" {
		sum := sha256.Sum256([]byte(m.cfg.Node + "/" + id))
		veth = m.cfg.VethPrefix + hex.EncodeToString(sum[:])[:maxLinkName-len(m.cfg.VethPrefix)]
		name = m.cfg.NetnsPrefix + m.cfg.Node + "-" + id
	}
	if len(veth) > maxLinkName {
		return Endpoint{}, fmt.Errorf("computing endpoint of %s: veth name %q is longer than %d bytes", id, veth, maxLinkName)
	}
	base := m.cfg.Subnet.Addr().As4()
	n := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	n += uint32(index) << (32 - slotBits)
	return Endpoint{
		Name:      name,
		Netns:     filepath.Join(NetnsDir, name),
		HostVeth:  veth,
		HostIP:    addr4(n + 1),
		SandboxIP: addr4(n + 2),
		Bits:      slotBits,
	}, nil
}

// List returns the names of the namespaces with our prefix, sorted, so that
// start-up can delete what a crashed daemon left behind. It finds them by
// name only, without checking they are still mounted.
func (m *Manager) List(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(NetnsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing network namespaces: %w", err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), m.cfg.NetnsPrefix) {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names, nil
}

func addr4(n uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
}

// checkName refuses names that are not safe as a file name in NetnsDir and
// as part of an interface name.
func checkName(s string) error {
	if s == "" {
		return errors.New("empty name")
	}
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.'
		if !ok {
			return fmt.Errorf("name %q has a character other than letters, digits, '-', '_' and '.'", s)
		}
	}
	if s == "." || s == ".." {
		return fmt.Errorf("name %q is not allowed", s)
	}
	return nil
}
