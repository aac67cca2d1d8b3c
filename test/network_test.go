package test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"loam.dev/loam/api"
	"loam.dev/loam/test/harness"
)

// world is a network namespace that stands for the internet: a veth from
// the host's namespace, with addresses from a /24 of the test range that no
// daemon uses, and servers the test runs in it.
type world struct {
	ns      string // namespace name
	veth    string // host end
	hostIP  string // host end's address: what the world sees sandboxes come from
	ip, ip2 string // two addresses of the world's
}

// worldMu is held by the test that has the world: there is one per run
// (its names and addresses are the run's), and the tests run in parallel.
var worldMu sync.Mutex

// newWorld makes the world namespace and its veth, removed when the test
// ends, also on failure. A test waits here for the one that has it.
func newWorld(t *testing.T) *world {
	t.Helper()
	worldMu.Lock()
	// Registered first, so it runs last: after the world's removal.
	t.Cleanup(worldMu.Unlock)
	sub := strings.TrimSuffix(harness.Subnet(251), "0/24") // "10.X.251."
	// Named after the run's test range, so that two runs at once (see
	// testSubnet) have a world each.
	octet := strings.Split(sub, ".")[1]
	w := &world{
		ns: "loamtest-world-" + octet, veth: "lwworld" + octet,
		hostIP: sub + "1", ip: sub + "2", ip2: sub + "3",
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	cleanup := func() {
		_ = exec.Command("ip", "link", "del", w.veth).Run()
		_ = exec.Command("ip", "netns", "del", w.ns).Run()
	}
	cleanup()
	t.Cleanup(cleanup)
	run("netns", "add", w.ns)
	run("link", "add", w.veth, "type", "veth", "peer", "name", "eth0", "netns", w.ns)
	run("addr", "add", w.hostIP+"/24", "dev", w.veth)
	run("link", "set", w.veth, "up")
	run("-n", w.ns, "addr", "add", w.ip+"/24", "dev", "eth0")
	run("-n", w.ns, "addr", "add", w.ip2+"/24", "dev", "eth0")
	run("-n", w.ns, "link", "set", "eth0", "up")
	run("-n", w.ns, "link", "set", "lo", "up")
	return w
}

// listen opens a TCP listener on addr inside the world.
func (w *world) listen(t *testing.T, network, addr string) net.Listener {
	t.Helper()
	var (
		ln  net.Listener
		err error
	)
	w.in(t, func() { ln, err = net.Listen(network, addr) })
	if err != nil {
		t.Fatalf("listening on %s in the world: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// in runs f on a thread in the world's namespace; sockets f makes stay
// there.
func (w *world) in(t *testing.T, f func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is left locked, so it ends with the goroutine
		// instead of going back to the pool in the world's namespace.
		ns, err := netns.GetFromName(w.ns)
		if err != nil {
			done <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			done <- err
			return
		}
		f()
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatalf("entering %s: %v", w.ns, err)
	}
}

// serveHTTP serves, on port 80 of both world addresses, "hello from ADDR"
// and, under /ticks, a line every 100 ms for as long as the client reads.
func (w *world) serveHTTP(t *testing.T) {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(rw, "hello from %s\n", strings.Split(r.Host, ":")[0])
	})
	mux.HandleFunc("/ticks", func(rw http.ResponseWriter, r *http.Request) {
		for i := 0; ; i++ {
			if _, err := fmt.Fprintf(rw, "tick %d\n", i); err != nil {
				return
			}
			rw.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	for _, ip := range []string{w.ip, w.ip2} {
		srv := &http.Server{Handler: mux}
		ln := w.listen(t, "tcp", ip+":80")
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
	}
}

// fetchInside runs wget in a sandbox (busybox's wget crashes with -T, so timeout
// bounds it) and returns what it got, or "" when it
// could not connect.
func fetchInside(t *testing.T, d *harness.Daemon, sb, url string) string {
	t.Helper()
	out, errOut, code := runAs(d, "", sb, "sh", "-c", `f=$(mktemp); timeout 3 wget -q -O "$f" "$0" && cat "$f"; c=$?; rm -f "$f"; exit $c`, url)
	if code != 0 {
		t.Logf("from %s, wget %s: exit %d: %s", sb, url, code, errOut)
		return ""
	}
	return out
}

// expectFetch fails the test unless fetching url from sb works exactly
// when want is true. It may run beside other fetches from sb.
func expectFetch(t *testing.T, d *harness.Daemon, sb, url string, want bool) {
	t.Helper()
	got := fetchInside(t, d, sb, url)
	if (got != "") != want {
		t.Errorf("from %s, fetching %s: %q, want success %v", sb, url, got, want)
	}
}

func TestNetworkEgress(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.serveHTTP(t)
	d := harness.StartDaemon(t)
	ctx := context.Background()
	create := func(name string, p *api.NetworkPolicy) *api.Sandbox {
		t.Helper()
		sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: name, Network: p})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	open := create("open", nil)
	if open.Network.Egress != api.EgressAll {
		t.Errorf("default network %+v, want egress all", open.Network)
	}
	closed := create("closed", &api.NetworkPolicy{Egress: api.EgressNone})
	create("some", &api.NetworkPolicy{Egress: api.EgressNone, Allow: []string{w.ip}})
	url1, url2 := "http://"+w.ip+"/", "http://"+w.ip2+"/"

	if got := fetchInside(t, d, "open", url1); got != "hello from "+w.ip+"\n" {
		t.Errorf("open: fetching %s: %q", url1, got)
	}
	var wg sync.WaitGroup
	wg.Go(func() { expectFetch(t, d, "open", url2, true) })
	wg.Go(func() { expectFetch(t, d, "closed", url1, false) })
	wg.Go(func() { expectFetch(t, d, "some", url1, true) })
	wg.Go(func() { expectFetch(t, d, "some", url2, false) })
	wg.Wait()

	// A sandbox reaches nothing of the host's but its agent channel (not
	// the daemon's API, nor a port on the host's world address), nor
	// another sandbox, unless an allow rule names that address: then it
	// reaches exactly that.
	hostLn, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostLn.Close()
	// A real HTTP server: one that answered before reading the request
	// raced the host's own client below.
	go http.Serve(hostLn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "host\n")
	}))
	hostPort := hostLn.Addr().(*net.TCPAddr).Port
	gw := strings.TrimSuffix(sandboxIP(d, open.ID), "2") + "1" // the sandbox's host address
	apiPort := d.URL[strings.LastIndex(d.URL, ":")+1:]
	// A web server in the closed sandbox, for the others to try.
	d.Run("closed", "sh", "-c", "mkdir -p /tmp/www && echo peer > /tmp/www/index.html && httpd -p 9000 -h /tmp/www")
	peer := fmt.Sprintf("http://%s:9000/", sandboxIP(d, closed.ID))
	targets := map[string]string{
		"gw":   fmt.Sprintf("http://%s:%d/", gw, hostPort),
		"host": fmt.Sprintf("http://%s:%d/", w.hostIP, hostPort),
		"api":  fmt.Sprintf("http://%s:%s/healthz", gw, apiPort),
		"peer": peer,
	}
	// The fetches of one look run at once: each refused one waits out
	// wget's 3 s.
	reaches := func(sb string, open ...string) {
		t.Helper()
		var wg sync.WaitGroup
		for what, u := range targets {
			wg.Go(func() { expectFetch(t, d, sb, u, slices.Contains(open, what)) })
		}
		wg.Wait()
	}
	reaches("open")
	reaches("some")
	if _, err := d.C.SetNetwork(ctx, "some", api.NetworkPolicy{Egress: api.EgressNone, Allow: []string{w.ip, w.hostIP}}); err != nil {
		t.Fatal(err)
	}
	reaches("some", "host")
	if _, err := d.C.SetNetwork(ctx, "some", api.NetworkPolicy{Egress: api.EgressNone, Allow: []string{w.ip, sandboxIP(d, closed.ID)}}); err != nil {
		t.Fatal(err)
	}
	reaches("some", "peer")
	reaches("open")
	expectFetch(t, d, "some", url1, true)
	// The host itself does reach it (the test is not fooling itself).
	if resp, err := http.Get(fmt.Sprintf("http://%s:%d/", w.hostIP, hostPort)); err != nil {
		t.Errorf("the host's own listener: %v", err)
	} else {
		resp.Body.Close()
	}

	// Forks: a fork of a restricted sandbox is restricted, one given
	// egress all is not.
	if _, err := d.C.CreateCheckpoint(ctx, "closed", api.CreateCheckpoint{}); err != nil {
		t.Fatal(err)
	}
	fork1, err := d.C.Fork(ctx, "closed", "v1", "fork1")
	if err != nil {
		t.Fatal(err)
	}
	if fork1.Network.Egress != api.EgressNone {
		t.Errorf("fork of a restricted sandbox: network %+v", fork1.Network)
	}
	if _, err := d.C.ForkWith(ctx, "closed", "v1", api.CreateSandbox{Name: "fork2", Network: &api.NetworkPolicy{Egress: api.EgressAll}}); err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { expectFetch(t, d, "fork1", url1, false) })
	wg.Go(func() { expectFetch(t, d, "fork2", url1, true) })
	wg.Wait()

	// A restore keeps the sandbox's current policy.
	if _, err := d.C.SetNetwork(ctx, "closed", api.NetworkPolicy{Egress: api.EgressAll}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.RestoreCheckpoint(ctx, "closed", "v1"); err != nil {
		t.Fatal(err)
	}
	expectFetch(t, d, "closed", url1, true)
	if sb, err := d.C.GetSandbox(ctx, "closed"); err != nil || sb.Network.Egress != api.EgressAll {
		t.Errorf("after restore: %+v, %v; want egress all", sb, err)
	}

	// A live change cuts an open connection: the ticks stop coming. The
	// script counts them once some came (/tmp/counted), waits for the
	// test's change (/tmp/changed), and counts twice more a second apart.
	var (
		out  string
		code int
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		script := `wget -q -O /tmp/ticks http://` + w.ip + `/ticks & sleep 2; wc -l </tmp/ticks; touch /tmp/counted; ` +
			`while [ ! -e /tmp/changed ]; do sleep 0.1; done; sleep 1; wc -l </tmp/ticks; sleep 1; wc -l </tmp/ticks; kill %1`
		out, _, code = runAs(d, "", "open", "sh", "-c", script)
	}()
	harness.Eventually(t, time.Minute, "the first count of the ticks", func() error {
		_, _, code, err := d.C.Output(ctx, "open", "test", "-e", "/tmp/counted")
		if err == nil && code != 0 {
			err = errors.New("no /tmp/counted yet")
		}
		return err
	})
	if _, err := d.C.SetNetwork(ctx, "open", api.NetworkPolicy{Egress: api.EgressNone}); err != nil {
		t.Fatal(err)
	}
	d.Run("open", "touch", "/tmp/changed")
	wg.Wait()
	var before, after1, after2 int
	if _, err := fmt.Sscan(out, &before, &after1, &after2); err != nil || code != 0 {
		t.Fatalf("counting ticks: %q (exit %d): %v", out, code, err)
	}
	t.Logf("ticks: %d before the change, %d and %d after", before, after1, after2)
	if before == 0 || after2 != after1 {
		t.Errorf("ticks %d, %d, %d: want some before the change and none between the last two counts", before, after1, after2)
	}
	expectFetch(t, d, "open", url1, false)
}

