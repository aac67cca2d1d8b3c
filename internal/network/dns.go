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

// refreshEvery is how often the resolver looks up again the exact names of
// the policies it holds, and refreshAhead how long before its addresses
// time out a name is looked up again: the addresses of a name a policy
// names stay known, so a process that has one from elsewhere (a cache, a
// fork's memory, a hard-coded address) meets the same rule as one that
// asks the name.
const (
	refreshEvery = 20 * time.Second
	refreshAhead = 30 * time.Second
)

// maxLearned bounds how many names the resolver remembers per sandbox: a
// sandbox asking endless names below an allowed *.pattern fills no more.
const maxLearned = 4096

// Resolver is the DNS server the daemon runs for its sandboxes. It
// listens on each sandbox's host address (UDP and TCP port 53), knows the
// asking sandbox by its source address, and applies that sandbox's name
// policy: a name the policy refuses gets NXDOMAIN; a name the allow list
// names is forwarded to the upstream servers, and the IPv4 addresses of
// the answer are opened in the firewall for that sandbox before the answer
// goes back. Any other name is forwarded under egress all and refused
// under egress none. The addresses of denied names are closed in the
// firewall too, under egress all: the resolver looks a denied name up
// itself when a sandbox asks it, and looks up every exact name of a
// policy (allowed or denied) when the policy is set and again before its
// addresses time out. It is safe for concurrent use.
type Resolver struct {
	fw        *Firewall
	upstreams []string // host:port
	log       *slog.Logger
	kick      chan struct{}
	stop      chan struct{}
	stopOnce  sync.Once

	// apply serializes changes of the firewall's name sets: a policy
	// change (learned, then the firewall's transaction) never interleaves
	// with an answer judged under the old policy.
	apply sync.Mutex

	mu        sync.Mutex
	sandboxes map[netip.Addr]*named   // by sandbox address
	listeners map[netip.Addr][]closer // by host address
}

// named is what the resolver holds for one sandbox.
type named struct {
	policy Policy
	// names are the names it learned addresses of, asked by the sandbox
	// or looked up for its policy.
	names map[string]learnedName
}

// learnedName is one name's IPv4 addresses and until when they count.
type learnedName struct {
	addrs []netip.Addr
	until time.Time
}

type closer interface{ Shutdown() error }

// NewResolver makes a resolver that forwards to upstreams (host:port; a
// host without a port gets 53) and opens resolved addresses in fw. It
// listens nowhere until Set; Close stops it.
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
	r := &Resolver{
		fw: fw, upstreams: ups, log: log,
		kick: make(chan struct{}, 1), stop: make(chan struct{}),
		sandboxes: map[netip.Addr]*named{},
		listeners: map[netip.Addr][]closer{},
	}
	go r.refresh()
	return r, nil
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

// setPolicy gives the sandbox at ep name policy p: it calls fw with the
// addresses the resolver learned for the sandbox, judged under p, for the
// firewall's transaction, and once that succeeded holds p for the
// sandbox's queries, makes sure it listens on ep's host address, and looks
// up p's exact names. An error of fw is returned as it is; the listener's
// is returned with listenErr set, after the policy took effect.
func (r *Resolver) setPolicy(ep Endpoint, p Policy, fw func(Learned) error) (listenErr bool, err error) {
	r.apply.Lock()
	defer r.apply.Unlock()
	if err := fw(r.learned(ep.SandboxIP, p)); err != nil {
		return false, err
	}
	if err := r.Set(ep, p); err != nil {
		return true, err
	}
	return false, nil
}

// Set gives the sandbox at ep name policy p and makes sure the resolver
// listens on ep's host address. The firewall's sets are the caller's
// business (see Manager.SetPolicy).
func (r *Resolver) Set(ep Endpoint, p Policy) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := r.sandboxes[ep.SandboxIP]; n != nil {
		n.policy = p
	} else {
		r.sandboxes[ep.SandboxIP] = &named{policy: p, names: map[string]learnedName{}}
	}
	select {
	case r.kick <- struct{}{}:
	default:
	}
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

// learned are the addresses the resolver knows for the sandbox at addr,
// judged under p: those of names p allows, to open, and of names p
// denies, to close; each for the time left of its longest-lived name. Of
// a sandbox it does not know (a restarted daemon's first SetPolicy, or a
// new sandbox), the firewall keeps what it has.
func (r *Resolver) learned(addr netip.Addr, p Policy) Learned {
	l := Learned{Allow: map[netip.Addr]time.Duration{}, Deny: map[netip.Addr]time.Duration{}}
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.sandboxes[addr]
	if n == nil {
		l.Keep = true
		return l
	}
	now := time.Now()
	for name, ln := range n.names {
		var into map[netip.Addr]time.Duration
		switch judge(p, name) {
		case nameAllowed:
			into = l.Allow
		case nameDenied:
			into = l.Deny
		default:
			continue
		}
		if left := ln.until.Sub(now); left > 0 {
			for _, ip := range ln.addrs {
				into[ip] = max(into[ip], left)
			}
		}
	}
	return l
}

