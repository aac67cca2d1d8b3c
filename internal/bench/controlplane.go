package bench

import (
	"context"
	"errors"
	"fmt"
	"image/color"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/cluster"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/postgres"
)

// The control-plane benchmark: what one PostgreSQL takes of a large
// cluster's records, beyond what one machine can run. Simulated nodes
// (each a real store with its own connections, fenced at the epoch it
// joined with, renewing a real lease with its load every third of it)
// hold many sandboxes' records; clients, many at once, make, read, list
// and delete sandboxes through random nodes' stores, as the nodes' API
// would for them. No sandbox runs: the records are what is measured.

// ControlPlaneConfig is the benchmark's shape.
type ControlPlaneConfig struct {
	// Database is the PostgreSQL URL (an empty database; it is filled).
	Database string
	// Nodes and Sandboxes are the simulated cluster: Sandboxes records
	// spread over Nodes nodes and Orgs orgs.
	Nodes, Sandboxes, Orgs int
	// Clients are the numbers of concurrent clients, one step each.
	Clients []int
	// Step is how long each step runs.
	Step time.Duration
	// ConnsPerNode caps each node's connections (pool_max_conns).
	ConnsPerNode int
	// Lease is the nodes' lease (cluster.DefaultLease for 0).
	Lease time.Duration
	Log   *slog.Logger
}

// ControlPlaneOps are the operations clients mix, with their share.
var controlPlaneMix = []struct {
	op    string
	share int
}{{"get", 70}, {"list", 10}, {"create", 10}, {"delete", 10}}

// ControlPlaneStep is one step's figures: per operation, how many ran per
// second and their p50 and p99; and what PostgreSQL spent.
type ControlPlaneStep struct {
	Clients int                           `json:"clients"`
	Ops     map[string]ControlPlaneFigure `json:"ops"`
	// PostgresCPU is the CPU PostgreSQL's processes used, in cores;
	// Connections the server's connections at the end of the step.
	PostgresCPU float64 `json:"postgres_cpu_cores"`
	Connections int     `json:"connections"`
	Errors      int     `json:"errors"`
}

// ControlPlaneFigure is one operation's figures in a step.
type ControlPlaneFigure struct {
	PerSecond float64 `json:"per_second"`
	P50MS     float64 `json:"p50_ms"`
	P99MS     float64 `json:"p99_ms"`
}

// ControlPlaneResult is the benchmark's answer.
type ControlPlaneResult struct {
	Nodes, Sandboxes, Orgs int
	Steps                  []ControlPlaneStep
}

// plotColors are the operations' colours.
var plotColors = []color.Color{loamColor, rawColor,
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}}

// simNode is a simulated node: its store and its membership.
type simNode struct {
	name   string
	st     *postgres.Store
	member *cluster.Member
	seq    atomic.Int64
}

// RunControlPlane runs the benchmark.
func RunControlPlane(ctx context.Context, cfg ControlPlaneConfig) (*ControlPlaneResult, error) {
	if cfg.Nodes <= 0 || cfg.Orgs <= 0 || len(cfg.Clients) == 0 {
		return nil, errors.New("control-plane bench: give nodes, orgs and clients")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.ConnsPerNode <= 0 {
		cfg.ConnsPerNode = 2
	}
	u, err := url.Parse(cfg.Database)
	if err != nil {
		return nil, fmt.Errorf("control-plane bench: %w", err)
	}
	q := u.Query()
	q.Set("pool_max_conns", strconv.Itoa(cfg.ConnsPerNode))
	u.RawQuery = q.Encode()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	nodes := make([]*simNode, cfg.Nodes)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		for _, n := range nodes {
			if n != nil {
				n.st.Close()
			}
		}
	}()
	for i := range nodes {
		st, err := postgres.Open(ctx, u.String())
		if err != nil {
			return nil, err
		}
		n := &simNode{name: fmt.Sprintf("sim-%03d", i), st: st}
		nodes[i] = n
		load := func(context.Context) api.NodeLoad {
			return api.NodeLoad{Role: cluster.RoleNode, CPUs: 64, MemoryMiB: 256 << 10, MemoryFreeMiB: 128 << 10, Sandboxes: cfg.Sandboxes / cfg.Nodes}
		}
		n.member, err = cluster.Join(ctx, st.Nodes(), cluster.Config{Name: n.name, Address: "http://sim.invalid", Lease: cfg.Lease, Load: load, Fenced: postgres.ErrFenced}, cfg.Log)
		if err != nil {
			return nil, err
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = n.member.Run(ctx) }()
	}
	for i := range cfg.Orgs {
		if err := nodes[0].st.EnsureOrg(ctx, orgName(i)); err != nil {
			return nil, err
		}
	}
	// The records, made many at once.
	fill := make(chan int)
	errs := make(chan error, 1)
	var fillers sync.WaitGroup
	for w := range 32 {
		fillers.Add(1)
		go func() {
			defer fillers.Done()
			for i := range fill {
				n := nodes[i%len(nodes)]
				if err := n.st.CreateSandbox(ctx, simRecord(n, i%cfg.Orgs)); err != nil {
					select {
					case errs <- fmt.Errorf("filling (worker %d): %w", w, err):
					default:
					}
				}
			}
		}()
	}
	for i := range cfg.Sandboxes {
		fill <- i
	}
	close(fill)
	fillers.Wait()
	select {
	case err := <-errs:
		return nil, err
	default:
	}

	res := &ControlPlaneResult{Nodes: cfg.Nodes, Sandboxes: cfg.Sandboxes, Orgs: cfg.Orgs}
	for _, c := range cfg.Clients {
		step, err := runStep(ctx, cfg, nodes, c)
		if err != nil {
			return nil, err
		}
		cfg.Log.Info("control-plane step", "clients", c, "get_per_s", int(step.Ops["get"].PerSecond), "pg_cpu", step.PostgresCPU)
		res.Steps = append(res.Steps, step)
	}
	return res, nil
}

