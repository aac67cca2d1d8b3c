// Package soak holds loam's long-running end-to-end tests: the soak (every
// operation over and over on a few sandboxes, LOAM_SOAK seconds) and the
// load (many clients at once, LOAM_LOAD seconds). They are a package of
// their own so that go test runs them beside the other end-to-end packages
// (see package harness).
package soak

import (
	"os"
	"testing"

	"loam.dev/loam/test/harness"
)

func TestMain(m *testing.M) {
	// The soak and the load run loam as deployed by default: gVisor's
	// fast path on.
	harness.FastPath = true
	os.Exit(harness.Main(m, harness.SubnetsSoak, nil))
}
