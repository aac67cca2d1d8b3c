package test

// TestHostile lists, in one place, what root inside a sandbox tries to reach
// and must not: the daemon, the host, another sandbox, another sandbox's
// metadata, and the host's files through symlinks. It fails if any try
// works.

import (
	"archive/tar"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/network"
	"loam.dev/loam/test/harness"
)

// daemonPorts are the TCP ports the daemon process listens on, from ss.
func daemonPorts(d *harness.Daemon, t *testing.T) []int {
	t.Helper()
	out, err := exec.Command("ss", "-Htlnp").Output()
	if err != nil {
		t.Fatalf("ss: %v", err)
	}
	pid := "pid=" + strconv.Itoa(d.Cmd.Process.Pid) + ","
	seen := map[int]bool{}
	var ports []int
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.Contains(line, pid) {
			continue
		}
		ap, err := netip.ParseAddrPort(strings.ReplaceAll(f[3], "*", "0.0.0.0"))
		if err != nil {
			continue
		}
		if p := int(ap.Port()); !seen[p] {
			seen[p] = true
			ports = append(ports, p)
		}
	}
	if len(ports) == 0 {
		t.Fatalf("the daemon (%s) listens on no port ss knows of:\n%s", pid, out)
	}
	return ports
}

// hostIPv4s are the host's own IPv4 addresses, but for those of the other
// daemons this test run starts (their sandboxes' host ends, in the run's
// /16 outside own): tests in parallel add and remove them while the probe
// runs, and once removed such an address is no longer the host's; the
// packet is routed out like any other bound for the outside, which egress
// allows, and whatever that network has may answer.
func hostIPv4s(t *testing.T, own string) []string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	ownNet := netip.MustParsePrefix(own)
	runNet := netip.PrefixFrom(ownNet.Addr(), 16).Masked()
	var ips []string
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		// 127.0.0.1 inside a sandbox is the sandbox's own.
		if !ok || n.IP.To4() == nil || n.IP.IsLoopback() {
			continue
		}
		ip, _ := netip.AddrFromSlice(n.IP.To4())
		if runNet.Contains(ip) && !ownNet.Contains(ip) {
			continue
		}
		ips = append(ips, ip.String())
	}
	return ips
}

// hostSide is the host's end of a sandbox's /30: the address before the
// sandbox's.
func hostSide(t *testing.T, sandboxIP string) string {
	t.Helper()
	a, err := netip.ParseAddr(sandboxIP)
	if err != nil {
		t.Fatal(err)
	}
	return a.Prev().String()
}

