package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"loam.dev/loam/internal/bench"
)

// benchClusterCmd is `loam bench cluster`: the control plane of a large
// simulated cluster on one PostgreSQL.
func (a *app) benchClusterCmd() *cobra.Command {
	var (
		cfg     bench.ControlPlaneConfig
		plot    string
		jsonOut bool
	)
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Measure a large simulated cluster's records on one PostgreSQL",
		Long: `Measure what one PostgreSQL takes of a large cluster, beyond what this machine
can run: --nodes simulated nodes (each a real store with its own connections,
renewing a real lease with its load) hold --sandboxes records in --orgs orgs,
and --clients clients at once (one step per number) make, read, list and
delete sandboxes through random nodes for --step each. It prints, per step
and operation, calls per second, p50 and p99, PostgreSQL's CPU (its
processes on this machine) and connections. No sandbox runs. --database must
name an empty database, which the bench fills.`,
		Example: `  loam bench cluster --database postgres:///bench?host=/var/run/postgresql --plot cp.svg`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Database == "" {
				return errors.New("bench cluster: give --database, an empty PostgreSQL database")
			}
			res, err := bench.RunControlPlane(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if plot != "" {
				f, err := os.Create(plot)
				if err != nil {
					return err
				}
				if err := bench.WriteControlPlanePlot(f, res); err != nil {
					f.Close()
					return err
				}
				if err := f.Close(); err != nil {
					return err
				}
			}
			if jsonOut {
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			if err := bench.WriteControlPlaneTable(a.stdout, res); err != nil {
				return err
			}
			if plot != "" {
				fmt.Fprintf(a.stderr, "drew the curve into %s\n", plot)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Database, "database", a.getenv("LOAM_DATABASE"), "an empty PostgreSQL database to fill (LOAM_DATABASE)")
	f.IntVar(&cfg.Nodes, "nodes", 100, "simulated nodes")
	f.IntVar(&cfg.Sandboxes, "sandboxes", 20000, "sandbox records to fill the database with")
	f.IntVar(&cfg.Orgs, "orgs", 100, "orgs the records are spread over")
	f.IntSliceVar(&cfg.Clients, "clients", []int{1, 4, 16, 64}, "concurrent clients, one step per number")
	f.DurationVar(&cfg.Step, "step", 5*time.Second, "how long each step runs")
	f.IntVar(&cfg.ConnsPerNode, "conns-per-node", 1, "each node's connections")
	f.StringVar(&plot, "plot", "", "also draw throughput and p99 against clients into this SVG file")
	f.BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}
