package test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/client"
	"loam.dev/loam/internal/image/imagetest"
)

// tsCheckpointLimit is the daemon's checkpoint limit for the TypeScript
// tests, small so that they reach it (LimitError) quickly.
const tsCheckpointLimit = "4"

// TestTypeScriptSDK builds the TypeScript SDK (sdk/ts) and runs its tests,
// with Node's own runner, against a daemon of its own: npm ci, npm run
// build (tsc), then node --test, with LOAM_API_URL and LOAM_TOKEN of that
// daemon. Without node and npm it skips, unless CI=true.
func TestTypeScriptSDK(t *testing.T) {
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s not found (scripts/setup installs it); CI=true, so this is a failure", tool)
			}
			t.Skipf("%s not found (scripts/setup installs it)", tool)
		}
	}
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "sdk", "ts")
	d := startDaemon(t, "--checkpoint-limit", tsCheckpointLimit)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	run := func(env []string, name string, args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
		}
		t.Logf("%s %s: %s", name, strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
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
	imagetest.Push(t, ref, imagetest.Image(t, busyboxConfig, imagetest.Busybox(t)), "ts-user", "ts-pass")
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