func orgName(i int) string { return fmt.Sprintf("org-%03d", i) }

// simRecord is a new sandbox record of node n in org i.
func simRecord(n *simNode, org int) *store.Sandbox {
	k := n.seq.Add(1)
	id := fmt.Sprintf("sb-%s-%07d", strings.TrimPrefix(n.name, "sim-"), k)
	return &store.Sandbox{
		Sandbox: api.Sandbox{
			ID: id, Name: "s-" + strings.TrimPrefix(n.name, "sim-") + "-" + strconv.FormatInt(k, 10), State: api.StateRunning,
			Template: "base", Resources: api.Resources{CPUs: 1, MemoryMiB: 512, DiskMiB: 4096},
			Env: map[string]string{}, Labels: map[string]string{"team": "bench"}, HTTPPort: 8080,
			Network: api.NetworkPolicy{Egress: api.EgressAll, Allow: []string{}, Deny: []string{}},
			Node:    n.name, CreatedAt: store.Now(),
		},
		Org: orgName(org), NetIndex: int(k),
	}
}

// runStep runs clients clients for cfg.Step.
func runStep(ctx context.Context, cfg ControlPlaneConfig, nodes []*simNode, clients int) (ControlPlaneStep, error) {
	type sample struct {
		op   string
		took time.Duration
	}
	var (
		mu      sync.Mutex
		samples []sample
		nerrs   atomic.Int64
	)
	cpu0, _ := postgresCPU()
	began := time.Now()
	deadline := began.Add(cfg.Step)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), uint64(clients)))
			var mine []sample
			// What this client made, to read and delete.
			var made []*store.Sandbox
			for time.Now().Before(deadline) && ctx.Err() == nil {
				n := nodes[rng.IntN(len(nodes))]
				op := pickOp(rng)
				t := time.Now()
				var err error
				switch op {
				case "create":
					sb := simRecord(n, rng.IntN(cfg.Orgs))
					if err = n.st.CreateSandbox(ctx, sb); err == nil {
						made = append(made, sb)
					}
				case "get":
					// A sandbox of any node, by name, in its org.
					owner := nodes[rng.IntN(len(nodes))]
					k := 1 + rng.Int64N(max(1, owner.seq.Load()))
					name := "s-" + strings.TrimPrefix(owner.name, "sim-") + "-" + strconv.FormatInt(k, 10)
					_, err = n.st.GetSandbox(ctx, "", name)
					if errors.Is(err, store.ErrNotFound) {
						err = nil // deleted by a client
					}
				case "list":
					_, err = n.st.ListSandboxes(ctx, store.Filter{Org: orgName(rng.IntN(cfg.Orgs))})
				case "delete":
					if len(made) == 0 {
						continue
					}
					sb := made[len(made)-1]
					made = made[:len(made)-1]
					// Its owner deletes it: the fence lets no other.
					owner := nodeOf(nodes, sb.Node)
					err = owner.st.DeleteSandbox(ctx, sb.ID)
				}
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					if nerrs.Add(1) <= 3 {
						cfg.Log.Warn("control-plane bench call", "op", op, "err", err)
					}
					continue
				}
				mine = append(mine, sample{op, time.Since(t)})
			}
			mu.Lock()
			samples = append(samples, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	wall := time.Since(began)
	cpu1, _ := postgresCPU()
	step := ControlPlaneStep{Clients: clients, Ops: map[string]ControlPlaneFigure{}, Errors: int(nerrs.Load())}
	step.PostgresCPU = (cpu1 - cpu0).Seconds() / wall.Seconds()
	if conn, err := pgx.Connect(ctx, cfg.Database); err == nil {
		_ = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'`).Scan(&step.Connections)
		conn.Close(ctx)
	}
	by := map[string][]time.Duration{}
	for _, s := range samples {
		by[s.op] = append(by[s.op], s.took)
	}
	for op, ds := range by {
		slices.Sort(ds)
		q := func(f float64) float64 {
			return float64(ds[min(len(ds)-1, int(f*float64(len(ds))))].Microseconds()) / 1000
		}
		step.Ops[op] = ControlPlaneFigure{PerSecond: float64(len(ds)) / wall.Seconds(), P50MS: q(0.5), P99MS: q(0.99)}
	}
	return step, nil
}

