package bench

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/internal/store/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestControlPlaneSmall: the benchmark's machinery on a small cluster
// (3 nodes, 60 records): every operation ran in every step without an
// error, the records were made, and the table and the plot are drawn.
func TestControlPlaneSmall(t *testing.T) {
	res, err := RunControlPlane(context.Background(), ControlPlaneConfig{
		Database: pgtest.NewDatabase(t), Nodes: 3, Sandboxes: 60, Orgs: 4,
		Clients: []int{1, 3}, Step: 400 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Steps) != 2 {
		t.Fatalf("steps: %+v", res.Steps)
	}
	for _, s := range res.Steps {
		if s.Errors != 0 || s.Connections == 0 {
			t.Errorf("step of %d clients: %d errors, %d connections", s.Clients, s.Errors, s.Connections)
		}
		for _, op := range []string{"get", "list", "create", "delete"} {
			if f := s.Ops[op]; f.PerSecond <= 0 || f.P99MS < f.P50MS {
				t.Errorf("step of %d clients, %s: %+v", s.Clients, op, f)
			}
		}
	}
	var table, svg bytes.Buffer
	if err := WriteControlPlaneTable(&table, res); err != nil || !strings.Contains(table.String(), "3 nodes, 60 sandboxes") {
		t.Errorf("the table: %v\n%s", err, table.String())
	}
	if err := WriteControlPlanePlot(&svg, res); err != nil || !strings.Contains(svg.String(), "<svg") {
		t.Errorf("the plot: %v", err)
	}
}

// BenchmarkControlPlane: the control plane of a large cluster on one
// PostgreSQL (LOAM_CP_NODES nodes, 100 by default; LOAM_CP_SANDBOXES
// records, 20,000; 1 to 64 clients), its figures as metrics, its curve
// in LOAM_CP_PLOT (an SVG) when set.
func BenchmarkControlPlane(b *testing.B) {
	env := func(name string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
			return v
		}
		return def
	}
	for range b.N {
		res, err := RunControlPlane(context.Background(), ControlPlaneConfig{
			Database: pgtest.NewDatabase(b), Nodes: env("LOAM_CP_NODES", 100), Sandboxes: env("LOAM_CP_SANDBOXES", 20000),
			Orgs: 100, Clients: []int{1, 4, 16, 64}, Step: 5 * time.Second, ConnsPerNode: 1,
		})
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range res.Steps {
			for op, f := range s.Ops {
				b.ReportMetric(f.PerSecond, op+"/s@"+strconv.Itoa(s.Clients))
				b.ReportMetric(f.P99MS, op+"-p99-ms@"+strconv.Itoa(s.Clients))
			}
			b.ReportMetric(s.PostgresCPU, "pg-cores@"+strconv.Itoa(s.Clients))
		}
		var table bytes.Buffer
		_ = WriteControlPlaneTable(&table, res)
		b.Log("\n" + table.String())
		if path := os.Getenv("LOAM_CP_PLOT"); path != "" {
			f, err := os.Create(path)
			if err != nil {
				b.Fatal(err)
			}
			if err := WriteControlPlanePlot(f, res); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	}
}