// record remembers name's addresses for the sandbox at addr for ttl, and
// returns them each with the time left of its longest-lived name (another
// name may have the same address for longer). Expired names are dropped
// first; past maxLearned names, a new one is not remembered (its
// addresses are still opened or closed now).
func (r *Resolver) record(addr netip.Addr, name string, ips []netip.Addr, ttl time.Duration) map[netip.Addr]time.Duration {
	out := map[netip.Addr]time.Duration{}
	for _, ip := range ips {
		out[ip] = ttl
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.sandboxes[addr]
	if n == nil {
		return out
	}
	now := time.Now()
	if _, ok := n.names[name]; !ok && len(n.names) >= maxLearned {
		for k, ln := range n.names {
			if !ln.until.After(now) {
				delete(n.names, k)
			}
		}
	}
	if _, ok := n.names[name]; ok || len(n.names) < maxLearned {
		n.names[name] = learnedName{addrs: ips, until: now.Add(ttl)}
	}
	for _, ln := range n.names {
		left := ln.until.Sub(now)
		for _, ip := range ln.addrs {
			if d, ok := out[ip]; ok && left > d {
				out[ip] = left
			}
		}
	}
	return out
}

// Remove forgets the sandbox at ep and stops listening on its host address.
func (r *Resolver) Remove(ep Endpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.sandboxes, ep.SandboxIP)
	for _, s := range r.listeners[ep.HostIP] {
		_ = s.Shutdown()
	}
	delete(r.listeners, ep.HostIP)
}

// Close stops every listener and the refreshing of names.
func (r *Resolver) Close() error {
	r.stopOnce.Do(func() { close(r.stop) })
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
	nameRefused   nameVerdict = iota // NXDOMAIN (egress none, not allowed)
	nameForwarded                    // forwarded as it is
	nameAllowed                      // forwarded, and its addresses opened
	nameDenied                       // NXDOMAIN, and its addresses closed
)

// judge applies p to name (lower case, no trailing dot).
func judge(p Policy, name string) nameVerdict {
	switch {
	case matchNames(p.AllowNames, name):
		return nameAllowed
	case matchNames(p.DenyNames, name):
		return nameDenied
	case p.Egress == EgressNone:
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

// policyOf is the policy the resolver holds for the sandbox at addr.
func (r *Resolver) policyOf(addr netip.Addr) (Policy, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.sandboxes[addr]
	if n == nil {
		return Policy{}, false
	}
	return n.policy, true
}

// serve answers one query from a sandbox.
func (r *Resolver) serve(w dns.ResponseWriter, q *dns.Msg) {
	from, ok := addrOf(w.RemoteAddr())
	p, known := r.policyOf(from)
	if !ok || !known || len(q.Question) != 1 {
		m := new(dns.Msg)
		m.SetRcode(q, dns.RcodeRefused)
		_ = w.WriteMsg(m)
		return
	}
	name := strings.ToLower(strings.TrimSuffix(q.Question[0].Name, "."))
	switch judge(p, name) {
	case nameRefused:
		m := new(dns.Msg)
		m.SetRcode(q, dns.RcodeNameError)
		_ = w.WriteMsg(m)
		return
	case nameDenied:
		// The name's addresses are closed before the sandbox hears that
		// there is no such name: it may have them from elsewhere.
		r.resolveAndApply(from, name)
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
	if ips, ttl := answerA(resp); len(ips) > 0 {
		if err := r.applyName(from, name, ips, ttl); err != nil {
			r.log.Error("opening resolved addresses", "sandbox_ip", from, "name", name, "err", err)
			m := new(dns.Msg)
			m.SetRcode(q, dns.RcodeServerFailure)
			_ = w.WriteMsg(m)
			return
		}
	}
	resp.Id = q.Id
	_ = w.WriteMsg(resp)
}

// applyName records the addresses of name for the sandbox at from and
// opens or closes them as its policy, looked at again now, says: a policy
// that changed since the query was judged has the last word. A name the
// policy neither allows nor denies is left alone.
func (r *Resolver) applyName(from netip.Addr, name string, ips []netip.Addr, ttl time.Duration) error {
	r.apply.Lock()
	defer r.apply.Unlock()
	p, ok := r.policyOf(from)
	if !ok {
		return nil
	}
	v := judge(p, name)
	if v != nameAllowed && v != nameDenied {
		return nil
	}
	addrs := r.record(from, name, ips, ttl)
	ctx, cancel := context.WithTimeout(context.Background(), upstreamTimeout)
	defer cancel()
	return r.fw.Resolved(ctx, from, addrs, v == nameDenied)
}

// resolveAndApply looks name up (A records) and applies its addresses for
// the sandbox at from; failures are logged: the name stays as closed or
// open as it was.
func (r *Resolver) resolveAndApply(from netip.Addr, name string) {
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	resp, err := r.forward(q, "udp")
	if err != nil {
		r.log.Debug("DNS lookup for a policy failed", "name", name, "err", err)
		return
	}
	if ips, ttl := answerA(resp); len(ips) > 0 {
		if err := r.applyName(from, name, ips, ttl); err != nil {
			r.log.Error("applying resolved addresses", "sandbox_ip", from, "name", name, "err", err)
		}
	}
}

// answerA are the IPv4 addresses of an answer and how long they are good
// for: the longest TTL among them, and at least minNameTTL.
func answerA(resp *dns.Msg) ([]netip.Addr, time.Duration) {
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
	return ips, ttl
}

// refresh looks up the exact names of every policy whose addresses are
// unknown or about to time out, every refreshEvery and whenever a policy
// is set, until Close.
func (r *Resolver) refresh() {
	t := time.NewTicker(refreshEvery)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		case <-r.kick:
		}
		type job struct {
			sandbox netip.Addr
			name    string
		}
		var jobs []job
		now := time.Now()
		r.mu.Lock()
		for addr, n := range r.sandboxes {
			for _, list := range [][]string{n.policy.AllowNames, n.policy.DenyNames} {
				for _, name := range list {
					if strings.HasPrefix(name, "*.") {
						continue // no way to list the names below
					}
					if ln, ok := n.names[name]; !ok || ln.until.Sub(now) < refreshAhead {
						jobs = append(jobs, job{addr, name})
					}
				}
			}
		}
		r.mu.Unlock()
		for _, j := range jobs {
			select {
			case <-r.stop:
				return
			default:
			}
			r.resolveAndApply(j.sandbox, j.name)
		}
	}
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
