package gvisor

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"loam.dev/loam/internal/network"
	"loam.dev/loam/internal/runtime/runtimetest"
)

// conformanceSubnet is the subnet of TestConformance's sandboxes: one of
// its own, in the second octet LOAM_TEST_NET names when set, so that it
// runs beside this package's other tests and other checkouts' runs.
func conformanceSubnet() netip.Prefix {
	if v, err := strconv.Atoi(os.Getenv("LOAM_TEST_NET")); err == nil && v > 0 && v < 256 {
		return netip.MustParsePrefix(fmt.Sprintf("10.%d.251.0/24", v))
	}
	return netip.MustParsePrefix("10.250.3.0/24")
}

// TestConformance holds the driver to runtimetest's suite, with loam's
// real agent as init, as the fake runtime is held to it.
func TestConformance(t *testing.T) {
	runsc := requireRunsc(t)
	loam := filepath.Join(t.TempDir(), "loam")
	build := exec.Command("go", "build", "-o", loam, "loam.dev/loam/cmd/loam")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building loam: %v\n%s", err, out)
	}
	nm, err := network.New(network.Config{
		Subnet:      conformanceSubnet(),
		NetnsPrefix: "loamtest-rt-",
		VethPrefix:  "ltr",
	})
	if err != nil {
		t.Fatal(err)
	}
	runtimetest.Run(t, func(t *testing.T) runtimetest.Env {
		root := filepath.Join(t.TempDir(), "runsc")
		rt, err := New(Config{Runsc: runsc, Root: root})
		if err != nil {
			t.Fatal(err)
		}
		// Registered before the sandboxes' cleanups, so it runs after.
		t.Cleanup(func() {
			if err := rt.Close(); err != nil {
				t.Error(err)
			}
		})
		e := &env{rt: rt, net: nm, runsc: runsc, root: root}
		slot := 0
		return runtimetest.Env{
			Runtime: rt,
			NewSandbox: func(t *testing.T, id string) runtimetest.Sandbox {
				slot++
				sb := e.newSandbox(t, id, slot)
				sb.spec.AgentBinary = loam
				return runtimetest.Sandbox{
					Spec:    sb.spec,
					Addr:    sb.ep.SandboxIP,
					Prepare: func(t *testing.T) { sb.prepare(t) },
				}
			},
		}
	})
	checkNoChildren(t)
}
