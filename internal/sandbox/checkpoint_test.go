package sandbox_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/internal/runtime/fake"
)

// TestBusyDuringCheckpoint holds a checkpoint inside the runtime and checks
// that every other operation that changes the sandbox is refused meanwhile.
func TestBusyDuringCheckpoint(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "busy"})
	entered, release := make(chan struct{}), make(chan struct{})
	e.rt.SetHook(func(op, id string) {
		if op == "checkpoint" {
			close(entered)
			<-release
		}
	})
	var cp *api.Checkpoint
	var cpErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		cp, cpErr = e.cps.CreateCheckpoint(e.ctx, "busy", api.CreateCheckpoint{})
	}()
	<-entered

	for _, tc := range []struct {
		name string
		op   func() error
	}{
		{"delete", func() error { return e.m.Delete(e.ctx, "busy") }},
		{"checkpoint", func() error {
			_, err := e.cps.CreateCheckpoint(e.ctx, "busy", api.CreateCheckpoint{Memory: ptr(false)})
			return err
		}},
		{"restore", func() error { _, err := e.cps.RestoreCheckpoint(e.ctx, "busy", "v1"); return err }},
		{"checkpoint delete", func() error { return e.cps.DeleteCheckpoint(e.ctx, "busy", "v1") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "a checkpoint is in progress") {
				t.Errorf("%s during a checkpoint: %v, want a conflict that names the checkpoint", tc.name, err)
			}
		})
	}
	// Reading is not changing.
	if got, err := e.m.Get(e.ctx, "busy"); err != nil || got.State != api.StateRunning {
		t.Errorf("Get during a checkpoint: %+v, %v", got, err)
	}
	if _, err := e.cps.ListCheckpoints(e.ctx, "busy"); err != nil {
		t.Errorf("ListCheckpoints during a checkpoint: %v", err)
	}

	e.rt.SetHook(nil)
	close(release)
	<-done
	if cpErr != nil || cp.ID != "v1" {
		t.Fatalf("the held checkpoint: %+v, %v", cp, cpErr)
	}
	// The refused checkpoint spent no id.
	if cp := e.checkpoint("busy", false); cp.ID != "v2" {
		t.Errorf("next checkpoint is %s, want v2", cp.ID)
	}
	if err := e.m.Delete(e.ctx, "busy"); err != nil {
		t.Errorf("delete after the checkpoint: %v", err)
	}
	e.requireGone(sb.ID)
}

func TestCheckpointIDs(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "ids"})
	take := func(want string) {
		t.Helper()
		if cp := e.checkpoint("ids", false); cp.ID != want {
			t.Fatalf("checkpoint id %s, want %s", cp.ID, want)
		}
	}
	take("v1")
	take("v2")
	must(t, e.cps.DeleteCheckpoint(e.ctx, "ids", "v2"))
	take("v3")
	must(t, e.cps.DeleteCheckpoint(e.ctx, "ids", "v1"))
	must(t, e.cps.DeleteCheckpoint(e.ctx, "ids", "v3"))
	take("v4")
	if ids := e.checkpointIDs("ids"); !slices.Equal(ids, []string{"v4"}) {
		t.Errorf("checkpoints %v, want [v4]", ids)
	}
	if seq := e.record(sb.ID).CheckpointSeq; seq != 4 {
		t.Errorf("checkpoint seq %d, want 4", seq)
	}
	if err := e.cps.DeleteCheckpoint(e.ctx, "ids", "v1"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("deleting a deleted checkpoint: %v, want not_found", err)
	}

	// Names: given, found by, unique; refused requests spend no id.
	named, err := e.cps.CreateCheckpoint(e.ctx, "ids", api.CreateCheckpoint{Name: "before-upgrade", Comment: "all good", Memory: ptr(false)})
	if err != nil || named.ID != "v5" || named.Name != "before-upgrade" || named.Comment != "all good" || named.Memory || named.Auto || named.Sandbox != sb.ID {
		t.Fatalf("named checkpoint %+v, %v", named, err)
	}
	if got, err := e.cps.GetCheckpoint(e.ctx, "ids", "before-upgrade"); err != nil || got.ID != "v5" {
		t.Errorf("GetCheckpoint by name: %+v, %v", got, err)
	}
	for _, tc := range []struct {
		name string
		req  api.CreateCheckpoint
		want error
	}{
		{"name in use", api.CreateCheckpoint{Name: "before-upgrade"}, api.ErrConflict},
		{"name like an id", api.CreateCheckpoint{Name: "v9"}, api.ErrInvalid},
		{"bad name", api.CreateCheckpoint{Name: "-x"}, api.ErrInvalid},
		{"comment on two lines", api.CreateCheckpoint{Comment: "a\nb"}, api.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := e.cps.CreateCheckpoint(e.ctx, "ids", tc.req); !errors.Is(err, tc.want) {
				t.Errorf("CreateCheckpoint(%+v): %v, want %v", tc.req, err, tc.want)
			}
		})
	}
	take("v6")
	if _, err := e.cps.CreateCheckpoint(e.ctx, "nope", api.CreateCheckpoint{}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("checkpoint of a missing sandbox: %v, want not_found", err)
	}
}