func TestHostile(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	for _, name := range []string{"hostile", "victim"} {
		if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	hostile, _ := d.C.GetSandbox(ctx, "hostile")
	victim, _ := d.C.GetSandbox(ctx, "victim")
	hostileIP, victimIP := sandboxIP(d, hostile.ID), sandboxIP(d, victim.ID)
	gateway := hostSide(t, hostileIP)

	// The victim serves on a port of its own, and its agent on 7071.
	runAs(d, "root", "victim", "sh", "-c", "mkdir -p /srv && echo victim > /srv/index.html && busybox httpd -p 8080 -h /srv")
	if got := d.Run("victim", "wget", "-q", "-O-", "http://127.0.0.1:8080/"); got != "victim\n" {
		t.Fatalf("the victim's own server: %q", got)
	}

	// Every address and port root in the sandbox tries, with a TCP connect.
	// connect marks a target where a TCP connect alone is too much (others
	// count as reached when they answer).
	type target struct {
		what, addr string
		connect    bool
	}
	var targets []target
	u, _ := url.Parse(d.URL)
	targets = append(targets, target{what: "the daemon's API at its listen address", addr: u.Host})
	hostIPs := hostIPv4s(t, d.Subnet)
	for _, p := range daemonPorts(d, t) {
		if p == network.DefaultInsidePort || p == 53 {
			// The in-sandbox API and the resolver, served on each
			// sandbox's gateway on purpose: the first is checked below,
			// the second serves names only.
			continue
		}
		targets = append(targets,
			target{what: "the daemon on the sandbox's gateway", addr: net.JoinHostPort(gateway, strconv.Itoa(p))},
			target{what: "the host's loopback through the gateway", addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(p))})
		for _, ip := range hostIPs {
			targets = append(targets, target{what: "the daemon on a host address", addr: net.JoinHostPort(ip, strconv.Itoa(p))})
		}
	}
	for _, ip := range hostIPs {
		if ip == gateway {
			continue
		}
		for _, p := range []string{"22", "53", "80", strconv.Itoa(agent.DefaultPort), strconv.Itoa(network.DefaultInsidePort)} {
			targets = append(targets, target{what: "a host address", addr: net.JoinHostPort(ip, p)})
		}
	}
	for _, p := range []string{"8080", strconv.Itoa(agent.DefaultPort), "22"} {
		targets = append(targets, target{what: "the other sandbox", addr: net.JoinHostPort(victimIP, p)})
	}
	for _, p := range []int{network.DefaultInsidePort, 53} {
		targets = append(targets, target{"the other sandbox's in-sandbox API and resolver", net.JoinHostPort(hostSide(t, victimIP), strconv.Itoa(p)), true})
	}
	// All at once, each bounded: a dropped packet takes the whole timeout.
	// Each sends an HTTP request (what every port here but DNS speaks) and
	// counts the bytes that come back: a listener that accepts and closes
	// at once (the in-sandbox API does, to any peer but its own sandbox)
	// answers nothing.
	// Eight at a time: the sandbox's process limit counts root's too.
	var script strings.Builder
	for i, tg := range targets {
		if i > 0 && i%8 == 0 {
			script.WriteString("wait\n")
		}
		host, port, _ := net.SplitHostPort(tg.addr)
		if tg.connect {
			fmt.Fprintf(&script, "(timeout 5 nc -w 3 %s %s </dev/null >/dev/null 2>&1 && echo %d connected || echo %d 0) &\n", host, port, i, i)
			continue
		}
		fmt.Fprintf(&script, "(n=$(printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' | timeout 5 nc -w 3 %s %s 2>/dev/null | wc -c); echo %d $n) &\n", host, port, i)
	}
	script.WriteString("wait\n")
	out, errOut, code := runAs(d, "root", "hostile", "sh", "-c", script.String())
	if code != 0 {
		t.Fatalf("the connect script: %d %q", code, errOut)
	}
	results := map[int]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		i, rc, _ := strings.Cut(line, " ")
		n, _ := strconv.Atoi(i)
		results[n] = rc
	}
	// Other test packages run beside this one and add and remove host
	// addresses (their namespaces' veths): one gone by now was no longer
	// the host's when the probe went out, and the sandbox's egress may
	// then rightly have taken it elsewhere.
	still := hostIPv4s(t, d.Subnet)
	for i, tg := range targets {
		rc, ok := results[i]
		host, _, _ := net.SplitHostPort(tg.addr)
		switch {
		case !ok:
			t.Errorf("no result for %s (%s)", tg.what, tg.addr)
		case rc == "0":
		case slices.Contains(hostIPs, host) && !slices.Contains(still, host):
			t.Logf("%s at %s answered, but %s is no longer the host's (another test's)", tg.what, tg.addr, host)
		default:
			t.Errorf("root in a sandbox reached %s at %s (%s)", tg.what, tg.addr, rc)
		}
	}
	t.Logf("%d addresses tried from inside", len(targets))
	// The probe works: it hears what the sandbox may reach (its own server).
	if out, _, _ := runAs(d, "root", "victim", "sh", "-c", "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | timeout 5 nc -w 3 127.0.0.1 8080 | wc -c"); strings.TrimSpace(out) == "0" {
		t.Fatalf("the probe hears nothing from a server it should reach: %q", out)
	}

	// The in-sandbox API answers about the sandbox itself only.
	inside := "http://" + net.JoinHostPort(gateway, strconv.Itoa(network.DefaultInsidePort))
	if out, _, code := runAs(d, "root", "hostile", "sh", "-c", `wget -q -O- --header "Authorization: Bearer $(cat /var/lib/loam/token)" `+inside+"/v1/sandboxes/hostile"); code != 0 || !strings.Contains(out, hostile.ID) {
		t.Fatalf("the in-sandbox API about itself: %d %q", code, out)
	}
	for _, path := range []string{"/v1/sandboxes/victim", "/v1/sandboxes/" + victim.ID, "/v1/sandboxes",
		"/v1/sandboxes/victim/checkpoints", "/v1/sandboxes/" + victim.ID + "/access-token", "/v1/templates", "/v1/secrets"} {
		out, _, code := runAs(d, "root", "hostile", "sh", "-c", `wget -q -O- --header "Authorization: Bearer $(cat /var/lib/loam/token)" `+inside+path)
		if code == 0 || strings.Contains(out, victim.ID) || strings.Contains(out, "victim") {
			t.Errorf("the in-sandbox API gave %s: %d %q", path, code, out)
		}
	}

	// Host files through symlinks, in every files call.
	hostDir := t.TempDir()
	marker := filepath.Join(hostDir, "marker")
	if err := os.WriteFile(marker, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	runAs(d, "root", "hostile", "sh", "-c", "ln -s "+hostDir+" /home/loam/hostdir && ln -s "+marker+" /home/loam/hostfile")
	root := &client.FileOptions{User: "root", Recursive: true}
	leaks := func(what string, r io.Reader, err error) {
		t.Helper()
		if err != nil {
			return
		}
		b, _ := io.ReadAll(r)
		if strings.Contains(string(b), "host secret") || strings.Contains(string(b), "marker") {
			t.Errorf("%s through a symlink gave the host's file: %q", what, tail(string(b), 200))
		}
	}
	for _, p := range []string{"/home/loam/hostfile", "/home/loam/hostdir/marker", marker} {
		rc, err := d.C.ReadFile(ctx, "hostile", p, root)
		leaks("read "+p, rc, err)
		if err == nil {
			rc.Close()
		}
	}
	if info, err := d.C.ListFiles(ctx, "hostile", "/home/loam/hostdir", root); err == nil {
		for _, e := range info.Entries {
			if strings.HasSuffix(e.Path, "/marker") {
				t.Error("list through a symlink shows the host's directory")
			}
		}
	}
	if rc, err := d.C.ReadArchive(ctx, "hostile", "/home/loam/hostdir", root); err == nil {
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			if strings.HasSuffix(h.Name, "marker") {
				t.Error("archive download through a symlink holds the host's file")
			}
		}
		rc.Close()
	}
	_, _ = d.C.WriteFile(ctx, "hostile", "/home/loam/hostdir/marker", strings.NewReader("overwritten"), root)
	_ = d.C.WriteArchive(ctx, "hostile", "/home/loam/hostdir", tarWith(t, "marker"), root)
	_, _ = d.C.Mkdir(ctx, "hostile", "/home/loam/hostdir/made", root)
	_, _ = d.C.MoveFile(ctx, "hostile", "/home/loam/hostdir/marker", "/home/loam/moved", root)
	_ = d.C.RemoveFile(ctx, "hostile", "/home/loam/hostdir/marker", root)
	if w, err := d.C.Watch(ctx, "hostile", "/home/loam/hostdir", root); err == nil {
		os.WriteFile(filepath.Join(hostDir, "new"), []byte("x"), 0o644)
		w.Close()
		os.Remove(filepath.Join(hostDir, "new"))
	}
	if b, err := os.ReadFile(marker); err != nil || string(b) != "host secret" {
		t.Errorf("the host's file changed: %q, %v", b, err)
	}
	if des, _ := os.ReadDir(hostDir); len(des) != 1 {
		t.Errorf("the host's directory holds %d entries, want its marker alone", len(des))
	}
}
