package test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/test/harness"
)

// BenchmarkClusterObjects: checkpoints that travel, end to end as a user
// sees them (API call to answer), on three nodes of one machine sharing
// PostgreSQL and versitygw on loopback. For a sandbox holding the bench's
// workload (N MiB of random bytes in its memory, their checksum checked
// after each step): a memory checkpoint until stored (and the upload rate
// of its archive), a fork on its own node, a fork on another node (which
// fetches it: the download rate) and a second one there (cached), and a
// move to the third node. Sizes: 64 and 512 MiB; LOAM_BENCH_SIZES (such as
// "64,512,2048") sets them.
func BenchmarkClusterObjects(b *testing.B) {
	sizes := benchSizes(b)
	nodes := objectNodes(b, "bench/", "a", "b", "c")
	a := nodes[0]
	ctx := context.Background()
	for _, mib := range sizes {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) {
			for i := range b.N {
				benchObjects(b, ctx, a, mib, i)
			}
		})
	}
}

// benchObjects is one round of BenchmarkClusterObjects at mib MiB.
func benchObjects(b *testing.B, ctx context.Context, a *clusterNode, mib, round int) {
	name := fmt.Sprintf("obj%d-%d", mib, round)
	if _, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: name, Node: "b", Resources: &api.Resources{MemoryMiB: mib + 512}}); err != nil {
		b.Fatal(err)
	}
	defer func() {
		for _, n := range []string{name, name + "-local", name + "-far", name + "-far2"} {
			_ = a.C.DeleteSandbox(ctx, n)
		}
	}()
	if _, err := a.C.CreateSession(ctx, name, api.ExecRequest{Cmd: []string{runtime.AgentPath, "bench", "workload", "--mib", strconv.Itoa(mib), "--dir", "/dev/shm"}, Detachable: true}); err != nil {
		b.Fatal(err)
	}
	harness.Eventually(b, 5*time.Minute, "the workload ready", func() error {
		_, _, code, err := a.C.Output(ctx, name, "test", "-e", "/dev/shm/ready")
		if err == nil && code != 0 {
			err = fmt.Errorf("not yet")
		}
		return err
	})
	check := func(sb string) {
		if out, errOut, code, err := a.C.Output(ctx, sb, runtime.AgentPath, "bench", "check", "--dir", "/dev/shm"); err != nil || code != 0 {
			b.Fatalf("the workload's memory in %s: %s %s %d %v", sb, out, errOut, code, err)
		}
	}
	timed := func(what string, f func() error) time.Duration {
		t0 := time.Now()
		if err := f(); err != nil {
			b.Fatalf("%s: %v", what, err)
		}
		d := time.Since(t0)
		b.ReportMetric(float64(d.Milliseconds()), "ms/"+what)
		return d
	}
	check(name)
	stored := timed("checkpoint-stored", func() error {
		_, err := a.C.CreateCheckpoint(ctx, name, api.CreateCheckpoint{Wait: api.WaitStored})
		return err
	})
	timed("fork-local", func() error {
		_, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: name + "-local", Node: "b", From: &api.ForkSource{Sandbox: name, Checkpoint: "v1"}})
		return err
	})
	check(name + "-local")
	far := timed("fork-remote", func() error {
		_, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: name + "-far", Node: "a", From: &api.ForkSource{Sandbox: name, Checkpoint: "v1"}})
		return err
	})
	check(name + "-far")
	timed("fork-remote-cached", func() error {
		_, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: name + "-far2", Node: "a", From: &api.ForkSource{Sandbox: name, Checkpoint: "v1"}})
		return err
	})
	check(name + "-far2")
	timed("move", func() error {
		_, err := a.C.MoveSandbox(ctx, name, "c")
		return err
	})
	check(name)
	// The archive's size and its fetch, from a's log.
	if m := fetchedRe.FindAllStringSubmatch(a.Log.String(), -1); len(m) > 0 {
		last := m[len(m)-1]
		bytes, _ := strconv.ParseFloat(last[1], 64)
		ms, _ := strconv.ParseFloat(last[2], 64)
		b.ReportMetric(bytes/(1<<20), "MiB-archive")
		b.ReportMetric(bytes/(1<<20)/stored.Seconds(), "MiB/s-checkpoint-and-upload")
		if ms > 0 {
			b.ReportMetric(bytes/(1<<20)/(ms/1000), "MiB/s-fetch")
		}
		b.Logf("%d MiB: archive %.1f MiB; checkpoint until stored %v; fetch %.0f ms; remote fork %v", mib, bytes/(1<<20), stored.Round(time.Millisecond), ms, far.Round(time.Millisecond))
	}
}

// fetchedRe reads the bytes and time of a fetch from a node's log.
var fetchedRe = regexp.MustCompile(`msg="fetched a checkpoint".* bytes=(\d+) ms=(\d+)`)

// benchSizes are the memory sizes, in MiB, of the cluster benches: 64 and
// 512, or those LOAM_BENCH_SIZES lists (such as "64,512,2048").
func benchSizes(b *testing.B) []int {
	s := os.Getenv("LOAM_BENCH_SIZES")
	if s == "" {
		return []int{64, 512}
	}
	var sizes []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			b.Fatalf("LOAM_BENCH_SIZES: %v", err)
		}
		sizes = append(sizes, n)
	}
	return sizes
}
