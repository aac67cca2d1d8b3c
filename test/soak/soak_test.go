package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// TestSoak runs a seeded random sequence of loam's operations (create,
// commands, memory and disk-only checkpoints, restore in place, fork, sleep,
// wake, delete of checkpoints and sandboxes) and after every step checks
// each sandbox against a model of what its checkpoint history says it must
// hold: a counter on its disk, a counter in its memory (/dev/shm) and a
// process that only a memory checkpoint keeps. Checkpoint ids must never
// repeat, and the listed checkpoints must be exactly the model's.
//
// The suite runs it for 20 s (LOAM_SOAK) with a new seed each time. A failure prints
// the seed; replay it, or soak longer, with
//
//	LOAM_SOAK_SEED=N LOAM_SOAK=30m go test -run TestSoak -v -timeout 45m ./test/
func TestSoak(t *testing.T) {
	t.Parallel()
	dur := envDur(t, "LOAM_SOAK", 20*time.Second)
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("LOAM_SOAK_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("LOAM_SOAK_SEED: %v", err)
		}
	}
	t.Logf("soak seed %d (replay with LOAM_SOAK_SEED=%d)", seed, seed)
	s := &soak{t: t, d: harness.StartDaemon(t), r: rand.New(rand.NewPCG(seed, seed^0x5eed)), seed: seed, seen: map[string]bool{}}
	// Not ctxT's three minutes: a soak on demand runs longer.
	ctx, cancel := context.WithTimeout(context.Background(), dur+10*time.Minute)
	t.Cleanup(cancel)
	s.ctx = ctx
	s.create()
	end := time.Now().Add(dur)
	for step := 1; time.Now().Before(end); step++ {
		s.step(step)
		s.check()
	}
	t.Logf("soak: %d steps in %s: %s", len(s.history), dur, s.counts())
}

// soakBox is the model of one sandbox.
type soakBox struct {
	name   string
	disk   int  // the counter in /home/loam/count
	mem    int  // the counter in /dev/shm/count; -1 when memory is fresh
	proc   bool // the counter process runs
	asleep bool
	cps    []soakCP
}

// soakCP is the model of a checkpoint: what a restore or fork of it gives.
type soakCP struct {
	id, name string
	disk     int
	mem      int // -1 for a disk-only checkpoint
	proc     bool
}

type soak struct {
	t       *testing.T
	d       *harness.Daemon
	ctx     context.Context
	r       *rand.Rand
	seed    uint64
	boxes   []*soakBox
	made    int
	seen    map[string]bool // every sandbox/checkpoint id ever given
	history []string
}

// fail stops the soak with the seed and the last steps.
func (s *soak) fail(format string, args ...any) {
	s.t.Helper()
	last := s.history[max(0, len(s.history)-12):]
	s.t.Fatalf("soak seed %d, step %d: %s\nlast steps:\n  %s\nreplay with LOAM_SOAK_SEED=%d",
		s.seed, len(s.history), fmt.Sprintf(format, args...), strings.Join(last, "\n  "), s.seed)
}

func (s *soak) log(format string, args ...any) {
	s.history = append(s.history, fmt.Sprintf(format, args...))
}

func (s *soak) counts() string {
	n := map[string]int{}
	for _, h := range s.history {
		op, _, _ := strings.Cut(h, " ")
		n[op]++
	}
	var parts []string
	for _, op := range slices.Sorted(func(yield func(string) bool) {
		for k := range n {
			if !yield(k) {
				return
			}
		}
	}) {
		parts = append(parts, fmt.Sprintf("%s %d", op, n[op]))
	}
	return strings.Join(parts, ", ")
}

func (s *soak) pick(pred func(*soakBox) bool) *soakBox {
	var c []*soakBox
	for _, b := range s.boxes {
		if pred(b) {
			c = append(c, b)
		}
	}
	if len(c) == 0 {
		return nil
	}
	return c[s.r.IntN(len(c))]
}

func awake(b *soakBox) bool    { return !b.asleep }
func anyBox(*soakBox) bool     { return true }
func hasCPs(b *soakBox) bool   { return len(b.cps) > 0 }
func withProc(b *soakBox) bool { return !b.asleep && !b.proc }

// step does one random operation and updates the model with what it must
// have done.
func (s *soak) step(n int) {
	switch op := s.r.IntN(20); {
	case op < 5:
		if b := s.pick(awake); b != nil {
			s.bump(b)
		}
	case op < 6:
		if b := s.pick(withProc); b != nil {
			s.startProc(b)
		}
	case op < 9:
		if b := s.pick(awake); b != nil {
			s.checkpoint(b, s.r.IntN(3) > 0)
		}
	case op < 12:
		if b := s.pick(hasCPs); b != nil {
			s.restore(b, b.cps[s.r.IntN(len(b.cps))])
		}
	case op < 14:
		if b := s.pick(hasCPs); b != nil && len(s.boxes) < 4 {
			s.fork(b, b.cps[s.r.IntN(len(b.cps))])
		}
	case op < 16:
		if b := s.pick(anyBox); b.asleep {
			s.wake(b)
		} else {
			s.sleep(b)
		}
	case op < 17:
		if b := s.pick(hasCPs); b != nil {
			s.deleteCP(b, s.r.IntN(len(b.cps)))
		}
	case op < 18:
		if len(s.boxes) > 1 {
			s.deleteBox(s.boxes[s.r.IntN(len(s.boxes))])
		}
	default:
		if len(s.boxes) < 4 {
			s.create()
		}
	}
}

