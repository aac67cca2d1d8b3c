package sandbox_test

import (
	"errors"
	"net/netip"
	"reflect"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/network"
)

func TestNetworkPolicy(t *testing.T) {
	e := newEnv(t)
	check := func(name string, want api.NetworkPolicy, fw network.Policy) {
		t.Helper()
		sb, err := e.m.Get(e.ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(sb.Network, want) {
			t.Errorf("%s: network %+v, want %+v", name, sb.Network, want)
		}
		got, ok := e.nets.policy(sb.ID)
		if !ok || !reflect.DeepEqual(got, fw) {
			t.Errorf("%s: firewall holds %+v (%v), want %+v", name, got, ok, fw)
		}
	}
	all := api.NetworkPolicy{Egress: "all", Allow: []string{}, Deny: []string{}}
	pfx := netip.MustParsePrefix

	if _, err := e.m.Create(e.ctx, api.CreateSandbox{Name: "open"}); err != nil {
		t.Fatal(err)
	}
	check("open", all, network.Policy{Egress: network.EgressAll})

	restricted := api.NetworkPolicy{Egress: "none", Allow: []string{"192.0.2.7", "198.51.100.9/24"}, Deny: []string{"203.0.113.0/24"}}
	if _, err := e.m.Create(e.ctx, api.CreateSandbox{Name: "closed", Network: &restricted}); err != nil {
		t.Fatal(err)
	}
	stored := api.NetworkPolicy{Egress: "none", Allow: []string{"192.0.2.7/32", "198.51.100.0/24"}, Deny: []string{"203.0.113.0/24"}}
	closedFW := network.Policy{
		Egress: network.EgressNone,
		Allow:  []netip.Prefix{pfx("192.0.2.7/32"), pfx("198.51.100.0/24")},
		Deny:   []netip.Prefix{pfx("203.0.113.0/24")},
	}
	check("closed", stored, closedFW)

	withNames := api.NetworkPolicy{Egress: "none", Allow: []string{"PyPI.org.", "*.pythonhosted.org", "10.0.0.1"}, Deny: []string{"*.Example.com"}}
	if _, err := e.m.Create(e.ctx, api.CreateSandbox{Name: "names", Network: &withNames}); err != nil {
		t.Fatal(err)
	}
	check("names",
		api.NetworkPolicy{Egress: "none", Allow: []string{"pypi.org", "*.pythonhosted.org", "10.0.0.1/32"}, Deny: []string{"*.example.com"}},
		network.Policy{
			Egress: network.EgressNone, Allow: []netip.Prefix{pfx("10.0.0.1/32")},
			AllowNames: []string{"pypi.org", "*.pythonhosted.org"}, DenyNames: []string{"*.example.com"},
		})

	for _, bad := range []api.NetworkPolicy{
		{Allow: []string{"localhost"}},
		{Allow: []string{"10.0.0.256"}},
		{Deny: []string{"a_b.example.com"}},
		{Allow: []string{"*"}},
		{Egress: "some"},
		{Allow: []string{"pypi..org"}},
		{Deny: []string{"10.0.0.0/33"}},
		{Allow: []string{"::1"}},
	} {
		_, err := e.m.Create(e.ctx, api.CreateSandbox{Network: &bad})
		if !errors.Is(err, api.ErrInvalid) {
			t.Errorf("create with network %+v: %v, want invalid", bad, err)
		}
		if _, err := e.m.SetNetwork(e.ctx, "open", bad); !errors.Is(err, api.ErrInvalid) {
			t.Errorf("SetNetwork(%+v): %v, want invalid", bad, err)
		}
	}

	// A fork of a restricted sandbox is restricted; one given a policy
	// has that one.
	if _, err := e.cps.CreateCheckpoint(e.ctx, "closed", api.CreateCheckpoint{}); err != nil {
		t.Fatal(err)
	}
	from := &api.ForkSource{Sandbox: "closed", Checkpoint: "v1"}
	if _, err := e.m.Create(e.ctx, api.CreateSandbox{Name: "fork1", From: from}); err != nil {
		t.Fatal(err)
	}
	check("fork1", stored, closedFW)
	if _, err := e.m.Create(e.ctx, api.CreateSandbox{Name: "fork2", From: from, Network: &api.NetworkPolicy{Egress: "all"}}); err != nil {
		t.Fatal(err)
	}
	check("fork2", all, network.Policy{Egress: network.EgressAll})

	// A change reaches the firewall; a restore keeps the current policy.
	sb, err := e.m.SetNetwork(e.ctx, "closed", api.NetworkPolicy{Egress: "all", Deny: []string{"192.0.2.1"}})
	if err != nil {
		t.Fatal(err)
	}
	changed := api.NetworkPolicy{Egress: "all", Allow: []string{}, Deny: []string{"192.0.2.1/32"}}
	changedFW := network.Policy{Egress: network.EgressAll, Deny: []netip.Prefix{pfx("192.0.2.1/32")}}
	if !reflect.DeepEqual(sb.Network, changed) {
		t.Errorf("SetNetwork returned network %+v, want %+v", sb.Network, changed)
	}
	check("closed", changed, changedFW)
	if _, err := e.cps.RestoreCheckpoint(e.ctx, "closed", "v1"); err != nil {
		t.Fatal(err)
	}
	check("closed", changed, changedFW)
	if err := e.restart(); err != nil {
		t.Fatal(err)
	}
	check("closed", changed, changedFW)

	if _, err := e.m.SetNetwork(e.ctx, "nosuch", all); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("SetNetwork of a missing sandbox: %v, want not found", err)
	}
	// A deleted sandbox leaves no policy behind.
	id := sb.ID
	if err := e.m.Delete(e.ctx, "closed"); err != nil {
		t.Fatal(err)
	}
	if p, ok := e.nets.policy(id); ok {
		t.Errorf("after delete, the firewall still holds %+v", p)
	}
}
