package network

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
)

// Egress is what a sandbox may reach outside its subnet when no rule of its
// policy says otherwise.
type Egress string

// The egress defaults. Their strings are the API's and never change.
const (
	// EgressAll lets the sandbox reach every address the host routes to
	// (the internet, and the host's other networks), except the host
	// itself and the daemon's subnet, which are closed whatever the
	// default.
	EgressAll Egress = "all"
	// EgressNone lets the sandbox reach only what its allow list names.
	EgressNone Egress = "none"
)

// Policy is one sandbox's egress policy as the firewall enforces it:
// addresses only (host names are the resolver's business, which turns them
// into addresses).
type Policy struct {
	// Egress is the default for destinations neither list names.
	Egress Egress
	// Allow are destinations always let through; allow wins over deny.
	Allow []netip.Prefix
	// Deny are destinations never let through unless Allow names them.
	Deny []netip.Prefix
	// AllowNames and DenyNames are host names ("pypi.org") and patterns
	// ("*.example.com": every name below example.com), lower case. The
	// Resolver enforces them: it refuses names the policy refuses, and
	// opens the addresses of allowed names for the sandbox that asked.
	AllowNames, DenyNames []string
}

// Check refuses a policy the firewall cannot enforce.
func (p Policy) Check() error {
	if p.Egress != EgressAll && p.Egress != EgressNone {
		return fmt.Errorf("egress %q is neither %q nor %q", p.Egress, EgressAll, EgressNone)
	}
	for _, list := range [][]netip.Prefix{p.Allow, p.Deny} {
		for _, pf := range list {
			if !pf.IsValid() || !pf.Addr().Is4() {
				return fmt.Errorf("%q is not an IPv4 address or prefix", pf)
			}
		}
	}
	for _, list := range [][]string{p.AllowNames, p.DenyNames} {
		for _, n := range list {
			if !ValidNamePattern(n) {
				return fmt.Errorf("%q is not a host name or *.name pattern", n)
			}
		}
	}
	return nil
}