func (s *soak) create() {
	s.made++
	name := fmt.Sprintf("soak-%d", s.made)
	s.log("create %s", name)
	if _, err := s.d.C.CreateSandbox(s.ctx, api.CreateSandbox{Name: name, Resources: &api.Resources{MemoryMiB: 256}}); err != nil {
		s.fail("create %s: %v", name, err)
	}
	s.boxes = append(s.boxes, &soakBox{name: name, mem: -1})
}

// bump adds one to both counters in one command.
func (s *soak) bump(b *soakBox) {
	s.log("bump %s", b.name)
	s.exec(b, `d=$(cat /home/loam/count 2>/dev/null || echo 0); echo $((d+1)) > /home/loam/count; `+
		`m=$(cat /dev/shm/count 2>/dev/null || echo 0); echo $((m+1)) > /dev/shm/count`)
	b.disk++
	b.mem = max(b.mem, 0) + 1
}

func (s *soak) startProc(b *soakBox) {
	s.log("proc %s", b.name)
	if _, err := s.d.C.CreateSession(s.ctx, b.name, api.ExecRequest{
		Cmd: []string{"sh", "-c", "echo $$ > /dev/shm/pid; exec sleep 100000000"},
	}); err != nil {
		s.fail("starting the counter process in %s: %v", b.name, err)
	}
	// The session answers once it runs; its pid file follows at once.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(s.exec(b, procCheck), "up") {
		if time.Now().After(deadline) {
			s.fail("the counter process of %s never wrote its pid", b.name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.proc = true
}

func (s *soak) checkpoint(b *soakBox, memory bool) {
	// Keep within the per-sandbox limit of checkpoints a user takes.
	for user := userCPs(b); len(user) >= 8; user = userCPs(b) {
		s.deleteCP(b, user[0])
	}
	name := ""
	if s.r.IntN(2) == 0 {
		name = fmt.Sprintf("cp-%d", len(s.history))
	}
	s.log("checkpoint %s memory=%v name=%q", b.name, memory, name)
	cp, err := s.d.C.CreateCheckpoint(s.ctx, b.name, api.CreateCheckpoint{Name: name, Memory: &memory})
	if err != nil {
		s.fail("checkpoint of %s: %v", b.name, err)
	}
	s.newID(b, cp.ID)
	m := soakCP{id: cp.ID, name: name, disk: b.disk, mem: -1}
	if memory {
		m.mem, m.proc = b.mem, b.proc
	}
	b.cps = append(b.cps, m)
}

// newID records a checkpoint id a sandbox was given: ids are a
// sandbox's own (v1, v2, …) and are never given twice, deleted or not.
// userCPs are the indexes of b's checkpoints that are not automatic.
func userCPs(b *soakBox) []int {
	var user []int
	for i, cp := range b.cps {
		if !strings.HasPrefix(cp.id, "auto-") {
			user = append(user, i)
		}
	}
	return user
}

func (s *soak) newID(b *soakBox, id string) {
	key := b.name + "/" + id
	if s.seen[key] {
		s.fail("checkpoint id %s of %s given twice", id, b.name)
	}
	s.seen[key] = true
}

func (s *soak) restore(b *soakBox, cp soakCP) {
	s.log("restore %s %s", b.name, cp.id)
	// The automatic checkpoint keeps what the sandbox held before: its
	// memory too, unless it was asleep (then it is its sleep image's).
	before := soakCP{disk: b.disk, mem: b.mem, proc: b.proc}
	if _, err := s.d.C.RestoreCheckpoint(s.ctx, b.name, cp.id); err != nil {
		s.fail("restore of %s to %s: %v", b.name, cp.id, err)
	}
	b.disk, b.mem, b.proc, b.asleep = cp.disk, cp.mem, cp.proc, false
	// Find the automatic checkpoint among the listed ones, and drop
	// from the model the automatic ones the daemon pruned.
	listed := s.listCPs(b)
	for _, l := range listed {
		if !slices.ContainsFunc(b.cps, func(m soakCP) bool { return m.id == l.ID }) {
			if !strings.HasPrefix(l.ID, "auto-") {
				s.fail("after a restore of %s, %s is listed, which is no automatic checkpoint", b.name, l.ID)
			}
			s.newID(b, l.ID)
			before.id, before.name = l.ID, l.Name
			if !l.Memory {
				before.mem, before.proc = -1, false
			}
			b.cps = append(b.cps, before)
		}
	}
	b.cps = slices.DeleteFunc(b.cps, func(m soakCP) bool {
		return strings.HasPrefix(m.id, "auto-") &&
			!slices.ContainsFunc(listed, func(l api.Checkpoint) bool { return l.ID == m.id })
	})
}

func (s *soak) fork(b *soakBox, cp soakCP) {
	s.made++
	name := fmt.Sprintf("soak-%d", s.made)
	s.log("fork %s %s -> %s", b.name, cp.id, name)
	if _, err := s.d.C.Fork(s.ctx, b.name, cp.id, name); err != nil {
		s.fail("fork of %s at %s: %v", b.name, cp.id, err)
	}
	s.boxes = append(s.boxes, &soakBox{name: name, disk: cp.disk, mem: cp.mem, proc: cp.proc})
}

func (s *soak) sleep(b *soakBox) {
	s.log("sleep %s", b.name)
	if _, err := s.d.C.Sleep(s.ctx, b.name); err != nil {
		s.fail("sleep of %s: %v", b.name, err)
	}
	b.asleep = true
}

func (s *soak) wake(b *soakBox) {
	s.log("wake %s", b.name)
	if _, err := s.d.C.Wake(s.ctx, b.name); err != nil {
		s.fail("wake of %s: %v", b.name, err)
	}
	b.asleep = false
}

func (s *soak) deleteCP(b *soakBox, i int) {
	cp := b.cps[i]
	s.log("uncheckpoint %s %s", b.name, cp.id)
	if err := s.d.C.DeleteCheckpoint(s.ctx, b.name, cp.id); err != nil {
		s.fail("deleting checkpoint %s of %s: %v", cp.id, b.name, err)
	}
	b.cps = slices.Delete(b.cps, i, i+1)
}

func (s *soak) deleteBox(b *soakBox) {
	s.log("delete %s", b.name)
	if err := s.d.C.DeleteSandbox(s.ctx, b.name); err != nil {
		s.fail("deleting %s: %v", b.name, err)
	}
	s.boxes = slices.DeleteFunc(s.boxes, func(x *soakBox) bool { return x == b })
}

const procCheck = `p=$(cat /dev/shm/pid 2>/dev/null); [ -n "$p" ] && kill -0 "$p" 2>/dev/null && echo up || echo down`

func (s *soak) exec(b *soakBox, script string) string {
	out, errOut, code, err := s.d.C.Output(s.ctx, b.name, "sh", "-c", script)
	if err != nil || code != 0 {
		s.fail("in %s: %q: exit %d, %v, %s", b.name, script, code, err, errOut)
	}
	return string(out)
}

func (s *soak) listCPs(b *soakBox) []api.Checkpoint {
	cps, err := s.d.C.ListCheckpoints(s.ctx, b.name)
	if err != nil {
		s.fail("listing the checkpoints of %s: %v", b.name, err)
	}
	return cps
}

// check compares every sandbox with its model: state, checkpoints, and
// for the awake ones the counters and the counter process.
func (s *soak) check() {
	all, err := s.d.C.ListSandboxes(s.ctx, client.ListOptions{})
	if err != nil {
		s.fail("listing sandboxes: %v", err)
	}
	if len(all) != len(s.boxes) {
		s.fail("%d sandboxes listed, the model has %d", len(all), len(s.boxes))
	}
	for _, b := range s.boxes {
		got, err := s.d.C.GetSandbox(s.ctx, b.name)
		if err != nil {
			s.fail("reading %s: %v", b.name, err)
		}
		want := api.StateRunning
		if b.asleep {
			want = api.StateSleeping
		}
		if got.State != want {
			s.fail("%s is %s, not %s", b.name, got.State, want)
		}
		listed := s.listCPs(b)
		var ids, modelIDs []string
		for _, l := range listed {
			ids = append(ids, l.ID)
		}
		for _, m := range b.cps {
			modelIDs = append(modelIDs, m.id)
		}
		slices.Sort(ids)
		slices.Sort(modelIDs)
		if !slices.Equal(ids, modelIDs) {
			s.fail("%s lists checkpoints %v, the model %v", b.name, ids, modelIDs)
		}
		if b.asleep {
			continue
		}
		out := strings.Fields(s.exec(b, `cat /home/loam/count 2>/dev/null || echo 0; cat /dev/shm/count 2>/dev/null || echo -1; `+procCheck))
		wantOut := []string{strconv.Itoa(b.disk), strconv.Itoa(b.mem), map[bool]string{true: "up", false: "down"}[b.proc]}
		if !slices.Equal(out, wantOut) {
			s.fail("%s holds disk, memory, process = %v; its history says %v", b.name, out, wantOut)
		}
	}
}
