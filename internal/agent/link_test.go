package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"loam.dev/loam/api"
)

// sandboxPrefixes are the interface addresses of a sandbox in slot 1 of
// 10.88.0.0/16: eth0 has 10.88.0.6/30 (its host end is 10.88.0.5) and a
// link-local IPv6 address, lo has the loopback addresses.
var sandboxPrefixes = []netip.Prefix{
	netip.MustParsePrefix("127.0.0.1/8"),
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("10.88.0.6/30"),
	netip.MustParsePrefix("fe80::2/64"),
}

func TestOnLink(t *testing.T) {
	// After a fork into slot 2, the same sandbox's memory runs at
	// 10.88.0.10/30, with its host end at 10.88.0.9.
	forked := []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8"), netip.MustParsePrefix("10.88.0.10/30")}
	tests := []struct {
		name          string
		local, remote string
		prefixes      []netip.Prefix
		want          bool
	}{
		{"the daemon, from the host end", "10.88.0.6", "10.88.0.5", sandboxPrefixes, true},
		{"another sandbox, routed by the host", "10.88.0.6", "10.88.0.2", sandboxPrefixes, false},
		{"another sandbox's host end", "10.88.0.6", "10.88.0.1", sandboxPrefixes, false},
		{"the world", "10.88.0.6", "192.0.2.7", sandboxPrefixes, false},
		{"the sandbox's own address", "10.88.0.6", "10.88.0.6", sandboxPrefixes, false},
		{"inside the sandbox over loopback", "127.0.0.1", "127.0.0.1", sandboxPrefixes, true},
		{"inside the sandbox over another loopback address", "127.0.0.2", "127.0.0.1", sandboxPrefixes, true},
		{"inside the sandbox over IPv6 loopback", "::1", "::1", sandboxPrefixes, true},
		{"loopback remote at eth0", "10.88.0.6", "127.0.0.1", sandboxPrefixes, false},
		{"loopback local from outside", "127.0.0.1", "10.88.0.5", sandboxPrefixes, false},
		{"IPv4-mapped forms", "::ffff:10.88.0.6", "::ffff:10.88.0.5", sandboxPrefixes, true},
		{"IPv6 link-local with zones", "fe80::2%eth0", "fe80::1%eth0", sandboxPrefixes, true},
		{"a local address on no interface", "10.88.0.14", "10.88.0.13", sandboxPrefixes, false},
		{"the broadcast address as local", "10.88.0.7", "10.88.0.5", sandboxPrefixes, false},
		{"no interface addresses", "10.88.0.6", "10.88.0.5", nil, false},
		{"after a fork, the new host end", "10.88.0.10", "10.88.0.9", forked, true},
		{"after a fork, the old host end", "10.88.0.10", "10.88.0.5", forked, false},
		{"after a fork, the source", "10.88.0.10", "10.88.0.6", forked, false},
		{"no local address", "", "10.88.0.5", sandboxPrefixes, false},
		{"no remote address", "10.88.0.6", "", sandboxPrefixes, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := onLink(parseAddr(t, tt.local), parseAddr(t, tt.remote), tt.prefixes); got != tt.want {
				t.Errorf("onLink(%s, %s, %v) = %v, want %v", tt.local, tt.remote, tt.prefixes, got, tt.want)
			}
		})
	}
}

func parseAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	if s == "" {
		return netip.Addr{}
	}
	return netip.MustParseAddr(s)
}

// TestServeRefusesOffLink checks that the handler refuses a request from
// off the sandbox's link before it looks at the token.
func TestServeRefusesOffLink(t *testing.T) {
	h := NewHandler(Config{Token: testToken, Logger: testLogger()}).(*handler)
	h.prefixes = func() ([]netip.Prefix, error) { return sandboxPrefixes, nil }
	const linkMsg, tokenMsg = "the agent serves only its sandbox's host", "missing or wrong agent token"
	agentAddr := &net.TCPAddr{IP: net.IPv4(10, 88, 0, 6), Port: DefaultPort}
	tests := []struct {
		name   string
		local  net.Addr // nil for none
		remote string
		token  string
		status int
		msg    string
	}{
		{"the daemon with the token", agentAddr, "10.88.0.5:40000", testToken, 200, ""},
		{"the daemon with a wrong token", agentAddr, "10.88.0.5:40000", "wrong", 401, tokenMsg},
		{"another sandbox with the token", agentAddr, "10.88.0.2:40000", testToken, 403, linkMsg},
		{"another sandbox without a token", agentAddr, "10.88.0.2:40000", "", 403, linkMsg},
		{"no local address", nil, "10.88.0.5:40000", testToken, 403, linkMsg},
		{"a local address that is not TCP", &net.UnixAddr{Name: "/x", Net: "unix"}, "10.88.0.5:40000", testToken, 403, linkMsg},
		{"an unparsable remote address", agentAddr, "somewhere", testToken, 403, linkMsg},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, msg := serveFrom(t, h, tt.local, tt.remote, tt.token)
			if status != tt.status || msg != tt.msg {
				t.Errorf("status %d %q, want %d %q", status, msg, tt.status, tt.msg)
			}
		})
	}

	// The sandbox's addresses cannot be listed: refused.
	h.prefixes = func() ([]netip.Prefix, error) { return nil, errors.New("no netlink") }
	if status, msg := serveFrom(t, h, agentAddr, "10.88.0.5:40000", testToken); status != 403 || msg != linkMsg {
		t.Errorf("without the sandbox's addresses: status %d %q, want 403 %q", status, msg, linkMsg)
	}
	// Loopback needs no listing.
	loop := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: DefaultPort}
	if status, msg := serveFrom(t, h, loop, "127.0.0.1:40000", testToken); status != 200 {
		t.Errorf("over loopback: status %d %q, want 200", status, msg)
	}
}

// serveFrom serves GET /healthz, as if it came from remote to local, and
// returns the status and the error's message if any.
func serveFrom(t *testing.T, h http.Handler, local net.Addr, remote, token string) (int, string) {
	t.Helper()
	r := httptest.NewRequest("GET", "/healthz", nil)
	if local != nil {
		r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, local))
	}
	r.RemoteAddr = remote
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code == 200 {
		return 200, ""
	}
	var e api.ErrorBody
	if err := json.NewDecoder(w.Body).Decode(&e); err != nil || e.Error == nil {
		t.Fatalf("status %d, body %q: want an error body", w.Code, w.Body.String())
	}
	if want := api.CodeForStatus(w.Code); e.Error.Code != want {
		t.Errorf("error code %s, want %s", e.Error.Code, want)
	}
	return w.Code, e.Error.Message
}

// TestInterfacePrefixes checks that the machine's real addresses come back
// with their prefix lengths: lo's 127.0.0.1/8 is on every Linux machine.
func TestInterfacePrefixes(t *testing.T) {
	prefixes, err := interfacePrefixes()
	if err != nil {
		t.Fatal(err)
	}
	want := netip.MustParsePrefix("127.0.0.1/8")
	found := false
	for _, p := range prefixes {
		if p == want {
			found = true
		}
		if !p.IsValid() || p.Addr().Is4In6() {
			t.Errorf("interface prefix %v: want a valid prefix of a plain address", p)
		}
	}
	if !found {
		t.Errorf("interfacePrefixes() = %v, want %s in it", prefixes, want)
	}
}