// ValidNamePattern tells whether s is a host name in lower case (labels of
// letters, digits and '-', not starting or ending with '-', at most 253
// bytes), optionally prefixed by "*.".
func ValidNamePattern(s string) bool {
	s = strings.TrimPrefix(s, "*.")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// generation is the conntrack mark of connections the sandbox at addr
// opened to allowed names under p: a hash of both, so that setting the same
// policy again (a wake, a restore, a restarted daemon) keeps those
// connections, and another policy cuts them. Never 0, the mark of
// unmarked connections.
func (p Policy) generation(addr netip.Addr) []byte {
	h := fnv.New32a()
	fmt.Fprintf(h, "%s|%s|%v|%v|%v|%v", addr, p.Egress, p.Allow, p.Deny, p.AllowNames, p.DenyNames)
	sum := h.Sum(nil)
	sum[0] |= 1
	return sum
}

// policiesMap is the verdict map from a sandbox's address to the jump to
// its policy chain.
const policiesMap = "policies"

// namesSet is the name of the set of addresses the Resolver opened for the
// sandbox at addr, e.g. "names_10_88_0_2"; its elements time out.
func namesSet(t *nftables.Table, addr netip.Addr) *nftables.Set {
	return &nftables.Set{
		Table: t, Name: "names_" + strings.ReplaceAll(addr.String(), ".", "_"),
		KeyType: nftables.TypeIPAddr, HasTimeout: true,
	}
}

// deniedSet is the name of the set of addresses the Resolver learned from
// names the policy of the sandbox at addr denies, e.g. "denied_10_88_0_2":
// closed to it even under egress all, so that a process that has the
// address from elsewhere gets no further than one that asks the name.
func deniedSet(t *nftables.Table, addr netip.Addr) *nftables.Set {
	return &nftables.Set{
		Table: t, Name: "denied_" + strings.ReplaceAll(addr.String(), ".", "_"),
		KeyType: nftables.TypeIPAddr, HasTimeout: true,
	}
}

// hostChain is the name of the chain that holds the addresses of the host
// that the allow rules of the sandbox at addr open, e.g. "host_10_88_0_2".
func hostChain(addr netip.Addr) string {
	return "host_" + strings.ReplaceAll(addr.String(), ".", "_")
}

// hostMap is the verdict map from a sandbox's address to the jump to its
// host chain.
const hostMap = "host_policies"

// Learned are the addresses the Resolver learned from host names for one
// sandbox, each with how long it stays open (Allow) or closed (Deny). A
// policy change takes them over in the same transaction, so an address of
// a name the new policy still allows never closes for a moment.
type Learned struct {
	Allow, Deny map[netip.Addr]time.Duration
	// Keep leaves the addresses the sets hold as they are (Allow and Deny
	// are added): the Resolver has learned nothing of the sandbox, as
	// after a daemon's restart, so what the firewall kept is all there is.
	Keep bool
}

// policyChain is the name of the chain that holds the policy of the sandbox
// at addr, e.g. "sb_10_88_0_2".
func policyChain(addr netip.Addr) string {
	return "sb_" + strings.ReplaceAll(addr.String(), ".", "_")
}

// SetPolicy gives the sandbox at addr (its SandboxIP) policy p, replacing
// the one it had, in one netlink transaction: no packet ever sees half a
// policy. The rules match every packet the sandbox sends, not only those
// that open a connection, so a connection the new policy forbids stops
// carrying data at once. The addresses in learned (the Resolver's, judged
// under p) are opened or closed in the same transaction. The table must
// be installed.
//
// An allow rule opens exactly what it names, the host's own addresses and
// other sandboxes' included: nothing else does (egress all, names), so a
// sandbox reaches the daemon's API or another sandbox only when its owner
// wrote that address down.
func (f *Firewall) SetPolicy(ctx context.Context, addr netip.Addr, p Policy, learned Learned) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("setting policy of %s: %w", addr, err)
	}
	if err := p.Check(); err != nil {
		return fmt.Errorf("setting policy of %s: %w", addr, err)
	}
	if !f.subnet.Contains(addr) {
		return fmt.Errorf("setting policy of %s: not in subnet %s", addr, f.subnet)
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("setting policy of %s: %w", addr, err)
	}
	t := &nftables.Table{Name: f.table, Family: nftables.TableFamilyIPv4}
	ch := c.AddChain(&nftables.Chain{Name: policyChain(addr), Table: t})
	c.FlushChain(ch)
	host := c.AddChain(&nftables.Chain{Name: hostChain(addr), Table: t})
	c.FlushChain(host)
	rule := func(ch *nftables.Chain, comment string, exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		c.AddRule(&nftables.Rule{
			Table: t, Chain: ch, Exprs: all,
			UserData: userdata.AppendString(nil, userdata.TypeComment, comment),
		})
	}
	// Replies only: the connection was opened by another sandbox whose
	// allow rule names this one, and passed that sandbox's chain.
	rule(ch, "replies to connections another sandbox's allow rule opened",
		matchPrefix(ipDaddr, f.subnet),
		[]expr.Any{
			&expr.Ct{Register: 1, Key: expr.CtKeyDIRECTION},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{ctDirReply}},
		}, verdict(expr.VerdictAccept))
	// Addresses of allowed names: a connection opened to one is marked
	// with this policy's generation and carries on after the address's
	// timeout, until the policy changes.
	names := namesSet(t, addr)
	denied := deniedSet(t, addr)
	for _, set := range []*nftables.Set{names, denied} {
		if err := c.AddSet(set, nil); err != nil {
			return fmt.Errorf("setting policy of %s: %w", addr, err)
		}
		if !learned.Keep {
			c.FlushSet(set)
		}
	}
	for set, elems := range map[*nftables.Set]map[netip.Addr]time.Duration{names: learned.Allow, denied: learned.Deny} {
		if els := f.elements(elems); len(els) > 0 {
			if err := c.SetAddElements(set, els); err != nil {
				return fmt.Errorf("setting policy of %s: %w", addr, err)
			}
		}
	}
	gen := p.generation(addr)
	rule(ch, "connections opened to allowed names under this policy",
		[]expr.Any{
			&expr.Ct{Register: 1, Key: expr.CtKeyMARK},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: gen},
		}, verdict(expr.VerdictAccept))
	rule(ch, "addresses of allowed names",
		[]expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ipDaddr, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: names.Name, SetID: names.ID},
			&expr.Immediate{Register: 1, Data: gen},
			&expr.Ct{Register: 1, Key: expr.CtKeyMARK, SourceRegister: true},
		}, verdict(expr.VerdictAccept))
	for _, pf := range p.Allow {
		rule(ch, "allow "+pf.String(), matchPrefix(ipDaddr, pf), verdict(expr.VerdictAccept))
		rule(host, "allow "+pf.String(), matchPrefix(ipDaddr, pf), verdict(expr.VerdictAccept))
	}
	rule(ch, "no other sandbox", matchPrefix(ipDaddr, f.subnet), verdict(expr.VerdictDrop))
	for _, pf := range p.Deny {
		rule(ch, "deny "+pf.String(), matchPrefix(ipDaddr, pf), verdict(expr.VerdictDrop))
	}
	rule(ch, "addresses of denied names",
		[]expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ipDaddr, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: denied.Name, SetID: denied.ID},
		}, verdict(expr.VerdictDrop))
	def := expr.VerdictAccept
	if p.Egress == EgressNone {
		def = expr.VerdictDrop
	}
	rule(ch, "egress "+string(p.Egress), verdict(def))

	key := addr.As4()
	for m, chain := range map[*nftables.Set]string{policiesSet(t): ch.Name, hostSet(t): host.Name} {
		if err := c.SetAddElements(m, []nftables.SetElement{{
			Key: key[:], VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chain},
		}}); err != nil {
			return fmt.Errorf("setting policy of %s: %w", addr, err)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("setting policy of %s: %w", addr, err)
	}
	return nil
}

