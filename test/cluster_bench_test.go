package test

import (
	"context"
	"slices"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/store/postgres/pgtest"
)

// quantile is the q-quantile (0..1) of ds, in milliseconds.
func quantile(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[min(len(s)-1, int(q*float64(len(s))))].Microseconds()) / 1000
}

// BenchmarkClusterRouting: what a call through a node that does not own
// the sandbox adds over one to its owner, on loopback: get and exec (p50,
// p99), and an exec stream's throughput (64 MiB of output) each way.
func BenchmarkClusterRouting(b *testing.B) {
	url := pgtest.NewDatabase(b)
	a := startNode(b, url, "a", "")
	own := startNode(b, url, "b", a.Token)
	ctx := context.Background()
	if _, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "bench", Node: "b"}); err != nil {
		b.Fatal(err)
	}
	const calls = 200
	timeCalls := func(c *client.Client, call func(*client.Client) error) []time.Duration {
		took := make([]time.Duration, 0, calls)
		for range calls {
			t := time.Now()
			if err := call(c); err != nil {
				b.Fatal(err)
			}
			took = append(took, time.Since(t))
		}
		return took
	}
	get := func(c *client.Client) error { _, err := c.GetSandbox(ctx, "bench"); return err }
	exec := func(c *client.Client) error { _, _, _, err := c.Output(ctx, "bench", "true"); return err }
	const streamMiB = 64
	stream := func(c *client.Client) float64 {
		t := time.Now()
		out, _, _, err := c.Output(ctx, "bench", "head", "-c", "67108864", "/dev/zero")
		if err != nil || len(out) != streamMiB<<20 {
			b.Fatalf("the stream: %d bytes, %v", len(out), err)
		}
		return streamMiB / time.Since(t).Seconds()
	}
	b.ResetTimer()
	for range b.N {
		for _, c := range []struct {
			name string
			c    *client.Client
		}{{"owner", own.C}, {"routed", a.C}} {
			g := timeCalls(c.c, get)
			e := timeCalls(c.c, exec)
			b.ReportMetric(quantile(g, 0.5), c.name+"-get-p50-ms")
			b.ReportMetric(quantile(g, 0.99), c.name+"-get-p99-ms")
			b.ReportMetric(quantile(e, 0.5), c.name+"-exec-p50-ms")
			b.ReportMetric(quantile(e, 0.99), c.name+"-exec-p99-ms")
			b.ReportMetric(stream(c.c), c.name+"-stream-MiB/s")
		}
	}
}
