package network

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// DefaultInsidePort is the TCP port of the in-sandbox API on each sandbox's
// host address (Endpoint.HostIP).
const DefaultInsidePort = 7072

// maxTableName is the longest nftables table name the kernel accepts
// (NFT_NAME_MAXLEN - 1).
const maxTableName = 255

// TableName is the default name of the firewall's table for subnet, e.g.
// "loam_10_88_0_0_16": one table per subnet, so that daemons with different
// subnets (tests run several at once) never touch each other's rules.
func TableName(subnet netip.Prefix) string {
	return "loam_" + strings.NewReplacer(".", "_", "/", "_").Replace(subnet.Masked().String())
}

// Firewall is the nftables table that keeps the daemon's sandboxes from
// each other and from the host, and gives each the egress its policy
// allows. Its base rules match the subnet; each sandbox adds its own chain
// with SetPolicy. The table outlives the daemon: sandboxes keep running
// while it restarts, and Install (which starts from an empty table) must be
// followed by SetPolicy for each of them.
//
// The table (family ip, since sandboxes have only IPv4 addresses) holds:
//
//   - chain forward, hook forward: every packet to the subnet from
//     elsewhere that is not part of a connection already tracked is
//     dropped (nothing routed from elsewhere reaches a sandbox); every
//     packet from the subnet jumps, through the verdict map "policies"
//     keyed by the sandbox's address, to that sandbox's chain sb_<address>
//     (see SetPolicy), which drops the subnet (no sandbox reaches another
//     unless its allow rules name it) and applies the sandbox's allow,
//     deny and egress default; a sandbox without a policy has no egress at
//     all.
//   - chain postrouting, hook postrouting (nat): what leaves the subnet is
//     masqueraded to the host's address on the way out.
//   - chain prerouting, hook prerouting (nat): DNS (UDP and TCP port 53)
//     from the subnet to ResolverAddr is redirected to the sandbox's host
//     address, where the Resolver listens.
//   - chain input, hook input: from the subnet, replies to connections the
//     host opened (the daemon talking to agents), new TCP connections to
//     InsidePort on the sandbox's own HostIP (its in-sandbox API; another
//     sandbox's is dropped) and DNS to port 53 there (the Resolver) are
//     accepted, and so
//     are the host's addresses the sandbox's allow rules name (its chain
//     host_<address>, through the verdict map "host_policies");
//     everything else from the subnet is dropped, so sandboxes reach
//     neither the daemon's main API nor anything else that listens on the
//     host unless their owner wrote that address into an allow rule.
//
// All chains accept by policy: the table only ever takes away, and leaves
// every packet that is not the subnet's to the host's own rules.
type Firewall struct {
	table  string
	subnet netip.Prefix
	port   uint16
}

// Firewall returns the firewall of m's subnet. It touches nothing until
// Install or Remove.
func (m *Manager) Firewall() *Firewall {
	return &Firewall{table: m.cfg.FirewallTable, subnet: m.cfg.Subnet, port: m.cfg.InsidePort}
}

// Table is the name of the firewall's nftables table (family ip).
func (f *Firewall) Table() string { return f.table }

// Install puts the firewall's table in place in the network namespace of
// the calling thread (the host's, for the daemon). When the table is there
// already (a restarted daemon), its base chains are flushed and filled
// anew and its sandboxes' chains, maps and sets are kept, in one netlink
// batch, which the kernel applies as one transaction: the sandboxes that
// ran on while the daemon was down keep their egress, and the addresses
// their names opened, without a gap. (PrunePolicies then removes those of
// sandboxes that are gone.) When that fails, as on a table an older
// version made differently, the table is replaced as a whole: deleted and
// added in one batch, so running Install again neither duplicates rules
// nor leaves a moment without them.
func (f *Firewall) Install(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("installing firewall %s: %w", f.table, err)
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("installing firewall %s: %w", f.table, err)
	}
	t := &nftables.Table{Name: f.table, Family: nftables.TableFamilyIPv4}
	if found, err := c.ListTableOfFamily(f.table, nftables.TableFamilyIPv4); err == nil && found != nil {
		f.addRules(c, t, true)
		if err := c.Flush(); err == nil {
			return nil
		}
	}
	// A batch that failed is gone with its connection: start afresh.
	if c, err = nftables.New(); err != nil {
		return fmt.Errorf("installing firewall %s: %w", f.table, err)
	}
	t = f.replace(c)
	f.addRules(c, t, false)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing firewall %s: %w", f.table, err)
	}
	return nil
}

// Remove deletes the firewall's table, if there is one, in the network
// namespace of the calling thread. The daemon does not call it when it
// stops, since its sandboxes go on running.
func (f *Firewall) Remove(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("removing firewall %s: %w", f.table, err)
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("removing firewall %s: %w", f.table, err)
	}
	f.replace(c)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("removing firewall %s: %w", f.table, err)
	}
	return nil
}

// replace queues the deletion of the table whether or not it exists:
// adding a table that exists is no error, so adding it and then deleting it
// always succeeds and leaves none. It returns the table to add anew.
func (f *Firewall) replace(c *nftables.Conn) *nftables.Table {
	t := &nftables.Table{Name: f.table, Family: nftables.TableFamilyIPv4}
	c.AddTable(t)
	c.DelTable(t)
	return t
}