// ctDirReply is conntrack's direction of replies (IP_CT_DIR_REPLY).
const ctDirReply = 1

// elements are the set elements of addresses with their timeouts, leaving
// out what no name may open or close: the subnet and any address that is
// not IPv4. A timeout under a second is a second (nftables counts in ms;
// zero would mean never).
func (f *Firewall) elements(addrs map[netip.Addr]time.Duration) []nftables.SetElement {
	var out []nftables.SetElement
	for ip, ttl := range addrs {
		if !ip.Is4() || f.subnet.Contains(ip) {
			continue
		}
		k := ip.As4()
		out = append(out, nftables.SetElement{Key: k[:], Timeout: max(ttl, time.Second)})
	}
	return out
}

// RemovePolicy takes the policy of the sandbox at addr away, which leaves it
// no egress at all. Removing a policy that is not there is no error.
func (f *Firewall) RemovePolicy(ctx context.Context, addr netip.Addr) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("removing policy of %s: %w", addr, err)
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("removing policy of %s: %w", addr, err)
	}
	t := &nftables.Table{Name: f.table, Family: nftables.TableFamilyIPv4}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return fmt.Errorf("removing policy of %s: %w", addr, err)
	}
	found := false
	for _, ch := range chains {
		if ch.Table.Name == f.table && ch.Name == policyChain(addr) {
			found = true
		}
	}
	if !found {
		return nil
	}
	key := addr.As4()
	// The elements go first, in the same batch, since a chain that is
	// jumped to cannot be deleted.
	for _, m := range []*nftables.Set{policiesSet(t), hostSet(t)} {
		if err := c.SetDeleteElements(m, []nftables.SetElement{{Key: key[:]}}); err != nil {
			return fmt.Errorf("removing policy of %s: %w", addr, err)
		}
	}
	for _, name := range []string{policyChain(addr), hostChain(addr)} {
		ch := &nftables.Chain{Name: name, Table: t}
		c.FlushChain(ch)
		c.DelChain(ch)
	}
	c.DelSet(namesSet(t, addr))
	c.DelSet(deniedSet(t, addr))
	if err := c.Flush(); err != nil {
		return fmt.Errorf("removing policy of %s: %w", addr, err)
	}
	return nil
}

// hostSet is the verdict map of table t to the sandboxes' host chains.
func hostSet(t *nftables.Table) *nftables.Set {
	return &nftables.Set{
		Table: t, Name: hostMap, IsMap: true,
		KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict,
	}
}

// policiesSet is the verdict map of table t.
func policiesSet(t *nftables.Table) *nftables.Set {
	return &nftables.Set{
		Table: t, Name: policiesMap, IsMap: true,
		KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict,
	}
}

