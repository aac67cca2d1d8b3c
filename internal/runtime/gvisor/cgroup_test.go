package gvisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"loam.dev/loam/internal/runtime"
)

func TestQuotaMicros(t *testing.T) {
	for _, c := range []struct {
		cpus float64
		want int64
	}{
		{0, -1},
		{0.1, 10000},
		{0.29, 29000}, // 28999.999999999996 before rounding
		{1, 100000},
		{1.5, 150000},
	} {
		if got := quotaMicros(c.cpus); got != c.want {
			t.Errorf("quotaMicros(%g) = %d, want %d", c.cpus, got, c.want)
		}
	}
}

// wantLimits checks container id's cgroup against l.
func wantLimits(tb testing.TB, id string, l runtime.Limits) {
	tb.Helper()
	quota, period, err := cpuMax(id)
	if err != nil {
		tb.Errorf("reading CPU quota: %v", err)
	} else if want := quotaMicros(l.CPUs); quota != want || (want > 0 && period != cfsPeriod) {
		tb.Errorf("CPU quota %d per %d µs, want %d per %d", quota, period, want, cfsPeriod)
	}
	mem, err := memoryMax(id)
	want := int64(l.MemoryMiB) << 20
	if l.MemoryMiB == 0 {
		want = -1
	}
	if err != nil {
		tb.Errorf("reading memory limit: %v", err)
	} else if mem != want {
		tb.Errorf("memory limit %d, want %d", mem, want)
	}
}

// liftByHand removes container id's CPU quota and memory limit behind the
// runtime's back, as a daemon that crashed in the middle of a checkpoint
// (or an administrator) would leave them.
func liftByHand(tb testing.TB, id string) {
	tb.Helper()
	for _, f := range []struct{ controller, v1, v2, v1Value, v2Value string }{
		{"cpu", cpuQuotaV1, cpuMaxV2, "-1", "max"},
		{"memory", memLimitV1, memMaxV2, "-1", "max"},
	} {
		files, v1 := cgroupFiles(id, f.controller, f.v1, f.v2)
		value := f.v2Value
		if v1 {
			value = f.v1Value
		}
		if err := os.WriteFile(files[0], []byte(value), 0); err != nil {
			tb.Fatal(err)
		}
	}
	wantLimits(tb, id, runtime.Limits{})
}

