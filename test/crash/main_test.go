// Package crash holds loam's crash tests: the daemon killed at every named
// crash point (internal/crash) and in the middle of its operations, and the
// power cut under it after an acknowledged checkpoint; after each, a new
// daemon finds every sandbox and checkpoint as before the operation or as
// after it. They are a package of their own so that go test runs them beside
// the other end-to-end packages (see package harness).
package crash

import (
	"os"
	"testing"

	"loam.dev/loam/test/harness"
)

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.SubnetsCrash, nil))
}
