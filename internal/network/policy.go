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
// each other and from the host. Its rules match the subnet, not the
// sandboxes, so they need no change when sandboxes come and go, and they
// outlive the daemon: sandboxes keep running while it restarts.
//
// The table (family ip, since sandboxes have only IPv4 addresses) holds:
//
//   - chain forward, hook forward: every packet from the subnet is dropped
//     (sandboxes have no egress yet, so nothing of theirs is ever routed;
//     this is what keeps one sandbox off another's agent on a host with IP
//     forwarding on), and every packet to the subnet that is not part of a
//     connection already tracked (so nothing routed from elsewhere reaches
//     a sandbox either).
//   - chain input, hook input: from the subnet, replies to connections the
//     host opened (the daemon talking to agents) and new TCP connections to
//     InsidePort on an address in the subnet (the in-sandbox API on each
//     HostIP) are accepted; everything else from the subnet is dropped, so
//     sandboxes reach neither the daemon's main API nor anything else that
//     listens on the host.
//
// Both chains accept by policy: the table only ever takes away, and leaves
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
// the calling thread (the host's, for the daemon), replacing whatever table
// of that name is there. The old table is deleted and the new one added in
// one netlink batch, which the kernel applies as one transaction: running
// Install again (a restarted daemon) neither duplicates rules nor leaves a
// moment without them.
func (f *Firewall) Install(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("installing firewall %s: %w", f.table, err)
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("installing firewall %s: %w", f.table, err)
	}
	t := f.replace(c)
	f.addRules(c, t)
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

// addRules queues the table, its chains and their rules (see Firewall).
func (f *Firewall) addRules(c *nftables.Conn, t *nftables.Table) {
	accept := nftables.ChainPolicyAccept
	c.AddTable(t)
	fwd := c.AddChain(&nftables.Chain{
		Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept,
	})
	in := c.AddChain(&nftables.Chain{
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

	rule(fwd, "sandboxes have no egress, and reach no other sandbox",
		matchPrefix(ipSaddr, f.subnet), verdict(expr.VerdictDrop))
	rule(fwd, "nothing routed reaches a sandbox unless tracked",
		matchPrefix(ipDaddr, f.subnet), matchTracked(false), verdict(expr.VerdictDrop))

	rule(in, "replies to the host's connections into sandboxes",
		matchPrefix(ipSaddr, f.subnet), matchTracked(true), verdict(expr.VerdictAccept))
	rule(in, "the in-sandbox API on each sandbox's host address",
		matchPrefix(ipSaddr, f.subnet), matchPrefix(ipDaddr, f.subnet), matchTCPDport(f.port), verdict(expr.VerdictAccept))
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
func matchTCPDport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

func verdict(k expr.VerdictKind) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: k}}
}
