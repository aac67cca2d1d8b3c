package test

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/network"
	"loam.dev/loam/internal/store/postgres/pgtest"
	"loam.dev/loam/test/harness"
)

// TestClusterFrontEnd: a front end (--role api) starts with none of a
// sandbox host's parts: as user nobody, with a runsc that does not exist.
// Through it, a sandbox is placed on node a, listed, run in and served at
// its URL; its /v1/nodes entry says it runs no runsc and keeps no disk;
// the templates it lists are the cluster's; calls that would need a local
// pool answer unavailable; and it left no disk pool, loop device or
// firewall table behind.
func TestClusterFrontEnd(t *testing.T) {
	t.Parallel()
	// A server of the test's own on loopback TCP: the shared one's socket
	// is in a directory only its postgres user may enter, and the front
	// end runs as nobody.
	pg := pgtest.NewServer(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t))))
	url := pg.TCPURL(pg.NewDatabase(t))
	a := startNode(t, url, "a", "")
	front := startFrontEnd(t, url, "front", a.Token)
	ctx := harness.Ctx(t)

	if uid := processUID(t, front.Cmd.Process.Pid); uid != front.Credential.Uid {
		t.Errorf("the front end runs as uid %d, want %d (nobody)", uid, front.Credential.Uid)
	}
	// The line comes once it listens, which may be after it first answers.
	harness.Eventually(t, 10*time.Second, "the front end's log saying role=api", func() error {
		if !strings.Contains(front.Log.String(), "role=api") {
			return fmt.Errorf("its log:\n%s", front.Log.String())
		}
		return nil
	})

	// Placed on a, and everything of it through the front end.
	sb, err := front.C.CreateSandbox(ctx, api.CreateSandbox{Name: "via-front"})
	if err != nil || sb.Node != "a" {
		t.Fatalf("a create through the front end: %+v, %v; want it on node a", sb, err)
	}
	if list, err := front.C.ListSandboxes(ctx, client.ListOptions{}); err != nil || len(list) != 1 || list[0].Name != "via-front" {
		t.Errorf("the list through the front end: %+v, %v", list, err)
	}
	if got, err := front.C.GetSandbox(ctx, "via-front"); err != nil || got.State != api.StateRunning || got.Node != "a" {
		t.Errorf("via-front through the front end: %+v, %v", got, err)
	}
	if out := front.Run("via-front", "echo", "through-front"); strings.TrimSpace(out) != "through-front" {
		t.Errorf("an exec through the front end: %q", out)
	}
	front.Run("via-front", "sh", "-c", "mkdir -p /tmp/www && echo served-by-a > /tmp/www/index.html && (httpd -p 8080 -h /tmp/www &)")
	tok, err := front.C.AccessToken(ctx, "via-front")
	if err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 20*time.Second, "via-front's URL through the front end", func() error {
		return front.Served(ctx, tok, "served-by-a")
	})

	// Its entry: a front end, with no runsc, disk or templates of its own.
	nd := front.nodes(t)["front"]
	if nd.Role != "api" || nd.State != api.NodeReady || nd.Runsc != "" || nd.DiskMiB != 0 || len(nd.Templates) != 0 ||
		len(nd.Images) != 0 || nd.Sandboxes != 0 || nd.CPUs == 0 || nd.MemoryMiB == 0 {
		t.Errorf("the front end in GET /v1/nodes: %+v; want role api, ready, no runsc, disk or templates", nd)
	}
	if out, _, code := front.CLI("", "nodes"); code != 0 || !strings.Contains(out, "ROLE") || !strings.Contains(out, " api ") {
		t.Errorf("loam nodes through the front end: %d %s", code, out)
	}

	// The templates it lists are the nodes': busybox, which a built for
	// via-front, is ready.
	harness.Eventually(t, 20*time.Second, "busybox ready in the front end's templates", func() error {
		tpls, err := front.C.Templates(ctx)
		if err != nil {
			return err
		}
		for _, tp := range tpls {
			if tp.Name == "busybox" {
				if !tp.Ready || tp.Kind != api.TemplateBuiltin {
					return fmt.Errorf("busybox: %+v", tp)
				}
				return nil
			}
		}
		return fmt.Errorf("no busybox in %+v", tpls)
	})
	// What a node alone does answers unavailable, naming the front end.
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/images", `{"ref":"docker.io/library/alpine:3"}`},
		{"PUT", "/v1/templates/busybox/pool", `{"size":1}`},
	} {
		code, body := front.Curl(c.method, c.path, c.body)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "front") {
			t.Errorf("%s %s through the front end: %d %s; want 503 naming the front end", c.method, c.path, code, body)
		}
	}

	// Nothing of a sandbox host's was made.
	for _, dir := range []string{"disk", "runsc", "sandboxes", "agents", "templates"} {
		if _, err := os.Stat(filepath.Join(front.DataDir, dir)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the front end's data dir has %s (%v); want none", dir, err)
		}
	}
	if out, _ := exec.Command("losetup", "-j", filepath.Join(front.DataDir, "disk", "disk.img")).Output(); len(out) != 0 {
		t.Errorf("a loop device on the front end's data dir: %s", out)
	}
	if mounts, _ := os.ReadFile("/proc/self/mounts"); strings.Contains(string(mounts), front.DataDir) {
		t.Errorf("a mount below the front end's data dir:\n%s", mounts)
	}
	table := network.TableName(netip.MustParsePrefix(front.Subnet))
	if out, _ := exec.Command("nft", "list", "tables").Output(); strings.Contains(string(out), table) {
		t.Errorf("the front end made firewall table %s:\n%s", table, out)
	}
	if err := front.C.DeleteSandbox(ctx, "via-front"); err != nil {
		t.Errorf("a delete through the front end: %v", err)
	}
}

// startFrontEnd starts front end name (--role api) on database url, on
// loopback, as user nobody and with a runsc that does not exist: it needs
// neither root nor runsc.
func startFrontEnd(t testing.TB, url, name, token string) *clusterNode {
	t.Helper()
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	dir, err := os.MkdirTemp("", "loam-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	d := &harness.Daemon{T: t, DataDir: dir, Subnet: harness.NextSubnet(),
		Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)},
		Bin:        binFor(t)}
	t.Cleanup(func() { d.Destroy() })
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, tokenFile} {
		if err := os.Chown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	n := &clusterNode{Daemon: d, name: name, args: []string{
		"--database", url, "--node", name, "--listen", listen,
		"--advertise", "http://" + listen, "--test-lease", clusterLease,
		"--role", "api", "--runsc", "/nonexistent/runsc",
	}}
	d.Start(n.args...)
	return n
}

// binFor is a copy of the daemon's binary that nobody may run: the test's
// binaries are in a directory only root may enter (scripts/test's
// mktemp -d, or the harness's own).
func binFor(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "loam-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src := harness.DaemonBin
	body, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, filepath.Base(src))
	if err := os.WriteFile(bin, body, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// processUID is the real uid process pid runs as.
func processUID(t testing.TB, pid int) uint32 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.Atoi(f[0])
				return uint32(n)
			}
		}
	}
	t.Fatalf("no Uid in /proc/%d/status", pid)
	return 0
}
