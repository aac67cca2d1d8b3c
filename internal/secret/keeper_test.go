package secret_test

import (
	"errors"
	"log/slog"
	"path/filepath"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/secret"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/sqlite"
)

// TestKeeperDelete: a secret a sandbox has (as env or as a file) is not
// deleted unless forced, and the conflict names the sandboxes; one that is
// gone is not_found even while sandboxes still name it.
func TestKeeperDelete(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "loam.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sealed, err := secret.NewSealed(st, make([]byte, secret.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	k := secret.NewKeeper(sealed, st, slog.New(slog.DiscardHandler))
	for _, name := range []string{"db", "tls", "free"} {
		if _, err := k.Put(ctx, "docs", name, secret.NewValue("v-"+name)); err != nil {
			t.Fatal(err)
		}
	}
	for i, sb := range []api.Sandbox{
		{Name: "env", Secrets: map[string]string{"DB": "db"}},
		{Name: "file", SecretFiles: map[string]string{"/run/secrets/db": "db", "/etc/tls.key": "tls"}},
	} {
		sb.ID, sb.State, sb.CreatedAt = "sb-00000000000"+string(rune('1'+i)), api.StateRunning, store.Now()
		if err := st.CreateSandbox(ctx, &store.Sandbox{Sandbox: sb, NetIndex: i, Org: "docs"}); err != nil {
			t.Fatal(err)
		}
	}
	// Org ops has a secret db of its own, which a sandbox of ops has:
	// neither is docs'.
	if _, err := k.Put(ctx, "ops", "db", secret.NewValue("v-ops")); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateSandbox(ctx, &store.Sandbox{Sandbox: api.Sandbox{ID: "sb-000000000009", Name: "opsdb", State: api.StateRunning, CreatedAt: store.Now(),
		Secrets: map[string]string{"DB": "db"}}, NetIndex: 9, Org: "ops"}); err != nil {
		t.Fatal(err)
	}
	code := func(err error) api.Code {
		var ae *api.Error
		if errors.As(err, &ae) {
			return ae.Code
		}
		return ""
	}
	err = k.Delete(ctx, "docs", "db", false)
	want := `secret "db" is used by sandbox env, file; force (?force=true, loam secret rm --force) deletes it anyway, and they go without it from their next boot`
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeConflict || ae.Message != want {
		t.Fatalf("Delete(db) = %v, want the conflict %q", err, want)
	}
	if err := k.Delete(ctx, "docs", "tls", false); code(err) != api.CodeConflict {
		t.Fatalf("Delete(tls) = %v, want a conflict", err)
	}
	if err := k.Delete(ctx, "docs", "free", false); err != nil {
		t.Fatalf("Delete(free) = %v", err)
	}
	if err := k.Delete(ctx, "docs", "db", true); err != nil {
		t.Fatalf("Delete(db, force) = %v", err)
	}
	if err := k.Delete(ctx, "docs", "db", false); code(err) != api.CodeNotFound {
		t.Fatalf("Delete(db) once gone = %v, want not_found", err)
	}
	if err := k.Delete(ctx, "docs", "a/b", true); code(err) != api.CodeInvalid {
		t.Fatalf("Delete(a/b) = %v, want invalid", err)
	}
	list, err := k.List(ctx, "docs")
	if err != nil || len(list) != 1 || list[0].Name != "tls" {
		t.Fatalf("List = %v, %v; want tls alone", list, err)
	}
	if list, err := k.List(ctx, "ops"); err != nil || len(list) != 1 || list[0].Name != "db" {
		t.Fatalf("List(ops) = %v, %v; want its db alone", list, err)
	}
	if err := k.Delete(ctx, "ops", "tls", true); code(err) != api.CodeNotFound {
		t.Fatalf("Delete(ops, tls), docs' secret = %v, want not_found", err)
	}
}
