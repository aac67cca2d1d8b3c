package sleep

// The sleep capability's own rules: the images on disk (their layout, what
// a crash part-way leaves) and idle sleep over a fake core. The tests over
// a whole Manager (a sleep and a wake of a sandbox of the fake runtime, a
// crash part-way, calls that wake it, idle sleep putting one to sleep) are
// in internal/sandbox/sleep_test.go and relay_test.go.

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestImages: an image is the sandbox's only once committed, under the
// layout a daemon of another version expects; a drop removes it, and a
// drop a crash cut short is swept.
func TestImages(t *testing.T) {
	data := t.TempDir()
	im := NewImages(data)
	const id = "sb-000000000001"
	sbDir := filepath.Join(data, "sandboxes", id)
	if got, want := im.Dir(id), filepath.Join(sbDir, "sleep"); got != want {
		t.Errorf("Dir %s, want %s", got, want)
	}
	if got, want := im.Image(id), filepath.Join(sbDir, "sleep", "mem"); got != want {
		t.Errorf("Image %s, want %s", got, want)
	}
	if ok, err := im.Has(id); ok || err != nil {
		t.Fatalf("Has before a sleep: %v %v", ok, err)
	}
	if gen := im.HeldGen(id, 7); gen != 7 {
		t.Errorf("HeldGen without an image: %d, want the fallback 7", gen)
	}

	img, err := im.Begin(id)
	if err != nil {
		t.Fatal(err)
	}
	// Where recovery looks for an unfinished image: sleep/.tmp-*/mem.
	if m, _ := filepath.Match(filepath.Join(im.Dir(id), ".tmp-*", "mem"), img); !m {
		t.Errorf("Begin gave %s, not sleep/.tmp-*/mem", img)
	}
	// The runtime writes the image there.
	if err := os.MkdirAll(img, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(img, "pages"), []byte("memory"), 0o600); err != nil {
		t.Fatal(err)
	}
	if ok, _ := im.Has(id); ok {
		t.Fatal("an image counts before it is committed")
	}
	if err := im.Commit(id, img, 3); err != nil {
		t.Fatal(err)
	}
	if ok, err := im.Has(id); !ok || err != nil {
		t.Fatalf("Has after Commit: %v %v", ok, err)
	}
	if b, err := os.ReadFile(filepath.Join(im.Image(id), "pages")); err != nil || string(b) != "memory" {
		t.Errorf("the committed image holds %q, %v", b, err)
	}
	if gen := im.HeldGen(id, 7); gen != 3 {
		t.Errorf("HeldGen %d, want 3", gen)
	}
	if left, _ := filepath.Glob(filepath.Join(im.Dir(id), ".tmp-*")); len(left) != 0 {
		t.Errorf("Commit left %v", left)
	}

	// A sleep begun again starts from nothing.
	if _, err := im.Begin(id); err != nil {
		t.Fatal(err)
	}
	if ok, _ := im.Has(id); ok {
		t.Error("Begin kept the image of an earlier sleep")
	}

	if err := im.Drop(id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(im.Dir(id)); !os.IsNotExist(err) {
		t.Errorf("the sleep dir is still there after Drop: %v", err)
	}
	if err := im.Drop(id); err != nil {
		t.Errorf("Drop without a sleep dir: %v", err)
	}

	// A drop cut short after its rename: the rest is swept, once.
	gone := filepath.Join(sbDir, ".sleep-dropped")
	if err := os.MkdirAll(filepath.Join(gone, "mem"), 0o700); err != nil {
		t.Fatal(err)
	}
	if swept, err := im.Sweep(id); !swept || err != nil {
		t.Fatalf("Sweep: %v %v", swept, err)
	}
	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Errorf("Sweep left %s: %v", gone, err)
	}
	if swept, err := im.Sweep(id); swept || err != nil {
		t.Errorf("Sweep with nothing left: %v %v", swept, err)
	}
}

// fakeCore has idle times set by the test, and remembers the sleeps asked.
type fakeCore struct {
	mu     sync.Mutex
	idle   map[string]time.Duration // how long each has been idle
	fail   map[string]error         // what SleepIfIdle answers
	slept  []string
	rounds chan struct{} // a value per SleepIfIdle, if not nil
}

