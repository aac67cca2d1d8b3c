package fake_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/internal/runtime/fake"
	"loam.dev/loam/internal/runtime/runtimetest"
)

func TestMain(m *testing.M) {
	fake.RunAgentIfChild()
	os.Exit(m.Run())
}

// block is this process's loopback block, 127.A.B.0/24, so that test
// binaries running at the same time keep out of each other's way.
var block = [2]byte{byte(1 + time.Now().UnixNano()%250), byte(os.Getpid())}

func newEnv(t *testing.T, rt runtime.Runtime) runtimetest.Env {
	var slot atomic.Int32
	return runtimetest.Env{
		Runtime: rt,
		NewSandbox: func(t *testing.T, id string) runtimetest.Sandbox {
			addr := netip.AddrFrom4([4]byte{127, block[0], block[1], byte(2 + slot.Add(1))})
			dir := t.TempDir()
			rootfs := filepath.Join(dir, "rootfs")
			if err := os.Mkdir(rootfs, 0o755); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := rt.Delete(context.Background(), id); err != nil {
					t.Errorf("cleaning up: %v", err)
				}
			})
			return runtimetest.Sandbox{
				Spec: runtime.Spec{
					ID: id, BundleDir: filepath.Join(dir, "bundle"), Rootfs: rootfs,
					Netns: fake.Netns(addr), Hostname: id, AgentBinary: "/nonexistent/loam",
				},
				Addr: addr,
			}
		},
	}
}

func TestConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtimetest.Env {
		rt := fake.New(t)
		rt.Tokens = runtimetest.Tokens
		return newEnv(t, rt)
	})
}

// TestConformanceHeld runs the suite over the fake with
// runtime.HeldCheckpointer, as runsc's driver has it.
func TestConformanceHeld(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtimetest.Env {
		rt := fake.New(t)
		rt.Tokens = runtimetest.Tokens
		return newEnv(t, rt.Held())
	})
}
