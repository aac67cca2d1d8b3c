// Package tssdk holds the end-to-end tests of loam's TypeScript SDK
// (sdk/ts): its tests run under Node against a real daemon, and the package
// installs and builds as a user's project would. They are a package of their
// own so that go test runs them beside the other end-to-end packages (see
// package harness).
package tssdk

import (
	"os"
	"testing"

	"loam.dev/loam/test/harness"
)

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.SubnetsTSSDK, nil))
}
