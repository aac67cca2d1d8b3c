package test

import (
	"strconv"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/test/harness"
)

// TestDiskQuota is resources.disk_mib on real sandboxes: one that writes
// beyond its limit gets "No space left on device" (ENOSPC) inside, a neighbour writes on,
// the daemon reports the use, and checkpoints (memory and disk-only), a
// restore and forks of the full sandbox work, each disk limited again.
func TestDiskQuota(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	const limit = 256 // MiB, the least a sandbox may have
	for _, name := range []string{"full", "next"} {
		req := api.CreateSandbox{Name: name}
		if name == "full" {
			req.Resources = &api.Resources{DiskMiB: limit}
		}
		if _, err := d.C.CreateSandbox(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	// dd fills 1 MiB blocks until the quota stops it.
	fill := func(sb, file string, mib int) (string, int) {
		t.Helper()
		_, errb, code, err := d.C.Output(ctx, sb, "dd", "if=/dev/zero", "of=/home/loam/"+file, "bs=1M",
			"count="+itoa(mib), "conv=fsync")
		if err != nil {
			t.Fatal(err)
		}
		return string(errb), code
	}
	if errb, code := fill("full", "big", limit+44); code == 0 || !strings.Contains(errb, "No space left on device") {
		t.Fatalf("dd of %d MiB into a %d MiB disk: code %d, stderr %q; want No space left on device", limit+44, limit, code, errb)
	}
	if errb, code := fill("next", "big", limit+44); code != 0 {
		t.Fatalf("the neighbour's dd of %d MiB: code %d, %q", limit+44, code, errb)
	}
	d.Run("full", "true") // the full sandbox still answers

	// Checkpoints of the full sandbox; taking one commits the filesystem,
	// so the counters are current after it.
	for _, memory := range []bool{true, false} {
		if _, err := d.C.CreateCheckpoint(ctx, "full", api.CreateCheckpoint{Memory: &memory}); err != nil {
			t.Fatalf("checkpoint (memory %v) of the full sandbox: %v", memory, err)
		}
	}
	sb, err := d.C.GetSandbox(ctx, "full")
	if err != nil {
		t.Fatal(err)
	}
	if u := sb.Disk; u == nil || !u.Enforced || u.LimitMiB != limit || u.UsedBytes == nil ||
		*u.UsedBytes < (limit-4)<<20 || *u.UsedBytes > limit<<20 {
		t.Errorf("full sandbox's disk %+v, want about %d MiB used of %d, enforced", derefDisk(u), limit, limit)
	}
	out, errOut, code := d.CLI("", "get", "full")
	if code != 0 || !strings.Contains(out, "Mi used of 256Mi\n") {
		t.Errorf("loam get full: %d %q %q; want the disk's use", code, out, errOut)
	}

	// A restore puts the full disk back; the restored disk is limited too.
	if _, err := d.C.RestoreCheckpoint(ctx, "full", "v1"); err != nil {
		t.Fatalf("restoring the full sandbox: %v", err)
	}
	if got := d.Run("full", "sh", "-c", "wc -c < /home/loam/big"); strings.TrimSpace(got) == "0" {
		t.Errorf("restored file is empty")
	}
	if errb, code := fill("full", "again", limit+44); code == 0 || !strings.Contains(errb, "No space left on device") {
		t.Errorf("dd into the restored disk: code %d, %q; want No space left on device", code, errb)
	}

	// Forks of the disk-only checkpoint: the source's limit, or their own.
	for _, tc := range []struct {
		name string
		res  *api.Resources
		want int
	}{{"fork-same", nil, limit}, {"fork-own", &api.Resources{DiskMiB: 2 * limit}, 2 * limit}} {
		f, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: tc.name, Resources: tc.res,
			From: &api.ForkSource{Sandbox: "full", Checkpoint: "v2"}})
		if err != nil {
			t.Fatalf("fork %s: %v", tc.name, err)
		}
		if f, err = d.C.GetSandbox(ctx, f.ID); err != nil {
			t.Fatal(err)
		}
		if f.Resources.DiskMiB != tc.want || f.Disk == nil || !f.Disk.Enforced || f.Disk.LimitMiB != tc.want {
			t.Errorf("fork %s: resources %+v, disk %+v; want a limit of %d MiB, enforced", tc.name, f.Resources, derefDisk(f.Disk), tc.want)
		}
		// The fork holds the full disk's data, and counts it: 200 MiB more
		// fit the bigger limit only.
		errb, code := fill(tc.name, "more", 200)
		if over := tc.want < limit+200; over != (code != 0) || (over && !strings.Contains(errb, "No space left on device")) {
			t.Errorf("dd of 200 MiB into fork %s of a full disk, limited to %d: code %d, %q", tc.name, tc.want, code, errb)
		}
	}
}

func derefDisk(u *api.DiskUse) any {
	if u == nil {
		return nil
	}
	used := "absent"
	if u.UsedBytes != nil {
		used = itoa(int(*u.UsedBytes))
	}
	return map[string]any{"used_bytes": used, "limit_mib": u.LimitMiB, "enforced": u.Enforced}
}

func itoa(n int) string { return strconv.Itoa(n) }
