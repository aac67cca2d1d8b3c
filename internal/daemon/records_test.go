package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckRecords: a data dir remembers whose records its sandboxes are,
// and refuses a daemon given another store; one from before the file,
// with SQLite's database in it, is SQLite's.
func TestCheckRecords(t *testing.T) {
	fresh := t.TempDir()
	if err := checkRecords(fresh, "postgres db@1"); err != nil {
		t.Fatalf("a new data dir: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(fresh, recordsFile)); string(b) != "postgres db@1\n" {
		t.Errorf("recorded %q", b)
	}
	if err := checkRecords(fresh, "postgres db@1"); err != nil {
		t.Errorf("the same database again: %v", err)
	}
	for _, other := range []string{"postgres db@2", "sqlite"} {
		err := checkRecords(fresh, other)
		if err == nil || !strings.Contains(err.Error(), "PostgreSQL database db@1") || !strings.Contains(err.Error(), "does not start") {
			t.Errorf("a data dir of db@1 given %s: %v, want a refusal naming both", other, err)
		}
	}

	old := t.TempDir()
	if err := os.WriteFile(filepath.Join(old, storeFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := checkRecords(old, "postgres db@1"); err == nil || !strings.Contains(err.Error(), "SQLite") {
		t.Errorf("an SQLite data dir from before the file given a database: %v, want a refusal", err)
	}
	if err := checkRecords(old, "sqlite"); err != nil {
		t.Errorf("an SQLite data dir from before the file: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(old, recordsFile)); string(b) != "sqlite\n" {
		t.Errorf("recorded %q for an old SQLite data dir", b)
	}
}
