package sandbox

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/network"
	"loam.dev/loam/internal/store"
)

// maxPolicyEntries bounds the allow and deny lists together: each entry is
// a rule every packet of the sandbox may pass through.
const maxPolicyEntries = 256

// checkNetwork validates a network policy from a client and returns it in
// its stored form: egress filled in, addresses as canonical prefixes, host
// names in lower case, lists never nil.
func checkNetwork(p api.NetworkPolicy) (api.NetworkPolicy, error) {
	out := api.NetworkPolicy{Egress: p.Egress, Allow: []string{}, Deny: []string{}}
	switch p.Egress {
	case "":
		out.Egress = api.EgressAll
	case api.EgressAll, api.EgressNone:
	default:
		return out, api.Errorf(api.CodeInvalid, "network.egress: %q is neither %q nor %q", p.Egress, api.EgressAll, api.EgressNone)
	}
	if len(p.Allow)+len(p.Deny) > maxPolicyEntries {
		return out, api.Errorf(api.CodeInvalid, "network: at most %d allow and deny entries in all", maxPolicyEntries)
	}
	for _, l := range []struct {
		name string
		in   []string
		out  *[]string
	}{{"allow", p.Allow, &out.Allow}, {"deny", p.Deny, &out.Deny}} {
		for _, e := range l.in {
			pf, name, err := parseEntry(e)
			if err != nil {
				return out, api.Errorf(api.CodeInvalid, "network.%s: %s", l.name, err)
			}
			if name != "" {
				*l.out = append(*l.out, name)
			} else {
				*l.out = append(*l.out, pf.String())
			}
		}
	}
	return out, nil
}

// parseEntry reads one allow or deny entry: an IPv4 address or prefix, or
// a host name or *.name pattern (returned in lower case, without a final
// dot).
func parseEntry(e string) (netip.Prefix, string, error) {
	if strings.Contains(e, "/") {
		pf, err := netip.ParsePrefix(e)
		if err != nil || !pf.Addr().Is4() {
			return netip.Prefix{}, "", fmt.Errorf("%q is not an IPv4 prefix (as 192.0.2.0/24)", e)
		}
		return pf.Masked(), "", nil
	}
	if a, err := netip.ParseAddr(e); err == nil {
		if !a.Is4() {
			return netip.Prefix{}, "", fmt.Errorf("%q: only IPv4 addresses are supported", e)
		}
		return netip.PrefixFrom(a, 32), "", nil
	}
	name := strings.TrimSuffix(strings.ToLower(e), ".")
	if !network.ValidNamePattern(name) || strings.Count(name, ".") == 0 {
		return netip.Prefix{}, "", fmt.Errorf("%q is neither an IPv4 address or prefix nor a host name (as pypi.org or *.example.com)", e)
	}
	if _, err := netip.ParseAddr(strings.TrimPrefix(name, "*.")); err == nil || isNumeric(name) {
		return netip.Prefix{}, "", fmt.Errorf("%q is not a valid IPv4 address", e)
	}
	return netip.Prefix{}, name, nil
}

// isNumeric tells whether a name is digits and dots only, a mistyped
// address rather than a host name.
func isNumeric(s string) bool {
	return strings.Trim(s, "0123456789.") == ""
}

// firewallPolicy is a stored policy as the firewall and the resolver
// enforce it: addresses and names apart. A stored policy was checked on its
// way in, so every entry parses.
func firewallPolicy(p api.NetworkPolicy) network.Policy {
	out := network.Policy{Egress: network.Egress(p.Egress)}
	if out.Egress != network.EgressNone {
		out.Egress = network.EgressAll
	}
	for _, e := range p.Allow {
		if pf, name, err := parseEntry(e); err == nil && name != "" {
			out.AllowNames = append(out.AllowNames, name)
		} else if err == nil {
			out.Allow = append(out.Allow, pf)
		}
	}
	for _, e := range p.Deny {
		if pf, name, err := parseEntry(e); err == nil && name != "" {
			out.DenyNames = append(out.DenyNames, name)
		} else if err == nil {
			out.Deny = append(out.Deny, pf)
		}
	}
	return out
}

// applyNetwork puts the sandbox's stored policy in the firewall.
func (m *Manager) applyNetwork(ctx context.Context, sb *store.Sandbox) error {
	ep, err := m.Endpoint(sb)
	if err != nil {
		return err
	}
	if err := m.nets.SetPolicy(ctx, ep, firewallPolicy(sb.Network)); err != nil {
		return fmt.Errorf("setting network policy: %w", err)
	}
	return nil
}

// SetNetwork changes a sandbox's network policy. A running sandbox gets it
// at once: the firewall checks every packet, so a connection the new policy
// forbids carries no more data.
func (m *Manager) SetNetwork(ctx context.Context, ref string, p api.NetworkPolicy) (*api.Sandbox, error) {
	p, err := checkNetwork(p)
	if err != nil {
		return nil, err
	}
	sb, end, err := m.claim(ctx, ref, opNetwork)
	if err != nil {
		return nil, err
	}
	defer end()
	old := sb.Network
	sb.Network = p
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		return nil, fmt.Errorf("setting network of %s: %w", sb.ID, err)
	}
	crash.Point("network.stored")
	if err := m.applyNetwork(ctx, sb); err != nil {
		sb.Network = old
		if uerr := m.store.UpdateSandbox(ctx, sb); uerr != nil {
			m.log.Error("putting back network policy", "sandbox", sb.ID, "err", uerr)
		}
		return nil, fmt.Errorf("setting network of %s: %w", sb.ID, err)
	}
	m.log.Info("network policy changed", "sandbox", sb.ID, "egress", p.Egress, "allow", len(p.Allow), "deny", len(p.Deny))
	return m.view(sb), nil
}
