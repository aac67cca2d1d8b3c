package test

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/network"
	"loam.dev/loam/internal/runtime/gvisor"
	"loam.dev/loam/test/harness"
)

// TestTeardown: a daemon stopped with sandboxes running leaves them, the
// pool's loop mount and device, runsc's null-netns mount and the firewall
// table in place (by design: the next start takes them back). `loam serve
// --teardown` takes all of it down, as if the daemon had never run: it is
// refused while the daemon runs and without a terminal to confirm on, and
// with -y leaves no mount, loop device, network namespace, veth, nftables
// table, runsc process or cgroup of the data dir, and no data dir.
func TestTeardown(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	var ids []string
	for _, name := range []string{"one", "two"} {
		sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
		d.Run(name, "sh", "-c", "echo hi > /tmp/f")
	}
	f := false
	if _, err := d.C.CreateCheckpoint(ctx, "one", api.CreateCheckpoint{Memory: &f}); err != nil {
		t.Fatal(err)
	}
	dir := d.DataDir
	teardown := func(args ...string) (string, int) {
		t.Helper()
		flags := []string{"serve", "--teardown", "--data-dir", dir, "--runsc", harness.Runsc()}
		if d.Database != "" {
			// Its records are there; the teardown deletes them too.
			flags = append(flags, "--database", d.Database)
		}
		cmd := exec.Command(harness.DaemonBin, append(flags, args...)...)
		cmd.Env = append(os.Environ(), "LOAM_SUBNET=10.254.0.0/16") // the data dir's own record must win
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), code
	}
	if out, code := teardown("-y"); code == 0 || !strings.Contains(out, "used by another loam daemon") {
		t.Fatalf("teardown while the daemon runs: %d %q, want a refusal", code, out)
	}
	d.Stop()

	table := network.TableName(netip.MustParsePrefix(d.Subnet))
	containers := runscContainers(t, dir)
	left := func() []string {
		var left []string
		if m := harness.MountsUnder(dir); len(m) > 0 {
			left = append(left, "mounts "+strings.Join(m, " "))
		}
		if n := harness.LoopsOf(dir); n > 0 {
			left = append(left, fmt.Sprintf("loop devices %d", n))
		}
		for _, id := range ids {
			if _, err := os.Stat(filepath.Join(netnsDir, "loam-"+id)); err == nil {
				left = append(left, "netns loam-"+id)
			}
			if _, err := os.Stat(filepath.Join("/sys/class/net", "lm"+strings.TrimPrefix(id, "sb-"))); err == nil {
				left = append(left, "veth of "+id)
			}
		}
		if exec.Command("nft", "list", "table", "ip", table).Run() == nil {
			left = append(left, "nftables table "+table)
		}
		if p := pids(filepath.Join(dir, "runsc")); len(p) > 0 {
			left = append(left, "runsc processes "+strings.Join(p, " "))
		}
		for _, id := range containers {
			if m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", gvisor.CgroupParent, id)); len(m) > 0 {
				left = append(left, "cgroups "+strings.Join(m, " "))
			}
			if m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", gvisor.CgroupParent, id)); len(m) > 0 {
				left = append(left, "cgroups "+strings.Join(m, " "))
			}
		}
		return left
	}
	// What a stop leaves, by design: the test is void unless there is
	// something to take down.
	before := strings.Join(left(), "; ")
	for _, want := range []string{"mounts", "loop devices", "netns", "nftables table", "runsc processes"} {
		if !strings.Contains(before, want) {
			t.Errorf("after the daemon stopped, no %s left: %s", want, before)
		}
	}
	if len(containers) != 2 {
		t.Errorf("runsc containers after the stop %v, want the two sandboxes'", containers)
	}

	if out, code := teardown(); code == 0 || !strings.Contains(out, "not a terminal") || !strings.Contains(out, "--yes") {
		t.Fatalf("teardown without a terminal or -y: %d %q, want a refusal", code, out)
	}
	if now := strings.Join(left(), "; "); now != before {
		t.Fatalf("a refused teardown changed things: %s, was %s", now, before)
	}
	if out, code := teardown("-y"); code != 0 {
		t.Fatalf("teardown: %d\n%s", code, out)
	}
	if l := left(); len(l) > 0 {
		t.Errorf("left after the teardown: %s", strings.Join(l, "; "))
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the data dir is still there: %v", err)
	}
}

// netnsDir is where named network namespaces are mounted.
const netnsDir = "/run/netns"

// runscContainers lists the containers runsc has state for in dir's root.
func runscContainers(t *testing.T, dir string) []string {
	out, err := exec.Command(harness.Runsc(), "--root", filepath.Join(dir, "runsc"), "list", "-quiet").Output()
	if err != nil {
		t.Fatalf("runsc list: %v", err)
	}
	return strings.Fields(string(out))
}