// Resolved opens (or, with deny, closes) addrs to the sandbox at addr, each
// for its duration: the Resolver calls it with the addresses of a name the
// sandbox's policy allows (denies), before it answers. An address already
// there takes the new duration: it is added, deleted and added again in
// one transaction, since adding an element that exists leaves its timeout
// as it was, and deleting one that does not fails the batch.
func (f *Firewall) Resolved(ctx context.Context, addr netip.Addr, addrs map[netip.Addr]time.Duration, deny bool) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("adding resolved addresses for %s: %w", addr, err)
	}
	elems := f.elements(addrs)
	if len(elems) == 0 {
		return nil
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("adding resolved addresses for %s: %w", addr, err)
	}
	t := &nftables.Table{Name: f.table, Family: nftables.TableFamilyIPv4}
	set := namesSet(t, addr)
	if deny {
		set = deniedSet(t, addr)
	}
	keys := make([]nftables.SetElement, len(elems))
	for i, e := range elems {
		keys[i] = nftables.SetElement{Key: e.Key}
	}
	for _, step := range []func() error{
		func() error { return c.SetAddElements(set, keys) },
		func() error { return c.SetDeleteElements(set, keys) },
		func() error { return c.SetAddElements(set, elems) },
	} {
		if err := step(); err != nil {
			return fmt.Errorf("adding resolved addresses for %s: %w", addr, err)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("adding resolved addresses for %s: %w", addr, err)
	}
	return nil
}

// SetPolicy gives the sandbox at ep policy p in the firewall of m's subnet
// (see Firewall.SetPolicy) and, with a Resolver, its name policy.
func (m *Manager) SetPolicy(ctx context.Context, ep Endpoint, p Policy) error {
	fw := func(l Learned) error { return m.Firewall().SetPolicy(ctx, ep.SandboxIP, p, l) }
	if m.resolver == nil {
		return fw(Learned{})
	}
	listenErr, err := m.resolver.setPolicy(ep, p, fw)
	if listenErr {
		// The sandbox runs on without DNS (its addresses rules hold)
		// rather than not at all: the next SetPolicy tries again. On a
		// host where something else holds port 53 on every address,
		// this is where it shows.
		m.cfg.Log.Error("sandbox resolver not listening", "host_ip", ep.HostIP, "err", err)
		return nil
	}
	return err
}

// RemovePolicy takes the policy of the sandbox at ep away (see
// Firewall.RemovePolicy) and stops its resolver.
func (m *Manager) RemovePolicy(ctx context.Context, ep Endpoint) error {
	if m.resolver != nil {
		m.resolver.Remove(ep)
	}
	return m.Firewall().RemovePolicy(ctx, ep.SandboxIP)
}

// EnableForwarding turns IPv4 forwarding on in the calling thread's network
// namespace (the host's, for the daemon), without which no sandbox has
// egress. Install the firewall first: its forward chain drops whatever a
// sandbox sends until the sandbox has a policy. Forwarding of packets that
// are not the sandboxes' is left to the host's own rules.
func EnableForwarding() error {
	const path = "/proc/sys/net/ipv4/ip_forward"
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("enabling IPv4 forwarding: %w", err)
	}
	if strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	if err := os.WriteFile(path, []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("enabling IPv4 forwarding: %w", err)
	}
	return nil
}

// PrunePolicies removes the policy chains, maps' elements and sets of every
// sandbox address in the table that keep does not hold: what a crash left
// of sandboxes that are gone, since Install keeps what it finds.
func (f *Firewall) PrunePolicies(ctx context.Context, keep map[netip.Addr]bool) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("pruning firewall policies: %w", err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return fmt.Errorf("pruning firewall policies: %w", err)
	}
	var errs []error
	for _, ch := range chains {
		rest, ok := strings.CutPrefix(ch.Name, "sb_")
		if ch.Table.Name != f.table || !ok {
			continue
		}
		addr, err := netip.ParseAddr(strings.ReplaceAll(rest, "_", "."))
		if err != nil || keep[addr] {
			continue
		}
		slog.InfoContext(ctx, "removing the firewall policy of a sandbox that is gone", "table", f.table, "address", addr)
		errs = append(errs, f.RemovePolicy(ctx, addr))
	}
	return errors.Join(errs...)
}

// PrunePolicies removes the firewall policies of every sandbox address but
// those of keep (see Firewall.PrunePolicies).
func (m *Manager) PrunePolicies(ctx context.Context, keep []Endpoint) error {
	addrs := map[netip.Addr]bool{}
	for _, ep := range keep {
		addrs[ep.SandboxIP] = true
	}
	return m.Firewall().PrunePolicies(ctx, addrs)
}