// TestCheckpointKinds checks what each kind of checkpoint asks of the
// runtime and what it keeps: a disk-only one never pauses the sandbox; a
// memory one pauses it, writes its memory image and resumes it.
func TestCheckpointKinds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		memory *bool
		calls  []string
	}{
		{"disk only", ptr(false), []string{"start"}},
		{"memory", ptr(true), []string{"start", "pause", "checkpoint", "resume"}},
		{"memory by default", nil, []string{"start", "pause", "checkpoint", "resume"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			sb := e.create(api.CreateSandbox{Name: "kinds"})
			e.writeVolume(sb.ID, "state.txt", "one")
			cp, err := e.cps.CreateCheckpoint(e.ctx, "kinds", api.CreateCheckpoint{Memory: tc.memory})
			if err != nil {
				t.Fatal(err)
			}
			memory := tc.memory == nil || *tc.memory
			if cp.ID != "v1" || cp.Memory != memory || cp.Auto || cp.Sandbox != sb.ID || !strings.HasPrefix(cp.Name, "checkpoint-") || cp.CreatedAt.IsZero() {
				t.Errorf("checkpoint %+v", cp)
			}
			if got := e.rt.CallsOf(sb.ID); !slices.Equal(got, tc.calls) {
				t.Errorf("runtime calls %v, want %v", got, tc.calls)
			}
			if c, _ := e.rt.Get(sb.ID); c.Status != runtime.StatusRunning {
				t.Errorf("container is %s after the checkpoint", c.Status)
			}
			e.agentAnswers(sb.ID)

			// Its data: the record points at a directory named after it,
			// with the memory image for a memory checkpoint, and a snapshot
			// of the disk; nothing temporary is left.
			rec := e.cpRecord(sb.ID, "v1")
			// A memory checkpoint moves the agent to a new token: the one
			// in the image is no longer the source's.
			wantGen := 0
			if memory {
				wantGen = 1
			}
			if rec.Template != tinyTemplate || rec.Resources != e.record(sb.ID).Resources ||
				rec.AgentGen != 0 || e.record(sb.ID).AgentGen != wantGen || rec.Inside || rec.LegacyAgentToken != "" {
				t.Errorf("checkpoint record %+v, sandbox's token generation %d", rec, e.record(sb.ID).AgentGen)
			}
			if memory {
				e.agentAnswers(sb.ID, e.cpToken(sb.ID, "v1"))
			}
			b, err := os.ReadFile(filepath.Join(e.checkpointsDir(sb.ID), "v1", "mem", fake.ImageFile))
			if memory {
				var img fake.Image
				if err == nil {
					err = json.Unmarshal(b, &img)
				}
				if err != nil || img.Sandbox != sb.ID || img.Token != e.cpToken(sb.ID, "v1") {
					t.Errorf("memory image %+v, %v", img, err)
				}
			} else if !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a disk-only checkpoint has a memory image: %v", err)
			}
			if got := e.snapshots(); !slices.Equal(got, []string{sb.ID + ".v1"}) {
				t.Errorf("snapshots %v", got)
			}
			if entries, _ := os.ReadDir(e.checkpointsDir(sb.ID)); len(entries) != 1 || entries[0].Name() != "v1" {
				t.Errorf("checkpoint directories %v", entries)
			}
		})
	}
}

