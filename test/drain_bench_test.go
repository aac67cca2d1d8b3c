package test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/runtime"
	"loam.dev/loam/test/harness"
)

// BenchmarkClusterDrain: the drain of a node, end to end as a user sees it,
// on three nodes of one machine sharing PostgreSQL and versitygw on
// loopback. Node b holds one sandbox with the bench's workload (N MiB of
// random bytes in its memory, their checksum checked after the move) and a
// web server on its URL; a client loops requests at the URL through node a
// while b is drained. Reported: the drain call's time, how long the URL
// held a request (the slowest one during the drain), and the requests that
// failed. Sizes: 64 and 512 MiB; LOAM_BENCH_SIZES (such as "64,512,2048")
// sets them.
func BenchmarkClusterDrain(b *testing.B) {
	sizes := benchSizes(b)
	nodes := objectNodes(b, "drainbench/", "a", "b", "c")
	ctx := context.Background()
	for _, mib := range sizes {
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) {
			for i := range b.N {
				benchDrain(b, ctx, nodes[0], mib, i)
			}
		})
	}
}

// benchDrain is one round of BenchmarkClusterDrain at mib MiB.
func benchDrain(b *testing.B, ctx context.Context, a *clusterNode, mib, round int) {
	name := fmt.Sprintf("drain%d-%d", mib, round)
	if _, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: name, Node: "b", HTTPPort: 8080, Resources: &api.Resources{MemoryMiB: mib + 512}}); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = a.C.DeleteSandbox(ctx, name)
		// b takes sandboxes again for the next round.
		if _, err := a.C.CordonNode(ctx, "b", false); err != nil {
			b.Errorf("uncordoning b: %v", err)
		}
	}()
	a.Run(name, "sh", "-c", "mkdir -p /tmp/www && echo served > /tmp/www/index.html && (httpd -p 8080 -h /tmp/www &)")
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
	tok, err := a.C.AccessToken(ctx, name)
	if err != nil {
		b.Fatal(err)
	}
	harness.Eventually(b, 20*time.Second, "the URL through a", func() error { return a.Served(ctx, tok, "served") })

	var (
		mu       sync.Mutex
		asked    int
		failures []string
		slowest  time.Duration
		wg       sync.WaitGroup
	)
	loop, stop := context.WithCancel(ctx)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for loop.Err() == nil {
			t0 := time.Now()
			err := a.Served(ctx, tok, "served")
			took := time.Since(t0)
			mu.Lock()
			asked++
			slowest = max(slowest, took)
			if err != nil {
				failures = append(failures, err.Error())
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	time.Sleep(200 * time.Millisecond)
	t0 := time.Now()
	res, err := a.C.DrainNode(ctx, "b")
	drained := time.Since(t0)
	time.Sleep(200 * time.Millisecond)
	stop()
	wg.Wait()
	if err != nil {
		b.Fatalf("draining b: %v", err)
	}
	if len(res.Moved) != 1 || len(res.Failed) != 0 {
		b.Fatalf("the drain's outcome: %+v", res)
	}
	if out, errOut, code, err := a.C.Output(ctx, name, runtime.AgentPath, "bench", "check", "--dir", "/dev/shm"); err != nil || code != 0 {
		b.Fatalf("the workload's memory after the drain: %s %s %d %v", out, errOut, code, err)
	}
	b.ReportMetric(float64(drained.Milliseconds()), "ms/drain")
	b.ReportMetric(float64(slowest.Milliseconds()), "ms/url-held")
	b.ReportMetric(float64(len(failures)), "failed-requests")
	b.ReportMetric(float64(asked), "requests")
	b.Logf("%d MiB: drain %v; %d URL requests during it, the slowest %v, %d failed %v",
		mib, drained.Round(time.Millisecond), asked, slowest.Round(time.Millisecond), len(failures), failures)
}
