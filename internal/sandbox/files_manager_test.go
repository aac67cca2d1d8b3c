package sandbox_test

import (
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/guest"
)

// The fake runtime runs the real agent on the host: these tests give it
// paths in their temp dirs only, as root (the host has no user loam).

// TestFilesThroughManager: a file goes up and back down through the
// Manager and the sandbox's agent; an agent older than the files API gets a
// clear refusal.
func TestFilesThroughManager(t *testing.T) {
	e := newEnv(t)
	sb := e.create(api.CreateSandbox{Name: "files"})
	p := filepath.Join(t.TempDir(), "a", "b.txt")
	q := guest.FileQuery{Path: p, User: "root"}

	if _, err := e.guest().WriteFile(e.ctx, "files", q, "0600", strings.NewReader("hi"), 2); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	r, size, err := e.guest().ReadFile(e.ctx, "files", q)
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	b, err := io.ReadAll(r)
	r.Close()
	if err != nil || string(b) != "hi" || size != 2 {
		t.Errorf("read %q (size %d), %v", b, size, err)
	}
	_, err = e.guest().StatFile(e.ctx, "files", guest.FileQuery{Path: p + ".nope", User: "root"}, 0)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeNotFound {
		t.Errorf("a missing file: %v", err)
	}

	e.m.SetAgentVersion(sb.ID, 2)
	_, err = e.guest().StatFile(e.ctx, "files", q, 0)
	if !errors.As(err, &ae) || ae.Code != api.CodeConflict || !strings.Contains(ae.Message, "the files API needs a newer agent") {
		t.Errorf("with an agent of protocol 2: %v", err)
	}
}

// TestWatchEndsAtMemoryCheckpoint: a memory checkpoint ends a watch stream
// with a reason; a disk-only one does not.
func TestWatchEndsAtMemoryCheckpoint(t *testing.T) {
	e := newEnv(t)
	e.create(api.CreateSandbox{Name: "w"})
	st, err := e.guest().Watch(e.ctx, "w", guest.FileQuery{Path: t.TempDir(), User: "root"}, false)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer st.Close()
	e.checkpoint("w", false)
	select {
	case <-st.Ended():
		t.Fatalf("a disk-only checkpoint ended the watch: %s", st.Reason())
	case <-time.After(100 * time.Millisecond):
	}
	done := make(chan struct{})
	go func() {
		<-st.Ended()
		st.Close() // as the server does once it has closed its client's socket
		close(done)
	}()
	e.checkpoint("w", true)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a memory checkpoint did not end the watch")
	}
	if !strings.Contains(st.Reason(), "checkpointed") {
		t.Errorf("reason %q", st.Reason())
	}
}