// TestCheckpointFailure checks that a memory checkpoint the runtime fails
// resumes the sandbox anyway and leaves no trace but its spent id.
func TestCheckpointFailure(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "flaky"})
	e.rt.FailNext("checkpoint", errors.New("runsc: boom"))
	if _, err := e.cps.CreateCheckpoint(e.ctx, "flaky", api.CreateCheckpoint{}); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("CreateCheckpoint: %v, want the runtime's error", err)
	}
	if got, want := e.rt.CallsOf(sb.ID), []string{"start", "pause", "checkpoint", "resume", "setlimits"}; !slices.Equal(got, want) {
		t.Errorf("runtime calls %v, want %v", got, want)
	}
	if c, _ := e.rt.Get(sb.ID); c.Status != runtime.StatusRunning {
		t.Errorf("container is %s", c.Status)
	}
	e.agentAnswers(sb.ID)
	if ids := e.checkpointIDs("flaky"); len(ids) != 0 {
		t.Errorf("checkpoints %v", ids)
	}
	if s := e.snapshots(); len(s) != 0 {
		t.Errorf("snapshots %v", s)
	}
	if entries, _ := os.ReadDir(e.checkpointsDir(sb.ID)); len(entries) != 0 {
		t.Errorf("checkpoint directories %v", entries)
	}
	if got, _ := e.m.Get(e.ctx, "flaky"); got.State != api.StateRunning {
		t.Errorf("state %s", got.State)
	}
	if cp := e.checkpoint("flaky", true); cp.ID != "v2" {
		t.Errorf("next checkpoint %s, want v2 (v1 was spent)", cp.ID)
	}
}

func TestCheckpointLimit(t *testing.T) {
	e := newEnvLimits(t, checkpoint.Limits{Owner: 2})
	e.create(api.CreateSandbox{Name: "full"})
	e.checkpoint("full", false)
	e.checkpoint("full", false)
	if _, err := e.cps.CreateCheckpoint(e.ctx, "full", api.CreateCheckpoint{Memory: ptr(false)}); !errors.Is(err, api.ErrLimit) {
		t.Fatalf("third checkpoint: %v, want limit", err)
	}
	// Automatic checkpoints do not count, and a restore still takes one.
	if _, err := e.cps.RestoreCheckpoint(e.ctx, "full", "v1"); err != nil {
		t.Fatal(err)
	}
	if ids := e.checkpointIDs("full"); !slices.Equal(ids, []string{"v1", "v2", "auto-1"}) {
		t.Errorf("checkpoints %v", ids)
	}
	if _, err := e.cps.CreateCheckpoint(e.ctx, "full", api.CreateCheckpoint{Memory: ptr(false)}); !errors.Is(err, api.ErrLimit) {
		t.Errorf("checkpoint after a restore: %v, want limit", err)
	}
	must(t, e.cps.DeleteCheckpoint(e.ctx, "full", "v1"))
	if cp := e.checkpoint("full", false); cp.ID != "v3" {
		t.Errorf("checkpoint after freeing one: %s, want v3", cp.ID)
	}
}