// serveDNS answers, on port 53 (UDP) of the world's first address, for the
// zone world.test: a.world.test is the first world address, b.world.test
// the second; any other name is NXDOMAIN.
func (w *world) serveDNS(t *testing.T) string {
	t.Helper()
	zone := map[string]string{"a.world.test.": w.ip, "b.world.test.": w.ip2}
	handler := dns.HandlerFunc(func(rw dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		ip, ok := zone[strings.ToLower(q.Question[0].Name)]
		switch {
		case !ok:
			m.SetRcode(q, dns.RcodeNameError)
		case q.Question[0].Qtype == dns.TypeA:
			rr, _ := dns.NewRR(q.Question[0].Name + " 5 IN A " + ip)
			m.Answer = append(m.Answer, rr)
		}
		_ = rw.WriteMsg(m)
	})
	var pc net.PacketConn
	var err error
	w.in(t, func() { pc, err = net.ListenPacket("udp", w.ip+":53") })
	if err != nil {
		t.Fatalf("listening for DNS in the world: %v", err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: handler}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return w.ip + ":53"
}

func TestNetworkNames(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.serveHTTP(t)
	d := harness.StartDaemon(t, "--dns-upstream", w.serveDNS(t))
	ctx := context.Background()
	create := func(name string, p *api.NetworkPolicy) {
		t.Helper()
		if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: name, Network: p}); err != nil {
			t.Fatal(err)
		}
	}
	create("open", nil)
	create("closed", &api.NetworkPolicy{Egress: api.EgressNone})
	create("named", &api.NetworkPolicy{Egress: api.EgressNone, Allow: []string{"a.world.test"}})
	create("denied", &api.NetworkPolicy{Deny: []string{"*.world.test"}})

	a, b := "http://a.world.test/", "http://b.world.test/"
	if got := fetchInside(t, d, "open", a); got != "hello from a.world.test\n" {
		t.Errorf("open: fetching %s: %q", a, got)
	}
	expectFetch(t, d, "open", b, true)
	expectFetch(t, d, "closed", a, false)
	// An allow list lets one name through and not another, and an address
	// not on it is refused even when hard-coded.
	expectFetch(t, d, "named", a, true)
	expectFetch(t, d, "named", b, false)
	expectFetch(t, d, "named", "http://"+w.ip2+"/", false)
	// The name's address is open, the one the sandbox was given: a.
	expectFetch(t, d, "named", "http://"+w.ip+"/", true)
	expectFetch(t, d, "denied", a, false)
	if out, _, code := runAs(d, "", "denied", "nslookup", "a.world.test"); code == 0 {
		t.Errorf("denied: nslookup a.world.test succeeded: %s", out)
	}
	// The address of a denied name is closed too, once the resolver knows
	// it: asked (a *.pattern), or looked up for the policy (an exact
	// name), even under egress all.
	expectFetch(t, d, "denied", "http://"+w.ip+"/", false)
	expectFetch(t, d, "denied", "http://"+w.ip2+"/", true) // b.world.test was never asked
	create("denied-exact", &api.NetworkPolicy{Deny: []string{"a.world.test"}})
	expectFetch(t, d, "denied-exact", "http://"+w.ip+"/", false)
	expectFetch(t, d, "denied-exact", "http://"+w.ip2+"/", true)
	// An exact allowed name's address is open before any lookup.
	create("allowed-exact", &api.NetworkPolicy{Egress: api.EgressNone, Allow: []string{"b.world.test"}})
	expectFetch(t, d, "allowed-exact", "http://"+w.ip2+"/", true)
	expectFetch(t, d, "allowed-exact", "http://"+w.ip+"/", false)

	// A policy change reaches the resolver too; a name it still allows
	// keeps its address open, one it no longer allows closes.
	if _, err := d.C.SetNetwork(ctx, "named", api.NetworkPolicy{Egress: api.EgressNone, Allow: []string{"*.world.test"}}); err != nil {
		t.Fatal(err)
	}
	expectFetch(t, d, "named", "http://"+w.ip+"/", true) // learned under the old policy, allowed by the new
	if _, err := d.C.SetNetwork(ctx, "named", api.NetworkPolicy{Egress: api.EgressNone, Allow: []string{"b.world.test"}}); err != nil {
		t.Fatal(err)
	}
	expectFetch(t, d, "named", b, true)
	expectFetch(t, d, "named", "http://"+w.ip+"/", false)

	// A fork (another slot, another host address) resolves with the same
	// resolv.conf, under its source's policy.
	if _, err := d.C.CreateCheckpoint(ctx, "named", api.CreateCheckpoint{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.Fork(ctx, "named", "v1", "fork"); err != nil {
		t.Fatal(err)
	}
	expectFetch(t, d, "fork", b, true)
	expectFetch(t, d, "fork", a, false)
}

// TestNetworkAfterRestart: a restarted daemon installs its firewall afresh
// and puts back the policy and the resolver of every sandbox that ran on.
func TestNetworkAfterRestart(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.serveHTTP(t)
	dnsAddr := w.serveDNS(t)
	d := harness.StartDaemon(t, "--dns-upstream", dnsAddr)
	ctx := context.Background()
	for name, p := range map[string]*api.NetworkPolicy{
		"open":  nil,
		"named": {Egress: api.EgressNone, Allow: []string{"a.world.test"}},
	} {
		if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: name, Network: p}); err != nil {
			t.Fatal(err)
		}
	}
	a, b := "http://a.world.test/", "http://b.world.test/"
	expectFetch(t, d, "named", a, true)
	d.Stop()
	d.Start("--dns-upstream", dnsAddr)
	expectFetch(t, d, "open", b, true)
	expectFetch(t, d, "named", a, true)
	expectFetch(t, d, "named", b, false)
	expectFetch(t, d, "named", "http://"+w.ip2+"/", false)
}

// TestNetworkCLI: the policy flags of create, and loam network set/get.
func TestNetworkCLI(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	if _, errOut, code := d.CLI("", "create", "cli", "--egress", "none", "--allow", "PyPI.org", "--allow", "192.0.2.0/24"); code != 0 {
		t.Fatalf("create: exit %d: %s", code, errOut)
	}
	want := "egress:      none\nallow:       pypi.org,192.0.2.0/24\ndeny:        -\n"
	if out, errOut, code := d.CLI("", "network", "get", "cli"); code != 0 || out != want {
		t.Errorf("network get: exit %d %q %s, want %q", code, out, errOut, want)
	}
	want = "egress:      all\nallow:       -\ndeny:        *.example.com\n"
	if out, errOut, code := d.CLI("", "network", "set", "cli", "--deny", "*.example.com"); code != 0 || out != want {
		t.Errorf("network set: exit %d %q %s, want %q", code, out, errOut, want)
	}
	if _, errOut, code := d.CLI("", "network", "set", "cli", "--egress", "some"); code == 0 || !strings.Contains(errOut, "neither") {
		t.Errorf("network set --egress some: exit %d: %s", code, errOut)
	}
}
