// Package console holds the end-to-end tests of loam's web console, driven
// in a real Chromium. They are a package of their own so that go test runs
// them beside the other end-to-end packages (see package harness).
package console

import (
	"os"
	"testing"

	"loam.dev/loam/test/harness"
)

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.SubnetsConsole, nil))
}