// TestRestore rolls a sandbox back to a memory and to a disk-only
// checkpoint, and undoes a restore with the automatic checkpoint it took.
func TestRestore(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "back"})
	e.writeVolume(sb.ID, "state.txt", "one")
	e.checkpoint("back", true)
	e.writeVolume(sb.ID, "state.txt", "two")
	e.checkpoint("back", false)
	e.writeVolume(sb.ID, "state.txt", "three")
	start := len(e.rt.CallsOf(sb.ID))

	got, err := e.cps.RestoreCheckpoint(e.ctx, "back", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != api.StateRunning || got.ID != sb.ID {
		t.Errorf("restored sandbox %+v", got)
	}
	// Keep the state (memory, since it runs) with the checkpoint that stops
	// the sandbox (no pause, no resume), then restore memory.
	if calls, want := e.rt.CallsOf(sb.ID)[start:], []string{"checkpoint", "delete", "restore"}; !slices.Equal(calls, want) {
		t.Errorf("runtime calls %v, want %v", calls, want)
	}
	if c, _ := e.rt.Get(sb.ID); c.From != sb.ID {
		t.Errorf("container restored from %q, want %s", c.From, sb.ID)
	}
	e.agentAnswers(sb.ID)
	if s := e.readVolume(sb.ID, "state.txt"); s != "one" {
		t.Errorf("disk after restoring v1: %q, want one", s)
	}
	auto, err := e.cps.GetCheckpoint(e.ctx, "back", "auto-1")
	if err != nil || !auto.Auto || !auto.Memory || auto.Comment != "before restoring v1" {
		t.Errorf("automatic checkpoint %+v, %v", auto, err)
	}
	if ids := e.checkpointIDs("back"); !slices.Equal(ids, []string{"v1", "v2", "auto-1"}) {
		t.Errorf("checkpoints %v", ids)
	}

	// A disk-only checkpoint boots fresh on its disk.
	start = len(e.rt.CallsOf(sb.ID))
	if _, err := e.cps.RestoreCheckpoint(e.ctx, "back", "v2"); err != nil {
		t.Fatal(err)
	}
	if calls, want := e.rt.CallsOf(sb.ID)[start:], []string{"checkpoint", "delete", "start"}; !slices.Equal(calls, want) {
		t.Errorf("runtime calls %v, want %v", calls, want)
	}
	if c, _ := e.rt.Get(sb.ID); c.From != "" {
		t.Errorf("container restored from %q, want a fresh boot", c.From)
	}
	if s := e.readVolume(sb.ID, "state.txt"); s != "two" {
		t.Errorf("disk after restoring v2: %q, want two", s)
	}
	e.agentAnswers(sb.ID)

	// Undo: auto-1 holds the state before the first restore.
	if _, err := e.cps.RestoreCheckpoint(e.ctx, "back", "auto-1"); err != nil {
		t.Fatal(err)
	}
	if s := e.readVolume(sb.ID, "state.txt"); s != "three" {
		t.Errorf("disk after undoing: %q, want three", s)
	}
	if ids := e.checkpointIDs("back"); !slices.Equal(ids, []string{"v1", "v2", "auto-1", "auto-2", "auto-3"}) {
		t.Errorf("checkpoints %v", ids)
	}
	if _, err := e.cps.RestoreCheckpoint(e.ctx, "back", "v9"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("restoring a missing checkpoint: %v, want not_found", err)
	}
}

// TestRestorePrunesAutos checks that a sandbox keeps its 5 newest automatic
// checkpoints, and never prunes the one it was just restored to.
func TestRestorePrunesAutos(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "autos"})
	e.checkpoint("autos", false)
	restore := func(cp string) {
		t.Helper()
		if _, err := e.cps.RestoreCheckpoint(e.ctx, "autos", cp); err != nil {
			t.Fatalf("restoring %s: %v", cp, err)
		}
	}
	for range 6 {
		restore("v1")
	}
	want := []string{"v1", "auto-2", "auto-3", "auto-4", "auto-5", "auto-6"}
	if ids := e.checkpointIDs("autos"); !slices.Equal(ids, want) {
		t.Errorf("after 6 restores: %v, want %v", ids, want)
	}
	if seq := e.record(sb.ID).AutoSeq; seq != 6 {
		t.Errorf("auto seq %d, want 6", seq)
	}
	// The oldest, restored to, is spared when auto-7 is taken...
	restore("auto-2")
	want = []string{"v1", "auto-2", "auto-3", "auto-4", "auto-5", "auto-6", "auto-7"}
	if ids := e.checkpointIDs("autos"); !slices.Equal(ids, want) {
		t.Errorf("after restoring the oldest: %v, want %v", ids, want)
	}
	// ...and goes with the next one.
	restore("v1")
	want = []string{"v1", "auto-4", "auto-5", "auto-6", "auto-7", "auto-8"}
	if ids := e.checkpointIDs("autos"); !slices.Equal(ids, want) {
		t.Errorf("after the next restore: %v, want %v", ids, want)
	}
	// The data of pruned checkpoints is gone with them.
	var snaps, dirs []string
	for _, id := range want {
		snaps = append(snaps, sb.ID+"."+id)
		dirs = append(dirs, id)
	}
	slices.Sort(snaps)
	slices.Sort(dirs)
	if got := e.snapshots(); !slices.Equal(got, snaps) {
		t.Errorf("snapshots %v, want %v", got, snaps)
	}
	var got []string
	entries, _ := os.ReadDir(e.checkpointsDir(sb.ID))
	for _, d := range entries {
		got = append(got, d.Name())
	}
	if !slices.Equal(got, dirs) {
		t.Errorf("checkpoint directories %v, want %v", got, dirs)
	}
}

