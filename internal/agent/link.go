package agent

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
)

// The agent's token is bound to its sandbox's link. A memory fork starts
// with its source's memory, and so with its source's token until the daemon
// hands it its own; a token is therefore no proof that a request comes from
// the daemon. The daemon always reaches an agent from the host end of the
// sandbox's veth, an address on the link of the address the agent is
// reached at; a request routed from anywhere else (another sandbox, whose
// address is in another /30) is refused before its token is looked at. The
// rule is computed from the sandbox's addresses at each request, so it
// follows a sandbox that a fork or a restore moved to another /30.

// fromOwnLink reports whether r came over the sandbox's own link (see
// onLink), listing the sandbox's addresses only when it must.
func (h *handler) fromOwnLink(r *http.Request) bool {
	la, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr)
	if !ok {
		return false
	}
	remote, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	local := la.AddrPort().Addr()
	if isLoopback(local, remote.Addr()) {
		return true
	}
	prefixes, err := h.prefixes()
	if err != nil {
		h.log.Warn("refusing a request: cannot list the sandbox's addresses", "err", err)
		return false
	}
	if !onLink(local, remote.Addr(), prefixes) {
		h.log.Warn("refusing a request from off the sandbox's link", "remote", r.RemoteAddr, "local", la.String())
		return false
	}
	return true
}

// onLink reports whether the agent serves a connection from remote to
// local, given the prefixes configured on the sandbox's interfaces (each
// an interface address with its prefix length): when both are loopback
// addresses (the connection comes from inside the sandbox), or when remote
// is another address in the prefix of the interface address local (the
// host end of the sandbox's veth). Zones and IPv4-mapped forms are ignored.
func onLink(local, remote netip.Addr, prefixes []netip.Prefix) bool {
	local, remote = plain(local), plain(remote)
	if !local.IsValid() || !remote.IsValid() {
		return false
	}
	if isLoopback(local, remote) {
		return true
	}
	if local == remote {
		return false
	}
	for _, p := range prefixes {
		if plain(p.Addr()) == local && p.Masked().Contains(remote) {
			return true
		}
	}
	return false
}

func isLoopback(local, remote netip.Addr) bool {
	return plain(local).IsLoopback() && plain(remote).IsLoopback()
}

func plain(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

// interfacePrefixes lists the addresses of the sandbox's interfaces with
// their prefix lengths.
func interfacePrefixes() ([]netip.Prefix, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("listing interface addresses: %w", err)
	}
	var prefixes []netip.Prefix
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipn.IP)
		if !ok {
			continue
		}
		ones, _ := ipn.Mask.Size()
		ip = ip.Unmap()
		if ip.Is4() && ones > 32 { // an IPv4 address with a 16-byte mask
			ones -= 96
		}
		prefixes = append(prefixes, netip.PrefixFrom(ip, ones))
	}
	return prefixes, nil
}
