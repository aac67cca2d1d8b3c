package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"loam.dev/loam/internal/store/postgres/pgtest"
)

// TestHold: one daemon holds a database at a time; a second is refused
// with ErrHeld while the first runs, and takes it once the first closed.
func TestHold(t *testing.T) {
	url := pgtest.NewDatabase(t)
	open := func() *Store {
		t.Helper()
		s, err := Open(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	first, second := open(), open()
	defer second.Close()
	if err := first.Hold(t.Context()); err != nil {
		t.Fatalf("the first daemon's hold: %v", err)
	}
	if err := second.Hold(t.Context()); !errors.Is(err, ErrHeld) {
		t.Errorf("a second daemon's hold while the first runs: %v, want ErrHeld", err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if err := second.Hold(t.Context()); err != nil {
		t.Errorf("the second daemon's hold once the first closed: %v", err)
	}
}

// TestID: a database's id stays the same across opens, and two databases
// have two.
func TestID(t *testing.T) {
	ids := map[string]bool{}
	for range 2 {
		url := pgtest.NewDatabase(t)
		var first string
		for i := range 2 {
			s, err := Open(t.Context(), url)
			if err != nil {
				t.Fatal(err)
			}
			id, err := s.ID(t.Context())
			s.Close()
			if err != nil || id == "" {
				t.Fatalf("ID: %q, %v", id, err)
			}
			if i == 0 {
				first = id
			} else if id != first {
				t.Errorf("the id of one database changed across opens: %s, then %s", first, id)
			}
		}
		ids[first] = true
	}
	if len(ids) != 2 {
		t.Errorf("two databases have ids %v, want two", ids)
	}
}

// TestKeepHeld: the hold outlives a crash of the server (KeepHeld takes
// it again on a new connection, and another daemon is then refused), and
// a daemon whose hold another took meanwhile is told to stop (ErrHeld).
func TestKeepHeld(t *testing.T) {
	url := pgtest.NewDatabase(t)
	srv := pgtest.Shared()
	open := func() *Store {
		t.Helper()
		s, err := Open(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	restart := func() {
		t.Helper()
		if err := srv.Crash(); err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
	}
	keep := func(s *Store) (stop func(), done chan error) {
		ctx, cancel := context.WithCancel(t.Context())
		done = make(chan error, 1)
		go func() { done <- s.KeepHeld(ctx) }()
		return cancel, done
	}

	a, b := open(), open()
	if err := a.Hold(t.Context()); err != nil {
		t.Fatal(err)
	}
	stopA, doneA := keep(a)
	a.mu.Lock()
	before := a.held
	a.mu.Unlock()
	restart()
	deadline := time.Now().Add(20 * time.Second)
	for {
		a.mu.Lock()
		now := a.held
		a.mu.Unlock()
		if now != before && now.Ping(t.Context()) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the hold was not taken again within 20 s of the restart")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := b.Hold(t.Context()); !errors.Is(err, ErrHeld) {
		t.Errorf("another daemon's hold once the first took it again: %v, want ErrHeld", err)
	}
	stopA()
	if err := <-doneA; err != nil {
		t.Errorf("KeepHeld after its ctx ended: %v, want nil", err)
	}

	// The other way round: the hold is lost, another daemon takes it
	// before KeepHeld looks again, and the first is told to stop.
	stopA, doneA = keep(a)
	defer stopA()
	restart()
	if err := b.Hold(t.Context()); err != nil {
		t.Fatalf("a second daemon's hold just after the restart: %v", err)
	}
	select {
	case err := <-doneA:
		if !errors.Is(err, ErrHeld) {
			t.Errorf("KeepHeld of the daemon whose hold was taken: %v, want ErrHeld", err)
		}
	case <-time.After(20 * time.Second):
		t.Error("KeepHeld went on for 20 s after another daemon took the hold")
	}
}

// TestIdleTransactionEnded: a session left idle in a transaction (its
// node's link dropped after it took a lock) is ended by the server after
// idleInTx, and the lock it held is free again.
func TestIdleTransactionEnded(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var got string
	// (The TCP ones read 0 here: the test's server is on a Unix socket.)
	if err := s.pool.QueryRow(ctx, "SHOW idle_in_transaction_session_timeout").Scan(&got); err != nil || got != "10s" {
		t.Errorf("idle_in_transaction_session_timeout: %q, %v; want 10s", got, err)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", auditLock); err != nil {
		t.Fatal(err)
	}
	// The holder goes silent; another session waits for the lock.
	start := time.Now()
	if _, err := s.pool.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", auditLock); err != nil {
		t.Fatal(err)
	}
	waited := time.Since(start)
	if waited < idleInTx/2 || waited > 3*idleInTx {
		t.Errorf("the lock of a session idle in its transaction was free after %v, want about %v", waited, idleInTx)
	}
	t.Logf("the lock was free after %v", waited.Round(time.Millisecond))
}