// TestRestoreFailure checks that a restore the runtime fails leaves the
// sandbox in error, with its checkpoints, and that restoring again mends it.
func TestRestoreFailure(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "mend"})
	e.checkpoint("mend", true)
	e.rt.FailNext("restore", errors.New("runsc: boom"))
	if _, err := e.cps.RestoreCheckpoint(e.ctx, "mend", "v1"); err == nil || !strings.Contains(err.Error(), "restoring mend to v1") {
		t.Fatalf("RestoreCheckpoint: %v", err)
	}
	got, _ := e.m.Get(e.ctx, "mend")
	if rec := e.record(sb.ID); got.State != api.StateError || !strings.Contains(rec.Error, "boom") {
		t.Errorf("after a failed restore: state %s, error %q", got.State, rec.Error)
	}
	if _, _, err := e.guest().CheckExec(e.ctx, "mend"); !errors.Is(err, api.ErrConflict) {
		t.Errorf("CheckExec on a sandbox in error: %v, want conflict", err)
	}
	if _, err := e.cps.CreateCheckpoint(e.ctx, "mend", api.CreateCheckpoint{}); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), `"memory":false`) {
		t.Errorf("memory checkpoint of a sandbox in error: %v, want a conflict suggesting a disk-only one", err)
	}
	if cp := e.checkpoint("mend", false); cp.Memory {
		t.Errorf("disk-only checkpoint %+v", cp)
	}

	start := len(e.rt.CallsOf(sb.ID))
	if _, err := e.cps.RestoreCheckpoint(e.ctx, "mend", "v1"); err != nil {
		t.Fatalf("restoring again: %v", err)
	}
	// The sandbox was not running: the automatic checkpoint is of its disk.
	if calls, want := e.rt.CallsOf(sb.ID)[start:], []string{"delete", "restore"}; !slices.Equal(calls, want) {
		t.Errorf("runtime calls %v, want %v", calls, want)
	}
	if ids := e.checkpointIDs("mend"); !slices.Equal(ids, []string{"v1", "auto-1", "v2", "auto-2"}) {
		t.Errorf("checkpoints %v", ids)
	}
	if cp, _ := e.cps.GetCheckpoint(e.ctx, "mend", "auto-2"); cp == nil || cp.Memory {
		t.Errorf("automatic checkpoint of a sandbox in error: %+v", cp)
	}
	if got, _ := e.m.Get(e.ctx, "mend"); got.State != api.StateRunning || e.record(sb.ID).Error != "" {
		t.Errorf("after restoring again: %+v", got)
	}
	e.agentAnswers(sb.ID)
}

