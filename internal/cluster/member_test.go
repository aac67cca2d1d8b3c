package cluster

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// fakeRecords is a database the test can cut off, or take the node's
// epoch from.
type fakeRecords struct {
	mu     sync.Mutex
	down   bool
	fenced bool
	epoch  int64
	fence  int64
	nodes  []*store.Node
}

var errDown = errors.New("the database is not reachable")
var errFenced = errors.New("fenced")

func (f *fakeRecords) JoinNode(ctx context.Context, n store.Node, lease time.Duration) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.epoch++
	return f.epoch, nil
}

func (f *fakeRecords) RenewNode(ctx context.Context, name string, epoch int64, lease time.Duration, load api.NodeLoad) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.down:
		return errDown
	case f.fenced:
		return errFenced
	}
	return nil
}

func (f *fakeRecords) ListNodes(ctx context.Context) ([]*store.Node, time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, time.Time{}, errDown
	}
	return f.nodes, time.Now(), nil
}

func (f *fakeRecords) SetFence(node string, epoch int64) {
	f.mu.Lock()
	f.fence = epoch
	f.mu.Unlock()
}

func (f *fakeRecords) set(fn func(*fakeRecords)) {
	f.mu.Lock()
	fn(f)
	f.mu.Unlock()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMemberLease: a node joined fences its store at its epoch; cut off
// from the database it goes on until its lease runs out, then refuses
// changes (not reads) until a renewal succeeds; a renewal refused for its
// epoch ends Run with an error.
func TestMemberLease(t *testing.T) {
	recs := &fakeRecords{nodes: []*store.Node{{Name: "other", LeaseUntil: time.Now().Add(-time.Second)}}}
	load := func(context.Context) api.NodeLoad { return api.NodeLoad{Role: RoleNode} }
	m, err := Join(context.Background(), recs, Config{Name: "n1", Address: "http://x", Lease: 300 * time.Millisecond, Load: load, Fenced: errFenced}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if recs.fence != 1 || m.Epoch() != 1 || !m.Live() {
		t.Fatalf("after the join: fence %d, epoch %d, live %v", recs.fence, m.Epoch(), m.Live())
	}
	if _, lapsed := m.Lapsed("other"); !lapsed {
		t.Errorf("a node whose lease ran out is not lapsed")
	}
	if _, lapsed := m.Lapsed("gone"); lapsed {
		t.Errorf("a node the cluster does not know is lapsed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()

	gate := m.Gate(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	call := func(method string, upgrade bool) int {
		r := httptest.NewRequest(method, "/v1/sandboxes/x", nil)
		if upgrade {
			r.Header.Set("Upgrade", "websocket")
		}
		w := httptest.NewRecorder()
		gate.ServeHTTP(w, r)
		return w.Code
	}
	time.Sleep(400 * time.Millisecond) // beyond one lease: renewals hold it
	if !m.Live() || call("POST", false) != http.StatusNoContent {
		t.Fatalf("a node renewing its lease refuses a change")
	}

	recs.set(func(f *fakeRecords) { f.down = true })
	waitFor(t, "the lease to lapse", func() bool { return !m.Live() })
	if c := call("POST", false); c != http.StatusServiceUnavailable {
		t.Errorf("a change while lapsed: %d, want 503", c)
	}
	if c := call("GET", true); c != http.StatusServiceUnavailable {
		t.Errorf("a WebSocket while lapsed: %d, want 503", c)
	}
	if c := call("GET", false); c != http.StatusNoContent {
		t.Errorf("a read while lapsed: %d, want it served", c)
	}

	recs.set(func(f *fakeRecords) { f.down = false })
	waitFor(t, "the lease back", m.Live)
	if c := call("DELETE", false); c != http.StatusNoContent {
		t.Errorf("a change once the lease is back: %d", c)
	}

	recs.set(func(f *fakeRecords) { f.fenced = true })
	select {
	case err := <-done:
		if err == nil || !errors.Is(err, errFenced) {
			t.Errorf("Run once fenced: %v, want the fence's error", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run goes on once its epoch is taken")
	}
}
