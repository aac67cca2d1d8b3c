// Package test holds loam's end-to-end tests of everything but the
// heaviest (crash points and power loss, soak and load, the console, the
// TypeScript SDK: packages of their own beside it, so that go test runs
// them side by side): they build the real loam binary, run `loam serve`
// as a separate process, and drive real gVisor sandboxes through the Go
// client and the CLI. The daemons are package harness's.
package test

import (
	"fmt"
	"os"
	"testing"

	"loam.dev/loam/test/harness"
)

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.SubnetsTest, withExamples))
}

// withExamples runs the package's tests with the SDK examples' daemon up:
// they talk to a daemon of their own, found as a user's program finds one,
// through LOAM_API_URL and LOAM_TOKEN.
func withExamples(run func() int) int {
	ex, err := exampleDaemon()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the examples' daemon:", err)
		return 1
	}
	os.Setenv("LOAM_API_URL", ex.URL)
	os.Setenv("LOAM_TOKEN", ex.Token)
	code := run()
	ex.Destroy()
	if race := ex.Races(); race != "" {
		fmt.Fprintf(os.Stderr, "the examples' daemon had a data race:\n%s\n", race)
		code = 1
	}
	return code
}

// exampleDaemon starts the SDK examples' daemon.
func exampleDaemon() (*harness.Daemon, error) {
	dataDir, err := os.MkdirTemp("", "loam-e2e-examples-")
	if err != nil {
		return nil, err
	}
	d := &harness.Daemon{DataDir: dataDir, Subnet: harness.Subnet(250)}
	if err := d.Launch(); err != nil {
		d.Destroy()
		return nil, err
	}
	return d, nil
}