// TestFork makes sandboxes from a memory and from a disk-only checkpoint.
func TestFork(t *testing.T) {
	for _, tc := range []struct {
		name   string
		memory bool
		calls  []string
	}{
		{"memory", true, []string{"restore"}},
		{"disk only", false, []string{"start"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			src := e.create(api.CreateSandbox{Name: "src", Resources: &api.Resources{CPUs: 2, MemoryMiB: 1024}, Env: map[string]string{"A": "1"}})
			e.writeVolume(src.ID, "state.txt", "one")
			if _, err := e.cps.CreateCheckpoint(e.ctx, "src", api.CreateCheckpoint{Name: "golden", Memory: &tc.memory}); err != nil {
				t.Fatal(err)
			}
			e.writeVolume(src.ID, "state.txt", "two")

			fork, err := e.m.Create(e.ctx, api.CreateSandbox{
				Name: "fork", Env: map[string]string{"B": "2"},
				From: &api.ForkSource{Sandbox: "src", Checkpoint: "golden"},
			})
			if err != nil {
				t.Fatal(err)
			}
			// Template and resources come from the checkpoint; the source is
			// named by name and the checkpoint by id.
			if fork.Template != tinyTemplate || fork.Resources != src.Resources || fork.State != api.StateRunning ||
				fork.From == nil || *fork.From != (api.ForkSource{Sandbox: "src", Checkpoint: "v1"}) ||
				fork.Env["B"] != "2" || fork.Env["A"] != "" || fork.ID == src.ID {
				t.Errorf("fork %+v", fork)
			}
			if got := e.rt.CallsOf(fork.ID); !slices.Equal(got, tc.calls) {
				t.Errorf("runtime calls of the fork %v, want %v", got, tc.calls)
			}
			c, _ := e.rt.Get(fork.ID)
			if tc.memory && c.From != src.ID {
				t.Errorf("fork restored from %q, want %s", c.From, src.ID)
			}
			if c.Spec.Hostname != "fork" || c.Spec.CPUs != 2 || c.Spec.MemoryMiB != 1024 {
				t.Errorf("fork's spec %+v", c.Spec)
			}
			// The fork's agent answers to the fork's own token, not the
			// source's it woke up with.
			srcRec := e.record(src.ID)
			e.agentAnswers(fork.ID, e.token(src.ID), e.cpToken(src.ID, "v1"))
			e.agentAnswers(src.ID, e.token(fork.ID), e.cpToken(src.ID, "v1"))
			if e.record(fork.ID).NetIndex == srcRec.NetIndex {
				t.Error("the fork has its source's address")
			}
			// The fork has the checkpoint's disk, its own from then on.
			if s := e.readVolume(fork.ID, "state.txt"); s != "one" {
				t.Errorf("fork's disk %q, want one", s)
			}
			e.writeVolume(fork.ID, "state.txt", "fork")
			if s := e.readVolume(src.ID, "state.txt"); s != "two" {
				t.Errorf("source's disk %q, want two", s)
			}
			if ids := e.checkpointIDs("fork"); len(ids) != 0 {
				t.Errorf("the fork has checkpoints %v", ids)
			}
			// It outlives its source.
			must(t, e.m.Delete(e.ctx, "src"))
			e.requireGone(src.ID)
			e.agentAnswers(fork.ID)
			if got, err := e.m.Get(e.ctx, "fork"); err != nil || got.State != api.StateRunning {
				t.Errorf("fork after deleting its source: %+v, %v", got, err)
			}
		})
	}
}

func TestForkRefused(t *testing.T) {
	e := newEnv(t)
	e.create(api.CreateSandbox{Name: "src"})
	e.checkpoint("src", false)
	from := &api.ForkSource{Sandbox: "src", Checkpoint: "v1"}
	const settings = "a fork takes its template or image and its resources from the checkpoint; don't give them"
	for _, tc := range []struct {
		name string
		req  api.CreateSandbox
		want error
		msg  string
	}{
		{"template", api.CreateSandbox{From: from, Template: tinyTemplate}, api.ErrInvalid, settings},
		{"image", api.CreateSandbox{From: from, Image: "debian"}, api.ErrInvalid, settings},
		{"resources", api.CreateSandbox{From: from, Resources: &api.Resources{CPUs: 1}}, api.ErrInvalid, settings},
		{"empty resources", api.CreateSandbox{From: from, Resources: &api.Resources{}}, api.ErrInvalid, settings},
		{"no checkpoint", api.CreateSandbox{From: &api.ForkSource{Sandbox: "src"}}, api.ErrInvalid, "from: give both sandbox and checkpoint"},
		{"missing sandbox", api.CreateSandbox{From: &api.ForkSource{Sandbox: "nope", Checkpoint: "v1"}}, api.ErrNotFound, `sandbox "nope" not found`},
		{"missing checkpoint", api.CreateSandbox{From: &api.ForkSource{Sandbox: "src", Checkpoint: "v7"}}, api.ErrNotFound, `checkpoint "v7" of sandbox src not found`},
		{"name in use", api.CreateSandbox{From: from, Name: "src"}, api.ErrConflict, `name "src" is in use`},
		{"bad name", api.CreateSandbox{From: from, Name: "Src"}, api.ErrInvalid, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.m.Create(e.ctx, tc.req)
			var ae *api.Error
			if !errors.Is(err, tc.want) || !errors.As(err, &ae) || (tc.msg != "" && ae.Message != tc.msg) {
				t.Errorf("Create: %v, want %v with message %q", err, tc.want, tc.msg)
			}
		})
	}
	if all, _ := e.m.List(e.ctx, nil); len(all) != 1 {
		t.Errorf("sandboxes %v", all)
	}
}

