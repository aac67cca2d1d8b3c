package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// ResolverAddr is the address every sandbox's /etc/resolv.conf names. It
// is no address of the host's: the firewall redirects DNS to it (UDP and
// TCP port 53) from each sandbox to that sandbox's own host address, where
// the Resolver listens. One fixed address means a sandbox's disk never
// names its own slot, so a fork or a restore into another slot resolves
// as well as its source did.
var ResolverAddr = netip.MustParseAddr("169.254.53.53")

// minNameTTL is the least time an address a name resolved to stays open to
// the sandbox that asked: clients cache answers for a while, whatever the
// TTL says.
const minNameTTL = time.Minute

// upstreamTimeout bounds one exchange with an upstream server.
const upstreamTimeout = 3 * time.Second

// Resolver is the DNS server the daemon runs for its sandboxes. It
// listens on each sandbox's host address (UDP and TCP port 53), knows the
// asking sandbox by its source address, and applies that sandbox's name
// policy: a name the policy refuses gets NXDOMAIN; a name the allow list
// names is forwarded to the upstream servers, and the IPv4 addresses of
// the answer are opened in the firewall for that sandbox before the answer
// goes back. Any other name is forwarded under egress all and refused
// under egress none. It is safe for concurrent use.
type Resolver struct {
	fw        *Firewall
	upstreams []string // host:port
	log       *slog.Logger

	mu        sync.Mutex
	policies  map[netip.Addr]Policy   // by sandbox address
	listeners map[netip.Addr][]closer // by host address
}

type closer interface{ Shutdown() error }

// NewResolver makes a resolver that forwards to upstreams (host:port; a
// host without a port gets 53) and opens resolved addresses in fw. It
// listens nowhere until Set.
func NewResolver(fw *Firewall, upstreams []string, log *slog.Logger) (*Resolver, error) {
	if len(upstreams) == 0 {
		return nil, errors.New("making DNS resolver: no upstream servers")
	}
	var ups []string
	for _, u := range upstreams {
		if _, _, err := net.SplitHostPort(u); err != nil {
			u = net.JoinHostPort(u, "53")
		}
		ups = append(ups, u)
	}
	return &Resolver{
		fw: fw, upstreams: ups, log: log,
		policies:  map[netip.Addr]Policy{},
		listeners: map[netip.Addr][]closer{},
	}, nil
}

// HostUpstreams reads the name servers of the host's /etc/resolv.conf.
func HostUpstreams() ([]string, error) {
	cfg, err := dns.ClientConfigFromFile("/etc/resolv.conf")
	if err != nil {
		return nil, fmt.Errorf("reading the host's name servers: %w", err)
	}
	var out []string
	for _, s := range cfg.Servers {
		out = append(out, net.JoinHostPort(s, cfg.Port))
	}
	return out, nil
}

// Set gives the sandbox at ep name policy p and makes sure the resolver
// listens on ep's host address.
func (r *Resolver) Set(ep Endpoint, p Policy) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.policies[ep.SandboxIP] = p
	if _, ok := r.listeners[ep.HostIP]; ok {
		return nil
	}
	addr := netip.AddrPortFrom(ep.HostIP, 53).String()
	var servers []closer
	for _, proto := range []string{"udp", "tcp"} {
		srv := &dns.Server{Addr: addr, Net: proto, Handler: dns.HandlerFunc(r.serve)}
		started := make(chan error, 1)
		srv.NotifyStartedFunc = func() { started <- nil }
		go func() {
			if err := srv.ListenAndServe(); err != nil {
				select {
				case started <- err:
				default:
				}
			}
		}()
		if err := <-started; err != nil {
			for _, s := range servers {
				_ = s.Shutdown()
			}
			return fmt.Errorf("starting DNS on %s/%s: %w", addr, proto, err)
		}
		servers = append(servers, srv)
	}
	r.listeners[ep.HostIP] = servers
	return nil
}

// Remove forgets the sandbox at ep and stops listening on its host address.
func (r *Resolver) Remove(ep Endpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.policies, ep.SandboxIP)
	for _, s := range r.listeners[ep.HostIP] {
		_ = s.Shutdown()
	}
	delete(r.listeners, ep.HostIP)
}

