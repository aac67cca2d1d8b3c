package test

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/test/harness"
)

// dfUse is what df says of a sandbox's /, in bytes.
type dfUse struct{ size, used, avail int64 }

// TestDiskLimitDF is issue 20's df inside a sandbox: it showed the whole
// disk pool, not the sandbox's limit. A limited sandbox's / must be a disk
// of its limit plus its template (which the limit does not count), whose
// free space is what the limit leaves (what loam reports, seen from the
// other side), whose use grows with what it writes, and it must stay so on
// the new volume of a restore in place (a fresh boot) and of forks of a
// disk-only and of a memory checkpoint (the last a runsc restore), and
// after that fork sleeps and wakes (a runsc restore on the same volume). A
// sandbox with the default limit (4 GiB) sees that.
func TestDiskLimitDF(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	mnt := filepath.Join(d.DataDir, "disk", "mnt")
	const mib = 1 << 20
	for _, req := range []api.CreateSandbox{
		{Name: "df", Resources: &api.Resources{DiskMiB: diskLimit}},
		{Name: "open"},
	} {
		if _, err := d.C.CreateSandbox(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	// check compares df in sb with the limit and the use loam reports,
	// once the pool has committed what was written (the counters lag
	// writes until then).
	check := func(sb string) dfUse {
		t.Helper()
		syncPool(t, mnt)
		u := df(t, d, sb)
		s, err := d.C.GetSandbox(ctx, sb)
		if err != nil {
			t.Fatal(err)
		}
		if s.Disk == nil || s.Disk.UsedBytes == nil || !s.Disk.Enforced {
			t.Fatalf("%s: disk %+v, want its use, enforced", sb, derefDisk(s.Disk))
		}
		used, limit := *s.Disk.UsedBytes, int64(s.Disk.LimitMiB)*mib
		t.Logf("%s: df size %d used %d avail %d; loam: %d used of %d", sb, u.size, u.used, u.avail, used, limit)
		// The size is the limit plus the template's size, busybox's few MiB.
		if u.size < limit || u.size > limit+32*mib {
			t.Errorf("%s: df size %d, want the limit %d plus the template's few MiB", sb, u.size, limit)
		}
		if diff := u.avail - (limit - used); diff < -4*mib || diff > 4*mib {
			t.Errorf("%s: df avail %d, the limit leaves %d: more than 4 MiB apart", sb, u.avail, limit-used)
		}
		if diff := u.size - u.used - u.avail; diff < -mib || diff > mib {
			t.Errorf("%s: df size %d is not used %d plus avail %d", sb, u.size, u.used, u.avail)
		}
		return u
	}
	before := check("df")
	if errb, code := fillDisk(t, d, "df", "hundred", 100); code != 0 {
		t.Fatalf("dd of 100 MiB: code %d, %q", code, errb)
	}
	after := check("df")
	if grown := after.used - before.used; grown < 98*mib || grown > 104*mib {
		t.Errorf("df used grew by %d bytes with 100 MiB written", grown)
	}
	if after.size != before.size {
		t.Errorf("df size went from %d to %d with 100 MiB written", before.size, after.size)
	}

	// A restore in place of a disk-only checkpoint boots fresh on a new
	// volume, and a fork of it on another.
	memory := false
	cp, err := d.C.CreateCheckpoint(ctx, "df", api.CreateCheckpoint{Memory: &memory})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.RestoreCheckpoint(ctx, "df", cp.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.Fork(ctx, "df", cp.ID, "disk-fork"); err != nil {
		t.Fatal(err)
	}
	// A fork of a memory checkpoint is a runsc restore into a new sentry,
	// which must read its own volume's quota, not its source's.
	memory = true
	mcp, err := d.C.CreateCheckpoint(ctx, "df", api.CreateCheckpoint{Memory: &memory})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.Fork(ctx, "df", mcp.ID, "memory-fork"); err != nil {
		t.Fatal(err)
	}
	// A wake is a runsc restore too, on the same volume.
	if _, err := d.C.Sleep(ctx, "memory-fork"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.Wake(ctx, "memory-fork"); err != nil {
		t.Fatal(err)
	}
	if errb, code := fillDisk(t, d, "memory-fork", "more", 50); code != 0 {
		t.Fatalf("dd of 50 MiB into the memory fork: code %d, %q", code, errb)
	}
	for _, sb := range []string{"df", "disk-fork", "memory-fork"} {
		u := check(sb)
		want := after.used
		if sb == "memory-fork" {
			want += 50 * mib
		}
		if diff := u.used - want; diff < -4*mib || diff > 4*mib {
			t.Errorf("%s: df used %d, want about %d", sb, u.used, want)
		}
	}

	// A sandbox with the default limit sees that limit: each sentry reads
	// its own volume's quota.
	if u := check("open"); u.size < 4<<30 {
		t.Errorf("open: df size %d, want the default limit of 4 GiB", u.size)
	}
}

// df is what df -P says of / in sandbox sb.
func df(t *testing.T, d *harness.Daemon, sb string) dfUse {
	t.Helper()
	out := d.Run(sb, "df", "-P", "-k", "/")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(lines) < 2 || len(f) < 4 {
		t.Fatalf("df in %s: %q", sb, out)
	}
	var n [3]int64
	for i := range n {
		k, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			t.Fatalf("df in %s: %q", sb, out)
		}
		n[i] = k << 10
	}
	return dfUse{size: n[0], used: n[1], avail: n[2]}
}

// syncPool commits the disk pool mounted at mnt, which brings its quota
// counters up to date.
func syncPool(t *testing.T, mnt string) {
	t.Helper()
	if out, err := exec.Command("btrfs", "filesystem", "sync", mnt).CombinedOutput(); err != nil {
		t.Fatalf("btrfs filesystem sync: %v: %s", err, out)
	}
}
