package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"loam.dev/loam/client"
	"loam.dev/loam/internal/bench"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/host"
)

// benchOptions are the flags of `loam bench`.
type benchOptions struct {
	private       bool
	subnet        string
	runsc         string
	templateCache string
	dataDir       string
	sizes         []int
	reps          int
	ops           []string
	templates     []string
	jsonOut       bool
	plot          string
	daemonLog     string
	noRaw         bool
	markdown      bool
	from          string
	compare       string
}

// benchCmd is `loam bench`: loam against raw runsc, in one run.
func (a *app) benchCmd() *cobra.Command {
	o := benchOptions{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure loam against raw runsc on this machine",
		Long: `Measure loam's operations against the same operations done with plain runsc
commands on this machine, interleaved in one run, and print medians and
min-max over the reps with loam/raw ratios.

Each workload holds touched, incompressible memory (--sizes, MiB) in /dev/shm
with its checksum, and a ticker that records the pauses it sees; after every
restore, fork and wake the memory is checked, and a mismatch fails the run.
Operations (--ops): create (per template, until an exec answers), exec (round
trip of true), checkpoint (API time; checkpoint-durable: until the image
would survive a power cut, which loam's answer waits for and raw runsc's
does not, so raw's adds an fsync of its image; pause seen inside; image
size), disk-checkpoint, restore (in place, until an exec answers), fork (until the
fork answers an exec; host PSS and RSS of the fork), fork4 and fork16 (that
many forks of one checkpoint at once, until all answer), wake (from sleep).

The daemon is the one at $LOAM_API_URL, or with --private one the bench
starts itself on a temporary data dir and --subnet, removed afterwards. Raw
runsc runs the same workload on the template's tree (read-only), systrap, no
network, -direct checkpoints and restores, with containers named loambench-*
under a --root of its own, all deleted afterwards. Needs root.`,
		Example: `  loam bench --private --sizes 64,512 --reps 2
  loam bench --private --json --plot perf.svg
  loam bench --from new.json --compare docs/performance.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.bench(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.private, "private", false, "start a daemon of the bench's own on a temporary data dir")
	f.StringVar(&o.subnet, "subnet", "10.98.254.0/24", "address range of the --private daemon's sandboxes")
	f.StringVar(&o.runsc, "runsc", a.getenv("LOAM_RUNSC"), "the runsc binary; default runsc in PATH (LOAM_RUNSC)")
	f.StringVar(&o.templateCache, "template-cache", orDefault(a.getenv("LOAM_TEMPLATE_CACHE"), "/var/cache/loam/templates"), "where built templates are (LOAM_TEMPLATE_CACHE)")
	f.StringVar(&o.dataDir, "data-dir", orDefault(a.getenv(client.EnvDataDir), client.DefaultDataDir), "the daemon's data dir, to measure checkpoint images (not with --private)")
	f.IntSliceVar(&o.sizes, "sizes", []int{64, 512, 2048}, "workload memory sizes, MiB")
	f.IntVar(&o.reps, "reps", 3, "repetitions of each operation per size")
	f.StringSliceVar(&o.ops, "ops", bench.Ops, "operations to measure")
	f.StringSliceVar(&o.templates, "templates", []string{"base", "busybox"}, "templates to time creates of; workloads run in the first")
	f.BoolVar(&o.jsonOut, "json", false, "print JSON")
	f.StringVar(&o.plot, "plot", "", "also draw time against memory size into this SVG file")
	f.StringVar(&o.daemonLog, "daemon-log", "", "write the --private daemon's log to this file")
	f.BoolVar(&o.noRaw, "no-raw", false, "measure loam alone")
	f.BoolVar(&o.markdown, "markdown", false, "print a Markdown table")
	f.StringVar(&o.from, "from", "", "measure nothing: show the result saved by an earlier --json in this file")
	f.StringVar(&o.compare, "compare", "", "also compare each row's loam/raw ratio with the result saved in this file (docs/performance.json: the last committed run), marking rows more than 20% worse")
	cmd.AddCommand(benchWorkloadCmd(), benchCheckCmd(), benchGapCmd(), a.benchClusterCmd())
	return cmd
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func (a *app) bench(ctx context.Context, o benchOptions) (err error) {
	if o.from != "" {
		res, err := readResult(o.from)
		if err != nil {
			return err
		}
		return a.benchOutput(res, o)
	}
	if o.compare != "" {
		// Read before a run of many minutes, not after it.
		if _, err := readResult(o.compare); err != nil {
			return err
		}
	}
	if err := bench.ValidOps(o.ops); err != nil {
		return err
	}
	if len(o.sizes) == 0 || len(o.templates) == 0 {
		return errors.New("bench: --sizes and --templates need at least one value")
	}
	for _, s := range o.sizes {
		if s <= 0 {
			return fmt.Errorf("bench: size %d MiB is not positive", s)
		}
	}
	// Ctrl-C ends the run, and what it made is still removed.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench: finding the loam binary: %w", err)
	}
	runsc := o.runsc
	if runsc == "" {
		if runsc, err = exec.LookPath("runsc"); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}

	var drivers []bench.Driver
	if o.private {
		var logFile *os.File
		if o.daemonLog != "" {
			if logFile, err = os.Create(o.daemonLog); err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			defer logFile.Close()
		}
		fmt.Fprintf(a.stderr, "starting a private daemon on %s\n", o.subnet)
		p, err := bench.StartPrivate(ctx, bench.PrivateConfig{Loam: self, Runsc: runsc, Subnet: o.subnet,
			TemplateCache: o.templateCache, DefaultTemplate: o.templates[0], Log: logFile})
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer func() { err = errors.Join(err, p.Close()) }()
		drivers = append(drivers, bench.NewLoamDriver(p.Client, p.DataDir))
	} else {
		c, err := a.connect()
		if err != nil {
			return err
		}
		drivers = append(drivers, bench.NewLoamDriver(c, o.dataDir))
	}
	if !o.noRaw {
		trees := map[string]string{}
		var cache disk.Cache
		opts := disk.TemplateOptions{DebianMirror: disk.ChooseDebianMirror(os.Getenv("LOAM_DEBIAN_MIRROR"), "/etc/apt")}
		for _, name := range o.templates {
			t, err := disk.FindTemplate(name, opts)
			if err != nil {
				return fmt.Errorf("bench: raw runsc needs a built-in template: %w", err)
			}
			if trees[name], err = cache.EnsureBuilt(ctx, o.templateCache, t); err != nil {
				return fmt.Errorf("bench: %w", err)
			}
		}
		// What runs inside the raw sandboxes must be static: the agent
		// binary a daemon would run, when one is given (a loam built with
		// -race is not), else this one.
		agent := self
		if p := os.Getenv("LOAM_AGENT_BINARY"); p != "" {
			agent = p
		}
		raw, err := bench.NewRawDriver(runsc, "", agent, trees)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer func() { err = errors.Join(err, raw.Close()) }()
		drivers = append(drivers, raw)
	}

	cfg := bench.Config{Sizes: o.sizes, Reps: o.reps, Ops: o.ops, Templates: o.templates,
		MemAvailableMiB: memAvailableMiB() * 7 / 10, Progress: a.stderr}
	res, err := bench.Run(ctx, cfg, drivers)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	res.Command = "loam " + strings.Join(os.Args[1:], " ")
	res.Host = hostDescription(runsc)
	return a.benchOutput(res, o)
}

// readResult reads a result saved by --json.
func readResult(path string) (*bench.Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	var res bench.Result
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("bench: reading %s: %w", path, err)
	}
	return &res, nil
}

// benchOutput shows res as the flags ask: a plot file, and JSON, Markdown
// or a table on stdout; then, with --compare, the comparison with the
// saved result (on stderr when stdout is JSON).
func (a *app) benchOutput(res *bench.Result, o benchOptions) error {
	if o.plot != "" {
		if err := writePlot(o.plot, res); err != nil {
			return err
		}
	}
	var err error
	switch {
	case o.jsonOut:
		err = bench.WriteJSON(a.stdout, res)
	case o.markdown:
		err = bench.WriteMarkdown(a.stdout, res)
	default:
		err = bench.WriteTable(a.stdout, res)
	}
	if err != nil || o.compare == "" {
		return err
	}
	before, err := readResult(o.compare)
	if err != nil {
		return err
	}
	w := a.stdout
	if o.jsonOut {
		w = a.stderr
	} else {
		fmt.Fprintf(w, "\ncompared with %s (%s):\n", o.compare, before.Started.Format("2006-01-02 15:04"))
	}
	return bench.WriteComparison(w, bench.Compare(before, res))
}

func writePlot(path string, res *bench.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := bench.WritePlot(f, res); err != nil {
		f.Close()
		return fmt.Errorf("bench: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("bench: writing %s: %w", path, err)
	}
	return nil
}

// memAvailableMiB is the host's MemAvailable, or 0 if unknown.
func memAvailableMiB() int {
	_, avail, err := host.Memory()
	if err != nil {
		return 0
	}
	return int(avail >> 20)
}

// hostDescription names what the numbers depend on: CPUs, memory, kernel
// and runsc.
func hostDescription(runsc string) string {
	var u unix.Utsname
	_ = unix.Uname(&u)
	ver, _ := exec.Command(runsc, "--version").Output()
	first, _, _ := strings.Cut(string(ver), "\n")
	return fmt.Sprintf("%d CPUs, %d MiB available, Linux %s, %s", runtime.NumCPU(), memAvailableMiB(),
		unix.ByteSliceToString(u.Release[:]), strings.TrimSpace(first))
}

// benchWorkloadCmd is `loam bench workload`, run inside sandboxes.
func benchWorkloadCmd() *cobra.Command {
	var mib int
	var dir string
	cmd := &cobra.Command{
		Use:    "workload",
		Short:  "Hold memory and record pauses (run inside a sandbox by loam bench)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return bench.Workload(cmd.Context(), dir, mib)
		},
	}
	cmd.Flags().IntVar(&mib, "mib", 64, "memory to hold, MiB")
	cmd.Flags().StringVar(&dir, "dir", bench.WorkloadDir, "directory on a tmpfs")
	return cmd
}

// benchCheckCmd is `loam bench check`: fails unless the workload's memory
// has its checksum.
func benchCheckCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:    "check",
		Short:  "Check the workload's memory (run inside a sandbox by loam bench)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE:   func(*cobra.Command, []string) error { return bench.Verify(dir) },
	}
	cmd.Flags().StringVar(&dir, "dir", bench.WorkloadDir, "the workload's directory")
	return cmd
}

// benchGapCmd is `loam bench gap`: prints the workload's longest pause,
// in ms, since a time.
func benchGapCmd() *cobra.Command {
	var dir string
	var since int64
	cmd := &cobra.Command{
		Use:    "gap",
		Short:  "Print the workload's longest pause in ms (run inside a sandbox by loam bench)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			gap, err := bench.MaxGap(dir, time.Unix(0, since))
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%.3f\n", float64(gap.Microseconds())/1000)
			return err
		},
	}
	cmd.Flags().StringVar(&dir, "dir", bench.WorkloadDir, "the workload's directory")
	cmd.Flags().Int64Var(&since, "since", 0, "Unix time in ns: gaps that ended before are ignored")
	return cmd
}