// Close stops every listener.
func (r *Resolver) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for h, ss := range r.listeners {
		for _, s := range ss {
			_ = s.Shutdown()
		}
		delete(r.listeners, h)
	}
	return nil
}

// verdict is what the resolver does with a name.
type nameVerdict int

const (
	nameRefused   nameVerdict = iota // NXDOMAIN
	nameForwarded                    // forwarded as it is
	nameAllowed                      // forwarded, and its addresses opened
)

// judge applies p to name (lower case, no trailing dot).
func judge(p Policy, name string) nameVerdict {
	if matchNames(p.AllowNames, name) {
		return nameAllowed
	}
	if matchNames(p.DenyNames, name) || p.Egress == EgressNone {
		return nameRefused
	}
	return nameForwarded
}

// matchNames tells whether name is one of patterns: a pattern is a name,
// or "*." and a name, which matches every name below it (not the name
// itself).
func matchNames(patterns []string, name string) bool {
	for _, p := range patterns {
		if suffix, ok := strings.CutPrefix(p, "*."); ok {
			if strings.HasSuffix(name, "."+suffix) {
				return true
			}
		} else if name == p {
			return true
		}
	}
	return false
}

// serve answers one query from a sandbox.
func (r *Resolver) serve(w dns.ResponseWriter, q *dns.Msg) {
	from, ok := addrOf(w.RemoteAddr())
	r.mu.Lock()
	p, known := r.policies[from]
	r.mu.Unlock()
	if !ok || !known || len(q.Question) != 1 {
		m := new(dns.Msg)
		m.SetRcode(q, dns.RcodeRefused)
		_ = w.WriteMsg(m)
		return
	}
	name := strings.ToLower(strings.TrimSuffix(q.Question[0].Name, "."))
	v := judge(p, name)
	if v == nameRefused {
		m := new(dns.Msg)
		m.SetRcode(q, dns.RcodeNameError)
		_ = w.WriteMsg(m)
		return
	}
	proto := "udp"
	if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
		proto = "tcp"
	}
	resp, err := r.forward(q, proto)
	if err != nil {
		r.log.Debug("DNS forward failed", "name", name, "err", err)
		m := new(dns.Msg)
		m.SetRcode(q, dns.RcodeServerFailure)
		_ = w.WriteMsg(m)
		return
	}
	if v == nameAllowed {
		var ips []netip.Addr
		ttl := minNameTTL
		for _, rr := range resp.Answer {
			if a, ok := rr.(*dns.A); ok {
				if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
					ips = append(ips, ip)
				}
				if t := time.Duration(a.Hdr.Ttl) * time.Second; t > ttl {
					ttl = t
				}
			}
		}
		if len(ips) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), upstreamTimeout)
			err := r.fw.AllowResolved(ctx, from, ips, ttl)
			cancel()
			if err != nil {
				r.log.Error("opening resolved addresses", "sandbox_ip", from, "name", name, "err", err)
				m := new(dns.Msg)
				m.SetRcode(q, dns.RcodeServerFailure)
				_ = w.WriteMsg(m)
				return
			}
		}
	}
	resp.Id = q.Id
	_ = w.WriteMsg(resp)
}

// forward asks the upstream servers in turn; a truncated UDP answer is
// asked again over TCP.
func (r *Resolver) forward(q *dns.Msg, proto string) (*dns.Msg, error) {
	var errs []error
	for _, up := range r.upstreams {
		c := &dns.Client{Net: proto, Timeout: upstreamTimeout}
		resp, _, err := c.Exchange(q, up)
		if err == nil && resp.Truncated && proto == "udp" {
			c.Net = "tcp"
			resp, _, err = c.Exchange(q, up)
		}
		if err == nil {
			return resp, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func addrOf(a net.Addr) (netip.Addr, bool) {
	switch a := a.(type) {
	case *net.UDPAddr:
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		return ip, ok
	case *net.TCPAddr:
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		return ip, ok
	}
	return netip.Addr{}, false
}