func (c *fakeCore) IdleFor(id string, now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.idle[id]
}

func (c *fakeCore) SleepIfIdle(ctx context.Context, id string, idle time.Duration, now time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idle[id] < idle {
		return errors.New("asked to sleep a sandbox that is not idle")
	}
	if c.rounds != nil {
		select {
		case c.rounds <- struct{}{}:
		default:
		}
	}
	if err := c.fail[id]; err != nil {
		return err
	}
	c.slept = append(c.slept, id)
	return nil
}

func (c *fakeCore) sleeps() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.slept)
}

// records lists fixed records.
type records []*store.Sandbox

func (r records) ListSandboxes(context.Context, store.Filter) ([]*store.Sandbox, error) {
	return r, nil
}

func record(id string, state api.State, idle, pool string) *store.Sandbox {
	return &store.Sandbox{Sandbox: api.Sandbox{ID: id, Name: id, State: state, Idle: idle}, Pool: pool}
}

// TestSleepIdle: a round puts to sleep the running sandboxes idle past
// their own idle or, saying none, the default; never one whose idle is 0 or
// unreadable, one not running, or a warm pool's member; a failure to put
// one to sleep does not keep the others awake, and is reported.
func TestSleepIdle(t *testing.T) {
	core := &fakeCore{
		idle: map[string]time.Duration{
			"own-idle": 11 * time.Minute, "own-busy": 9 * time.Minute,
			"dflt-idle": 2 * time.Hour, "dflt-busy": 59 * time.Minute,
			"never": 10 * time.Hour, "bad": 10 * time.Hour,
			"asleep": 10 * time.Hour, "broken": 10 * time.Hour, "member": 10 * time.Hour,
			"fails": 10 * time.Hour,
		},
		fail: map[string]error{"fails": errors.New("no room for the image")},
	}
	sbs := records{
		record("own-idle", api.StateRunning, "10m", ""),
		record("own-busy", api.StateRunning, "10m", ""),
		record("dflt-idle", api.StateRunning, "", ""),
		record("dflt-busy", api.StateRunning, "", ""),
		record("never", api.StateRunning, "0", ""),
		record("bad", api.StateRunning, "soon", ""),
		record("asleep", api.StateSleeping, "10m", ""),
		record("broken", api.StateError, "10m", ""),
		record("member", api.StateRunning, "10m", "template:base"),
		record("fails", api.StateRunning, "10m", ""),
	}
	s := New(core, sbs, Config{Idle: time.Hour}, slog.New(slog.DiscardHandler))
	err := s.SleepIdle(t.Context(), time.Now())
	if err == nil || err.Error() != "no room for the image" {
		t.Errorf("SleepIdle: %v, want the failure of fails", err)
	}
	if got, want := core.sleeps(), []string{"own-idle", "dflt-idle"}; !slices.Equal(got, want) {
		t.Errorf("slept %v, want %v", got, want)
	}

	// Without a default idle, a sandbox saying none never sleeps.
	core.slept = nil
	s = New(core, sbs[:4], Config{}, slog.New(slog.DiscardHandler))
	must(t, s.SleepIdle(t.Context(), time.Now()))
	if got, want := core.sleeps(), []string{"own-idle"}; !slices.Equal(got, want) {
		t.Errorf("slept %v without a default idle, want %v", got, want)
	}
}

// TestRun: the component runs rounds every so often until its ctx ends,
// then returns nil; started with its ctx ended, it runs none.
func TestRun(t *testing.T) {
	core := &fakeCore{idle: map[string]time.Duration{"a": time.Hour}, rounds: make(chan struct{}, 1)}
	sbs := records{record("a", api.StateRunning, "1m", "")}
	s := New(core, sbs, Config{Every: time.Millisecond}, slog.New(slog.DiscardHandler))

	ended, cancel := context.WithCancel(t.Context())
	cancel()
	must(t, s.Run(ended))
	if got := core.sleeps(); len(got) != 0 {
		t.Errorf("a Run whose ctx had ended ran a round: %v", got)
	}

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-core.rounds:
	case <-time.After(10 * time.Second):
		t.Fatal("no round in 10 s")
	}
	cancel()
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run still running 10 s after its ctx ended")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
