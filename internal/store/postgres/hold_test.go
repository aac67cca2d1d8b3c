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