// TestSetLimits is the recovery of a sandbox whose limits were lifted: a
// crash in the middle of a checkpoint leaves it running without its quota.
func TestSetLimits(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.newSandbox(t, "sb-gvtestsetlim", 9)
	sb.spec.CPUs, sb.spec.MemoryMiB = 1, 256
	if err := e.rt.Start(ctx, sb.spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	sb.ask(t)
	id := sb.spec.ID
	wantLimits(t, id, sb.spec.Limits())

	liftByHand(t, id)
	for range 2 { // idempotent
		if err := e.rt.SetLimits(ctx, id, sb.spec.Limits()); err != nil {
			t.Fatalf("SetLimits: %v", err)
		}
		wantLimits(t, id, runtime.Limits{CPUs: 1, MemoryMiB: 256})
	}
	// 0 is no limit, as in a Spec.
	if err := e.rt.SetLimits(ctx, id, runtime.Limits{}); err != nil {
		t.Fatalf("SetLimits without limits: %v", err)
	}
	wantLimits(t, id, runtime.Limits{})
	if err := e.rt.SetLimits(ctx, id, runtime.Limits{CPUs: 0.5, MemoryMiB: 128}); err != nil {
		t.Fatalf("SetLimits to other limits: %v", err)
	}
	wantLimits(t, id, runtime.Limits{CPUs: 0.5, MemoryMiB: 128})

	// A paused sandbox too.
	if err := e.rt.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	liftByHand(t, id)
	if err := e.rt.SetLimits(ctx, id, sb.spec.Limits()); err != nil {
		t.Fatalf("SetLimits while paused: %v", err)
	}
	wantLimits(t, id, sb.spec.Limits())
	if err := e.rt.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if r := sb.ask(t); r.N != 2 {
		t.Errorf("n = %d, want 2", r.N)
	}

	if err := e.rt.SetLimits(ctx, "sb-gvtestnone00", sb.spec.Limits()); !errors.Is(err, runtime.ErrNotExist) {
		t.Errorf("SetLimits of an unknown id: %v, want ErrNotExist", err)
	}
	if err := e.rt.SetLimits(ctx, id, runtime.Limits{CPUs: -1}); err == nil {
		t.Error("SetLimits with a negative quota: nil error, want one")
	}
}

// failWrites makes the runtime's cgroup writes that match fail, after
// doing the write when done is set (a change that was made half-way).
func failWrites(rt *Runtime, match func(path, value string) bool, done bool) (restore func()) {
	rt.writeCgroup = func(path, value string) error {
		if !match(path, value) {
			return writeCgroupFile(path, value)
		}
		if done {
			if err := writeCgroupFile(path, value); err != nil {
				return err
			}
		}
		return errors.New("injected failure")
	}
	return func() { rt.writeCgroup = writeCgroupFile }
}

// isLift tells a write that lifts the CPU quota.
func isLift(path, value string) bool {
	base := filepath.Base(path)
	return base == cpuQuotaV1 && value == "-1" || base == cpuMaxV2 && strings.HasPrefix(value, "max")
}

// isQuota tells a write that sets a CPU quota.
func isQuota(path, value string) bool {
	base := filepath.Base(path)
	return (base == cpuQuotaV1 || base == cpuMaxV2) && !isLift(path, value)
}

// TestCheckpointKeepsQuota checks that the CPU quota a checkpoint lifts
// is back afterwards, whatever failed.
func TestCheckpointKeepsQuota(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.newSandbox(t, "sb-gvtestckquot", 10)
	sb.spec.CPUs, sb.spec.MemoryMiB = 1, 256
	if err := e.rt.Start(ctx, sb.spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	sb.ask(t)
	id := sb.spec.ID
	// A parent that is a file: runsc cannot make the image directory.
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	n := 1
	for _, c := range []struct {
		name    string
		failing bool                          // the checkpoint itself fails
		match   func(path, value string) bool // cgroup writes that fail
		done    bool                          // ... after they are made
		wantErr bool
	}{
		{name: "ok"},
		{name: "checkpoint fails", failing: true, wantErr: true},
		{name: "lifting fails half-way", match: isLift, done: true},
		{name: "lifting fails half-way, checkpoint fails", failing: true, match: isLift, done: true, wantErr: true},
		{name: "lifting fails", match: isLift},
		{name: "putting back fails", match: isQuota, wantErr: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			img := filepath.Join(dir, c.name)
			if c.failing {
				img = filepath.Join(notDir, "img")
			}
			restore := func() {}
			if c.match != nil {
				restore = failWrites(e.rt, c.match, c.done)
			}
			err := e.rt.Checkpoint(ctx, id, img, runtime.CheckpointOptions{LeaveRunning: true})
			restore()
			if (err != nil) != c.wantErr {
				t.Errorf("Checkpoint: %v, want an error: %v", err, c.wantErr)
			}
			t.Logf("Checkpoint: %v", err)
			if _, serr := os.Stat(img); (serr == nil) != (err == nil) {
				t.Errorf("image directory after Checkpoint returned %v: %v", err, serr)
			}
			if c.name == "putting back fails" {
				// The error tells the caller to put it back.
				if err == nil || !strings.Contains(err.Error(), "CPU quota") {
					t.Errorf("error %v does not say the quota was not put back", err)
				}
				if err := e.rt.SetLimits(ctx, id, sb.spec.Limits()); err != nil {
					t.Fatalf("SetLimits: %v", err)
				}
			}
			wantLimits(t, id, sb.spec.Limits())
			n++
			if r := sb.ask(t); r.N != n {
				t.Errorf("n = %d, want %d", r.N, n)
			}
		})
	}

	// A checkpoint that stops the sandbox leaves nothing to put back.
	if err := e.rt.Checkpoint(ctx, id, filepath.Join(dir, "stop"), runtime.CheckpointOptions{}); err != nil {
		t.Errorf("Checkpoint that stops: %v", err)
	}
}

// TestRestoreSetsLimits checks that a restore, which lifts the CPU quota
// while it loads the memory, ends with the quota set or with no container.
func TestRestoreSetsLimits(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.newSandbox(t, "sb-gvtestrsquot", 11)
	sb.spec.CPUs, sb.spec.MemoryMiB = 1, 256
	if err := e.rt.Start(ctx, sb.spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	sb.ask(t)
	id := sb.spec.ID
	img := filepath.Join(t.TempDir(), "img")
	if err := e.rt.Checkpoint(ctx, id, img, runtime.CheckpointOptions{}); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if err := e.rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}

	// Restored, but the quota cannot be set: no container is left to run
	// without it.
	sb.prepare(t)
	restore := failWrites(e.rt, isQuota, false)
	err := e.rt.Restore(ctx, sb.spec, img)
	restore()
	if err == nil {
		t.Fatal("Restore whose quota cannot be set: nil error, want one")
	}
	t.Logf("Restore failed as it should: %v", err)
	if _, err := e.rt.State(ctx, id); !errors.Is(err, runtime.ErrNotExist) {
		t.Errorf("State after a failed Restore: %v, want ErrNotExist", err)
	}

	sb.prepare(t)
	if err := e.rt.Restore(ctx, sb.spec, img); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	wantLimits(t, id, sb.spec.Limits())
	if r := sb.ask(t); r.N != 2 {
		t.Errorf("after restore n = %d, want 2", r.N)
	}
}
