package secret_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"loam.dev/loam/internal/secret"
	"loam.dev/loam/internal/store/sqlite"
)

func TestValueRedacts(t *testing.T) {
	v := secret.NewValue("hunter2")
	j, _ := json.Marshal(map[string]any{"v": v})
	for _, s := range []string{fmt.Sprint(v), fmt.Sprintf("%v %s %q %#v %x %+v", v, v, v, v, v, v), string(j)} {
		if strings.Contains(s, "hunter2") {
			t.Errorf("printed the value: %s", s)
		}
	}
	if v.Reveal() != "hunter2" {
		t.Errorf("Reveal = %q", v.Reveal())
	}
}

func TestSealed(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "loam.db")
	st, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	key := make([]byte, secret.KeySize)
	key[0] = 1
	s, err := secret.NewSealed(st, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "docs", "db-pass", secret.NewValue("hunter2")); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "1x", "a/b", "a b", strings.Repeat("a", 129)} {
		if _, err := s.Put(ctx, "docs", bad, secret.NewValue("x")); err == nil {
			t.Errorf("Put(%q) took a bad name", bad)
		}
	}
	if _, err := s.Put(ctx, "docs", "big", secret.NewValue(strings.Repeat("x", 64<<10+1))); err == nil {
		t.Error("Put took a value over 64 KiB")
	}
	rec, err := st.GetSecret(ctx, "docs", "db-pass")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(rec.Sealed), "hunter2") {
		t.Error("the value is stored in clear")
	}
	got, err := s.Resolve(ctx, "docs", []string{"db-pass", "missing"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["db-pass"].Reveal() != "hunter2" {
		t.Errorf("Resolve = %v entries, db-pass ok = %v", len(got), got["db-pass"].Reveal() == "hunter2")
	}
	list, err := s.List(ctx, "docs")
	if err != nil || len(list) != 1 || list[0].Name != "db-pass" {
		t.Fatalf("List = %v, %v", list, err)
	}
	other := make([]byte, secret.KeySize)
	s2, _ := secret.NewSealed(st, other)
	if _, err := s2.Resolve(ctx, "docs", []string{"db-pass"}); err == nil {
		t.Error("another key opened the value")
	}
	if err := s.Delete(ctx, "docs", "db-pass"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "docs", "db-pass"); err == nil {
		t.Error("deleting twice: no error")
	}
}