// TestForkFailure checks that a fork the runtime fails leaves nothing, and
// takes nothing from its source.
func TestForkFailure(t *testing.T) {
	e := newEnv(t)
	src := e.create(api.CreateSandbox{Name: "src"})
	e.checkpoint("src", true)
	e.rt.FailNext("restore", errors.New("runsc: boom"))
	_, err := e.m.Create(e.ctx, api.CreateSandbox{Name: "fork", From: &api.ForkSource{Sandbox: "src", Checkpoint: "v1"}})
	if err == nil || !strings.Contains(err.Error(), "forking src at v1") {
		t.Fatalf("fork: %v", err)
	}
	if _, err := e.m.Get(e.ctx, "fork"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get(fork): %v", err)
	}
	if ids := e.rt.IDs(); !slices.Equal(ids, []string{src.ID}) {
		t.Errorf("containers %v", ids)
	}
	if v := e.volumes(); !slices.Equal(v, []string{src.ID}) {
		t.Errorf("volumes %v", v)
	}
	if s := e.snapshots(); !slices.Equal(s, []string{src.ID + ".v1"}) {
		t.Errorf("snapshots %v", s)
	}
	// The checkpoint still makes forks.
	fork := e.create(api.CreateSandbox{Name: "fork", From: &api.ForkSource{Sandbox: "src", Checkpoint: "v1"}})
	e.agentAnswers(fork.ID)
}

// TestStaleRecordReusesCheckpointID holds a checkpoint request between
// reading the sandbox's record and starting its work, while another
// checkpoint is taken. The held one then works from a stale record.
//
// It fails today: the held request numbers its checkpoint from the stale
// CheckpointSeq, so it takes v1 again; its disk snapshot collides with v1's,
// and the clean-up of the failed checkpoint deletes v1's snapshot, leaving a
// checkpoint record that cannot be restored. The same stale record also
// overwrites whatever the other operation stored (state, sequences).
func TestStaleRecordReusesCheckpointID(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "stale"})
	read, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.st.setAfterGet(func(ref string) {
		if ref == sb.ID {
			once.Do(func() {
				close(read)
				<-release
			})
		}
	})
	var late *api.Checkpoint
	var lateErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		late, lateErr = e.cps.CreateCheckpoint(e.ctx, sb.ID, api.CreateCheckpoint{Memory: ptr(false)})
	}()
	<-read
	e.st.setAfterGet(nil)
	first := e.checkpoint("stale", false)
	close(release)
	<-done

	if first.ID != "v1" {
		t.Fatalf("first checkpoint %s", first.ID)
	}
	if lateErr != nil || late.ID != "v2" {
		t.Errorf("the held checkpoint: %+v, %v; want v2", late, lateErr)
	}
	if !slices.Contains(e.snapshots(), sb.ID+".v1") {
		t.Errorf("v1's disk snapshot is gone: snapshots %v", e.snapshots())
	}
	if _, err := e.cps.RestoreCheckpoint(e.ctx, "stale", "v1"); err != nil {
		t.Errorf("restoring v1: %v", err)
	}
}

