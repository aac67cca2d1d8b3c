package postgres

import (
	"errors"
	"testing"

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