func pickOp(rng *rand.Rand) string {
	n := rng.IntN(100)
	for _, m := range controlPlaneMix {
		if n < m.share {
			return m.op
		}
		n -= m.share
	}
	return "get"
}

func nodeOf(nodes []*simNode, name string) *simNode {
	for _, n := range nodes {
		if n.name == name {
			return n
		}
	}
	return nodes[0]
}

// postgresCPU is the CPU time all of this machine's postgres processes
// have used (user and system), from /proc.
func postgresCPU() (time.Duration, error) {
	procs, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return 0, err
	}
	var ticks int64
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < open || s[open+1:close] != "postgres" {
			continue
		}
		f := strings.Fields(s[close+2:])
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += ut + st
	}
	// USER_HZ is 100 on Linux.
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// WriteControlPlaneTable prints res, one line per step and operation.
func WriteControlPlaneTable(w io.Writer, res *ControlPlaneResult) error {
	fmt.Fprintf(w, "control plane: %d nodes, %d sandboxes in %d orgs, one PostgreSQL\n", res.Nodes, res.Sandboxes, res.Orgs)
	fmt.Fprintf(w, "%-8s %-7s %10s %9s %9s %8s %6s %6s\n", "CLIENTS", "OP", "PER-S", "P50-MS", "P99-MS", "PG-CPU", "CONNS", "ERRORS")
	for _, s := range res.Steps {
		for _, m := range controlPlaneMix {
			f := s.Ops[m.op]
			fmt.Fprintf(w, "%-8d %-7s %10.0f %9.2f %9.2f %8.2f %6d %6d\n", s.Clients, m.op, f.PerSecond, f.P50MS, f.P99MS, s.PostgresCPU, s.Connections, s.Errors)
		}
	}
	return nil
}

// WriteControlPlanePlot draws res as an SVG: throughput and p99 of each
// operation against the number of clients, where the curve bends.
func WriteControlPlanePlot(w io.Writer, res *ControlPlaneResult) error {
	if len(res.Steps) == 0 {
		return errors.New("plotting the control-plane bench: no steps")
	}
	tp := plot.New()
	tp.Title.Text = fmt.Sprintf("throughput (%d nodes, %d sandboxes)", res.Nodes, res.Sandboxes)
	tp.X.Label.Text, tp.Y.Label.Text = "clients", "calls/s"
	lat := plot.New()
	lat.Title.Text = "p99 latency"
	lat.X.Label.Text, lat.Y.Label.Text = "clients", "ms"
	for i, m := range controlPlaneMix {
		var thr, p99 plotter.XYs
		for _, s := range res.Steps {
			f := s.Ops[m.op]
			thr = append(thr, plotter.XY{X: float64(s.Clients), Y: f.PerSecond})
			p99 = append(p99, plotter.XY{X: float64(s.Clients), Y: f.P99MS})
		}
		for _, pl := range []struct {
			p   *plot.Plot
			pts plotter.XYs
		}{{tp, thr}, {lat, p99}} {
			l, pts, err := plotter.NewLinePoints(pl.pts)
			if err != nil {
				return err
			}
			l.Color = plotColors[i%len(plotColors)]
			pts.Color = l.Color
			pl.p.Add(l, pts)
			pl.p.Legend.Add(m.op, l, pts)
		}
	}
	tp.Legend.Top, lat.Legend.Top = true, true
	canvas := vgsvg.New(vg.Points(600), vg.Points(260))
	dc := draw.New(canvas)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Points(12), PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(6)}
	tp.Draw(tiles.At(dc, 0, 0))
	lat.Draw(tiles.At(dc, 1, 0))
	_, err := canvas.WriteTo(w)
	return err
}
