package test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/postgres"
	"loam.dev/loam/internal/store/postgres/pgtest"
	"loam.dev/loam/test/harness"
)

// TestPostgres: a daemon whose records are in PostgreSQL (--database, a
// real server of the test's) keeps them as one on SQLite does, across a
// restart: a sandbox and its file, a memory checkpoint restored in place
// and forked, an API key, a secret, an org. A second daemon on the same
// database is refused while the first runs, and the data dir refuses a
// start without the database (it would take its sandboxes for leftovers);
// a teardown takes its records from the database too.
func TestPostgres(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	d := harness.StartDaemon(t, "--database", url)
	ctx := harness.Ctx(t)

	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "pg", Labels: map[string]string{"team": "a"}}); err != nil {
		t.Fatal(err)
	}
	d.Run("pg", "sh", "-c", "echo one > /home/loam/mark")
	cp, err := d.C.CreateCheckpoint(ctx, "pg", api.CreateCheckpoint{Name: "first"})
	if err != nil {
		t.Fatal(err)
	}
	d.Run("pg", "sh", "-c", "echo two > /home/loam/mark")
	if _, err := d.C.RestoreCheckpoint(ctx, "pg", cp.ID); err != nil {
		t.Fatal(err)
	}
	if out := d.Run("pg", "cat", "/home/loam/mark"); strings.TrimSpace(out) != "one" {
		t.Errorf("the mark after the restore: %q, want one", out)
	}
	if _, err := d.C.Fork(ctx, "pg", "first", "pg-fork"); err != nil {
		t.Fatal(err)
	}
	key := makeKey(t, d, `{"name":"reader","scope":"read"}`)
	if _, err := d.C.PutSecret(ctx, "db", "hunter2"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.CreateOrg(ctx, "docs"); err != nil {
		t.Fatal(err)
	}

	// One daemon a database: another, on a data dir of its own, is
	// refused before it touches a record.
	other := &harness.Daemon{T: t, Subnet: harness.NextSubnet()}
	if other.DataDir, err = os.MkdirTemp("", "loam-e2e-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Stop(); os.RemoveAll(other.DataDir) })
	if err := other.Launch("--database", url); !errors.Is(err, harness.ErrDaemonExited) || !strings.Contains(err.Error(), "another loam daemon holds this database") {
		t.Errorf("a second daemon on the database: %v, want it refused", err)
	}

	// The data dir is the database's: without it the daemon does not
	// start (and removes nothing).
	d.Stop()
	bare := &harness.Daemon{T: t, DataDir: d.DataDir, Subnet: d.Subnet}
	defer bare.Stop() // were it to start after all
	if err := bare.Launch(); !errors.Is(err, harness.ErrDaemonExited) || !strings.Contains(err.Error(), "does not start") {
		t.Errorf("the data dir started without its database: %v, want it refused", err)
	}

	d.Start("--database", url)
	list, err := d.C.ListSandboxes(ctx, client.ListOptions{})
	if err != nil || len(list) != 2 {
		t.Fatalf("sandboxes after the restart: %+v, %v; want pg and pg-fork", list, err)
	}
	for _, name := range []string{"pg", "pg-fork"} {
		if out := d.Run(name, "cat", "/home/loam/mark"); strings.TrimSpace(out) != "one" {
			t.Errorf("%s's mark after the restart: %q, want one", name, out)
		}
	}
	cps, err := d.C.ListCheckpoints(ctx, "pg")
	if err != nil || len(cps) != 2 || cps[0].Name != "first" || !cps[1].Auto {
		t.Errorf("pg's checkpoints after the restart: %+v, %v; want first and the restore's automatic one", cps, err)
	}
	if sb, err := client.New(d.URL, key.Secret).GetSandbox(ctx, "pg"); err != nil || sb.Labels["team"] != "a" {
		t.Errorf("a get with the key made before the restart: %+v, %v", sb, err)
	}
	if secs, err := d.C.ListSecrets(ctx); err != nil || len(secs) != 1 || secs[0].Name != "db" {
		t.Errorf("secrets after the restart: %+v, %v", secs, err)
	}
	if out, _, _, err := d.C.Output(ctx, "pg", "true"); err != nil {
		t.Errorf("an exec after the restart: %q, %v", out, err)
	}
	orgs, err := d.C.ListOrgs(ctx)
	if err != nil || len(orgs) != 2 {
		t.Errorf("orgs after the restart: %+v, %v; want default and docs", orgs, err)
	}

	// A teardown takes the sandboxes' records with the data dir, from the
	// database it names; without it, it refuses and changes nothing.
	d.Stop()
	teardown := func(args ...string) (string, error) {
		cmd := exec.Command(harness.DaemonBin, append([]string{"serve", "--teardown", "-y", "--data-dir", d.DataDir, "--runsc", harness.Runsc()}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := teardown(); err == nil || !strings.Contains(out, "pass --database") {
		t.Errorf("a teardown without the database: %v %q, want a refusal", err, out)
	}
	if _, err := os.Stat(d.DataDir); err != nil {
		t.Fatalf("the data dir after a refused teardown: %v", err)
	}
	if out, err := teardown("--database", url); err != nil {
		t.Fatalf("the teardown: %v\n%s", err, out)
	}
	st, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if left, err := st.ListSandboxes(ctx, store.Filter{}); err != nil || len(left) != 0 {
		t.Errorf("sandbox records after the teardown: %d, %v; want none", len(left), err)
	}
}
