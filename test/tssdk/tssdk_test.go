package tssdk

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/image/imagetest"
	"loam.dev/loam/internal/testenv"
	"loam.dev/loam/test/harness"
)

// tsCheckpointLimit is the daemon's checkpoint limit for the TypeScript
// tests, small so that they reach it (LimitError) quickly.
const tsCheckpointLimit = "4"

// TestTypeScriptSDK builds the TypeScript SDK (sdk/ts) and runs its tests,
// with Node's own runner, against a daemon of its own: npm ci, npm run
// build (tsc), then node --test, with LOAM_API_URL and LOAM_TOKEN of that
// daemon. Without node and npm it skips, unless CI=true.
func TestTypeScriptSDK(t *testing.T) {
	t.Parallel()
	needNode(t)
	dir := tsSDKDir()
	d := harness.StartDaemon(t, "--checkpoint-limit", tsCheckpointLimit)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	run := func(env []string, name string, args ...string) string {
		t.Helper()
		return harness.Command(ctx, t, dir, env, name, args...)
	}
	run(nil, "npm", "ci", "--no-audit", "--no-fund")
	run(nil, "npm", "run", "build")
	tests, err := filepath.Glob(filepath.Join(dir, "build", "test", "*.test.js"))
	if err != nil || len(tests) == 0 {
		t.Fatalf("no compiled tests in %s (%v)", filepath.Join(dir, "build", "test"), err)
	}
	// A private registry on loopback with the image tests' busybox image,
	// for the images test.
	reg := imagetest.Registry(t, "ts-user", "ts-pass")
	ref := reg + "/ts-bb:v1"
	imagetest.Push(t, ref, imagetest.Image(t, imagetest.BusyboxConfig, imagetest.Busybox(t)), "ts-user", "ts-pass")
	run([]string{"LOAM_API_URL=" + d.URL, "LOAM_TOKEN=" + d.Token, "LOAM_CHECKPOINT_LIMIT=" + tsCheckpointLimit,
		"LOAM_TEST_REGISTRY=" + reg, "LOAM_TEST_IMAGE=" + ref, "LOAM_TEST_REGISTRY_USER=ts-user", "LOAM_TEST_REGISTRY_PASSWORD=ts-pass"},
		"node", append([]string{"--test"}, tests...)...)

	// Every test deletes what it made.
	sbs, err := d.C.ListSandboxes(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range sbs {
		t.Errorf("sandbox %s left behind by the TypeScript tests", sb.Name)
	}
	secrets, err := d.C.ListSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets {
		t.Errorf("secret %s left behind by the TypeScript tests", s.Name)
	}
	images, err := d.C.ListImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, im := range images {
		t.Errorf("image %s left behind by the TypeScript tests", im.Ref)
	}
}

// needNode skips the test without node and npm, or fails it under CI=true.
func needNode(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			if testenv.CI() {
				t.Fatalf("%s not found (scripts/setup installs it); CI=true, so this is a failure", tool)
			}
			t.Skipf("%s not found (scripts/setup installs it)", tool)
		}
	}
}

// tsSDKDir is the TypeScript SDK's directory in this checkout.
func tsSDKDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "sdk", "ts")
}

// TestTypeScriptSDKInstall installs the TypeScript SDK as its README says,
// from a fresh copy of sdk/ts (what a checkout holds: no node_modules, no
// dist) into a new project, and runs the README's checkpoint lines there
// against a daemon: what a new user does first.
func TestTypeScriptSDKInstall(t *testing.T) {
	needNode(t)
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join(tsSDKDir(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	install, seed := tsReadme(t, string(readme))

	// A checkout: the SDK's files without what a build or npm made.
	work := t.TempDir()
	checkout := filepath.Join(work, "loam")
	src := os.DirFS(tsSDKDir())
	err = fs.WalkDir(src, ".", func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		to := filepath.Join(checkout, "sdk", "ts", path)
		switch {
		case e.IsDir() && (e.Name() == "node_modules" || e.Name() == "dist" || e.Name() == "build"):
			return fs.SkipDir
		case e.IsDir():
			return os.MkdirAll(to, 0o755)
		}
		b, err := fs.ReadFile(src, path)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	project := filepath.Join(work, "project")
	if err := os.Mkdir(project, 0o755); err != nil {
		t.Fatal(err)
	}
	d := harness.StartDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sh := func(env []string, script string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, "sh", "-c", script)
		cmd.Dir = project
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("$ %s: %v\n%s", script, err, out)
		}
		return string(out)
	}
	sh(nil, "npm init -y")
	sh(nil, strings.ReplaceAll(install, "/path/to/loam", checkout))
	if err := os.WriteFile(filepath.Join(project, "seed.mjs"), []byte("import loam from '@loam/sdk'\n"+seed), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "scratch"}); err != nil {
		t.Fatal(err)
	}
	sh([]string{"LOAM_API_URL=" + d.URL, "LOAM_TOKEN=" + d.Token}, "node seed.mjs")

	fork, err := d.C.GetSandbox(ctx, "scratch-2")
	if err != nil || fork.Labels["owner"] != "docs" {
		t.Fatalf("the fork the seed made: %+v, %v", fork, err)
	}
	cps, err := d.C.ListCheckpoints(ctx, "scratch")
	if err != nil || len(cps) != 1 || !cps[0].Auto {
		t.Fatalf("scratch's checkpoints after the seed: %+v, %v; want the restore's automatic one alone", cps, err)
	}
}

// tsReadme finds in the SDK's README the command that installs it and the
// lines of its "Checkpoints, restore, fork" section.
func tsReadme(t *testing.T, readme string) (install, seed string) {
	t.Helper()
	for _, l := range strings.Split(readme, "\n") {
		if strings.HasPrefix(l, "npm install /path/to/loam/") {
			install = strings.TrimSpace(l)
			break
		}
	}
	_, section, _ := strings.Cut(readme, "## Checkpoints, restore, fork")
	_, block, _ := strings.Cut(section, "```ts\n")
	seed, _, ok := strings.Cut(block, "```")
	if install == "" || !ok || !strings.Contains(seed, "loam.fork(") {
		t.Fatalf("the SDK's README has no install command (npm install /path/to/loam/…) or no checkpoint block")
	}
	return install, seed
}