// addRules queues the table, its chains and their rules (see Firewall);
// with flush, the base chains may exist and are emptied first.
func (f *Firewall) addRules(c *nftables.Conn, t *nftables.Table, flush bool) {
	accept := nftables.ChainPolicyAccept
	c.AddTable(t)
	addChain := func(ch *nftables.Chain) *nftables.Chain {
		ch = c.AddChain(ch)
		if flush {
			c.FlushChain(ch)
		}
		return ch
	}
	fwd := addChain(&nftables.Chain{
		Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept,
	})
	in := addChain(&nftables.Chain{
		Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept,
	})
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

	nat := addChain(&nftables.Chain{
		Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept,
	})
	policies, hosts := policiesSet(t), hostSet(t)
	// AddSet fails only on a set it cannot describe, and these are fixed.
	for _, m := range []*nftables.Set{policies, hosts} {
		if err := c.AddSet(m, nil); err != nil {
			panic(fmt.Sprintf("firewall: verdict map: %v", err))
		}
	}
	// From another sandbox, the sender's chain decides (its allow rules).
	rule(fwd, "nothing routed from elsewhere reaches a sandbox unless tracked",
		matchPrefix(ipDaddr, f.subnet), notPrefix(ipSaddr, f.subnet), matchTracked(false), verdict(expr.VerdictDrop))
	rule(fwd, "each sandbox's packets go through its policy chain",
		matchPrefix(ipSaddr, f.subnet),
		[]expr.Any{
			// matchPrefix left the masked address in the register.
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ipSaddr, Len: 4},
			&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: policies.Name, SetID: policies.ID},
		})
	rule(fwd, "a sandbox without a policy has no egress",
		matchPrefix(ipSaddr, f.subnet), verdict(expr.VerdictDrop))

	pre := addChain(&nftables.Chain{
		Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept,
	})
	resolver := netip.PrefixFrom(ResolverAddr, 32)
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		rule(pre, "DNS to the resolver address goes to the sandbox's host address",
			matchPrefix(ipSaddr, f.subnet), matchPrefix(ipDaddr, resolver), matchDport(proto, 53),
			[]expr.Any{&expr.Redir{}})
	}
	rule(nat, "sandboxes reach the outside from the host's address",
		matchPrefix(ipSaddr, f.subnet), notPrefix(ipDaddr, f.subnet), []expr.Any{&expr.Masq{}})

	rule(in, "replies to the host's connections into sandboxes",
		matchPrefix(ipSaddr, f.subnet), matchTracked(true), verdict(expr.VerdictAccept))
	rule(in, "the in-sandbox API on the sandbox's own host address",
		matchPrefix(ipSaddr, f.subnet), matchPrefix(ipDaddr, f.subnet), matchOwnHostAddr(), matchTCPDport(f.port), verdict(expr.VerdictAccept))
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		rule(in, "the resolver on the sandbox's own host address",
			matchPrefix(ipSaddr, f.subnet), matchPrefix(ipDaddr, f.subnet), matchOwnHostAddr(), matchDport(proto, 53), verdict(expr.VerdictAccept))
	}
	rule(in, "the host's addresses a sandbox's allow rules name",
		matchPrefix(ipSaddr, f.subnet),
		[]expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ipSaddr, Len: 4},
			&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: hosts.Name, SetID: hosts.ID},
		})
	rule(in, "nothing else on the host, the daemon's API included",
		matchPrefix(ipSaddr, f.subnet), verdict(expr.VerdictDrop))
}

// Offsets of the addresses in the IPv4 header.
const (
	ipSaddr = 12
	ipDaddr = 16
)

// matchPrefix matches packets whose IPv4 address at offset (ipSaddr or
// ipDaddr) is in p, as `ip saddr p` does.
func matchPrefix(offset uint32, p netip.Prefix) []expr.Any {
	mask := ipNet(p.Addr(), p.Bits()).Mask
	addr := p.Masked().Addr().As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr[:]},
	}
}

// notPrefix matches packets whose IPv4 address at offset is not in p.
func notPrefix(offset uint32, p netip.Prefix) []expr.Any {
	e := matchPrefix(offset, p)
	e[len(e)-1].(*expr.Cmp).Op = expr.CmpOpNeq
	return e
}

// matchTracked matches packets of a connection conntrack already knows
// (ct state established,related), or with tracked false those of no such
// connection.
func matchTracked(tracked bool) []expr.Any {
	op := expr.CmpOpNeq
	if !tracked {
		op = expr.CmpOpEq
	}
	zero := binaryutil.NativeEndian.PutUint32(0)
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{
			SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  zero,
		},
		&expr.Cmp{Op: op, Register: 1, Data: zero},
	}
}

// matchTCPDport matches TCP packets to port.
// matchOwnHostAddr matches packets to an address of the interface they came
// in on, as `fib daddr . iif type local` does: a sandbox's packets come in
// on the host end of its own veth, whose address is its host address, so a
// sandbox reaches its own in-sandbox API and resolver there, never another
// sandbox's.
func matchOwnHostAddr() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, FlagIIF: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

func matchTCPDport(port uint16) []expr.Any { return matchDport(unix.IPPROTO_TCP, port) }

// matchDport matches packets of protocol proto (TCP or UDP) to port.
func matchDport(proto byte, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

func verdict(k expr.VerdictKind) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: k}}
}