// TestFailedCheckpointSetsLimitsAgain: a memory checkpoint that fails part
// way (the runtime lifts the CPU quota while it writes) leaves the sandbox
// with its limits set again.
func TestFailedCheckpointSetsLimitsAgain(t *testing.T) {
	for _, op := range []string{"checkpoint", "resume"} {
		t.Run(op+" fails", func(t *testing.T) {
			e := newEnv(t)
			sb := e.create(api.CreateSandbox{Name: "capped", Resources: &api.Resources{CPUs: 0.5, MemoryMiB: 256}})
			e.rt.FailNext(op, errors.New("injected"))
			if _, err := e.cps.CreateCheckpoint(e.ctx, "capped", api.CreateCheckpoint{}); err == nil {
				t.Fatal("the checkpoint succeeded")
			}
			calls := e.rt.CallsOf(sb.ID)
			if calls[len(calls)-1] != "setlimits" {
				t.Errorf("runtime calls %v, want setlimits last", calls)
			}
			if c, _ := e.rt.Get(sb.ID); c.Limits == nil || *c.Limits != (runtime.Limits{CPUs: 0.5, MemoryMiB: 256}) {
				t.Errorf("limits after the failed checkpoint %+v", c.Limits)
			}
		})
	}
}

// TestForkDiskLimit: a fork takes its source's disk limit unless it gives
// its own, and only that of the resources; the copy pool says the limit is
// not enforced.
func TestForkDiskLimit(t *testing.T) {
	e := newEnv(t)
	src := e.create(api.CreateSandbox{Name: "src", Resources: &api.Resources{CPUs: 2, MemoryMiB: 1024, DiskMiB: 2048}})
	e.checkpoint("src", false)
	from := &api.ForkSource{Sandbox: "src", Checkpoint: "v1"}
	for _, tc := range []struct {
		name string
		res  *api.Resources
		want int
	}{
		{"source's", nil, 2048},
		{"own", &api.Resources{DiskMiB: 512}, 512},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fork, err := e.m.Create(e.ctx, api.CreateSandbox{From: from, Resources: tc.res})
			if err != nil {
				t.Fatal(err)
			}
			want := src.Resources
			want.DiskMiB = tc.want
			if fork.Resources != want {
				t.Errorf("fork's resources %+v, want %+v", fork.Resources, want)
			}
			got, err := e.m.Get(e.ctx, fork.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Disk == nil || got.Disk.LimitMiB != tc.want || got.Disk.Enforced || got.Disk.UsedBytes != nil {
				t.Errorf("fork's disk %+v, want limit %d, not enforced nor measured on the copy pool", got.Disk, tc.want)
			}
		})
	}
}

// TestRestoreRefusedWhenKeepingStateFails: when the checkpoint that keeps
// a running sandbox's state (and stops it) fails, the restore is refused
// and the sandbox runs on as it was: its disk, its token, its limits, no
// automatic checkpoint, and no disk staged for the restore left behind.
func TestRestoreRefusedWhenKeepingStateFails(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "stay"})
	e.writeVolume(sb.ID, "state.txt", "one")
	e.checkpoint("stay", true)
	e.writeVolume(sb.ID, "state.txt", "two")
	start := len(e.rt.CallsOf(sb.ID))
	e.rt.FailNext("checkpoint", errors.New("no space for the image"))
	if _, err := e.cps.RestoreCheckpoint(e.ctx, "stay", "v1"); err == nil {
		t.Fatal("the restore succeeded without its automatic checkpoint")
	}
	if calls, want := e.rt.CallsOf(sb.ID)[start:], []string{"checkpoint", "setlimits"}; !slices.Equal(calls, want) {
		t.Errorf("runtime calls %v, want %v", calls, want)
	}
	if rec := e.record(sb.ID); rec.State != api.StateRunning || rec.RestoreTarget != "" {
		t.Errorf("state %s, restore target %q; want running, none", rec.State, rec.RestoreTarget)
	}
	if s := e.readVolume(sb.ID, "state.txt"); s != "two" {
		t.Errorf("disk %q, want two", s)
	}
	if ids := e.checkpointIDs("stay"); !slices.Equal(ids, []string{"v1"}) {
		t.Errorf("checkpoints %v", ids)
	}
	if got := e.volumes(); !slices.Equal(got, []string{sb.ID}) {
		t.Errorf("volumes %v, want only %s", got, sb.ID)
	}
	e.agentAnswers(sb.ID)
}
