// Package harness runs loam's end-to-end tests' daemons: it builds the
// real loam binary once per test package (Main), runs `loam serve` as a
// separate process on a data dir, subnet and nftables table of its own
// (StartDaemon), drives it through the Go client and the CLI, and removes
// all it made when the test ends.
//
// The end-to-end tests are cut into packages (test, test/crash, test/soak,
// test/console, test/tssdk) so that `go test ./...` runs them side by side;
// each package gives Main its own block of the run's subnets, so that two
// daemons never share addresses. Every test runs in parallel
// (t.Parallel); a test that changes what is the machine's (a sysctl, a
// fixed port) is not parallel, and says why in a "Not parallel:" comment.
// The tests wait on events, or with Eventually for what can only be seen
// by looking, never by sleeping a while.
package harness

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"loam.dev/loam/client"
	"loam.dev/loam/internal/launch"
	"loam.dev/loam/internal/objects/s3test"
	"loam.dev/loam/internal/store/postgres/pgtest"
	"loam.dev/loam/internal/testenv"
)

// LoamBin is the loam binary built for this run: the CLI, and the agent
// in sandboxes. DaemonBin is the one `loam serve` runs: LoamBin, or when
// the tests run under the race detector, loam built with -race, so that a
// data race in the daemon fails the test that made it (see Races).
var LoamBin, DaemonBin string

// Subnets is a test package's block of the run's subnets: the /24s First
// to Last of LOAM_TEST_NET's /16 (see Subnet). Blocks of two packages must
// not overlap: go test runs the packages at once.
type Subnets struct{ First, Last int }

// The end-to-end packages' blocks; 250 and above are the fixed subnets
// some tests name (the examples' daemon's, and those a test gives a daemon
// by hand; 252 to 254 are Links').
var (
	SubnetsTest    = Subnets{1, 119}
	SubnetsCrash   = Subnets{120, 159}
	SubnetsSoak    = Subnets{160, 189}
	SubnetsConsole = Subnets{190, 219}
	SubnetsTSSDK   = Subnets{220, 249}
)

// FastPath is --systrap-fast-path of the package's daemons. The suite
// runs more busy sandboxes than this machine has cores, where gVisor's
// fast path spins away the CPU the others need (3 sandboxes at once on 2
// cores: 14% more CPU and time with it on), so it is off, but for the
// soak, which runs with gVisor's default (set before Main).
var FastPath = false

// block is this package's (set by Main); subnetSeq counts the daemons
// started in it.
var block = SubnetsTest

// Main is an end-to-end package's TestMain: it checks for root and runsc
// (skipping the package on a developer's machine without them, failing
// under CI=true), builds loam, gives the package's daemons the subnets of
// block, and runs m, through around when it is set (which runs what the
// package must set up first and tear down after). It returns the exit
// code.
func Main(m *testing.M, subnets Subnets, around func(run func() int) int) int {
	block = subnets
	if around == nil {
		around = func(run func() int) int { return run() }
	}
	if os.Geteuid() != 0 || Runsc() == "" {
		if testenv.CI() {
			fmt.Fprintln(os.Stderr, "end-to-end tests need root and runsc (run scripts/setup); CI=true, so this is a failure")
			return 1
		}
		fmt.Fprintln(os.Stderr, "skipping end-to-end tests: they need root and runsc (run scripts/setup)")
		return 0
	}
	remove, err := binaries()
	defer remove()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if RaceEnabled {
		os.Setenv("LOAM_AGENT_BINARY", LoamBin)
	}
	// The PostgreSQL and S3 servers tests started (pgtest, s3test) stop
	// after them.
	return s3test.Around(func() int { return pgtest.Around(func() int { return around(m.Run) }) })
}

// binaries sets LoamBin and DaemonBin: the ones in $LOAM_E2E_BIN when it
// is set (scripts/test builds them once for all the end-to-end packages,
// which would otherwise each link the same two binaries at the same time),
// or built now into a directory of the package's own, which remove
// removes.
func binaries() (remove func(), err error) {
	remove = func() {}
	dir := os.Getenv("LOAM_E2E_BIN")
	built := dir != ""
	if !built {
		if dir, err = os.MkdirTemp("", "loam-e2e-bin-"); err != nil {
			return remove, err
		}
		remove = func() { os.RemoveAll(dir) }
	}
	LoamBin, DaemonBin = filepath.Join(dir, "loam"), filepath.Join(dir, "loam")
	if RaceEnabled {
		// Only the daemon is built with -race (which needs cgo): the
		// agent in each sandbox must stay static, and the CLI, run a
		// great many times, would make the CLI-heavy tests four to five
		// times slower (its races are the unit tests' to find).
		DaemonBin = filepath.Join(dir, "loam-race")
	}
	if built {
		for _, bin := range []string{LoamBin, DaemonBin} {
			if _, err := os.Stat(bin); err != nil {
				return remove, fmt.Errorf("LOAM_E2E_BIN: %w (scripts/test builds loam and, for -race, loam-race there)", err)
			}
		}
		return remove, nil
	}
	if err := buildLoam(LoamBin, false); err != nil {
		return remove, fmt.Errorf("building loam: %w", err)
	}
	if RaceEnabled {
		if err := buildLoam(DaemonBin, true); err != nil {
			return remove, fmt.Errorf("building loam with -race: %w", err)
		}
	}
	return remove, nil
}

// buildLoam builds the loam binary at out: static (CGO_ENABLED=0), as it
// must be to run in a sandbox, or with the race detector, which needs cgo.
func buildLoam(out string, race bool) error {
	args, cgo := []string{"build", "-o", out}, "CGO_ENABLED=0"
	if race {
		args, cgo = append(args, "-race"), "CGO_ENABLED=1"
	}
	build := exec.Command("go", append(args, "loam.dev/loam/cmd/loam")...)
	build.Env = append(os.Environ(), cgo)
	build.Stderr = os.Stderr
	return build.Run()
}

// raceReport marks a report of the race detector in a daemon's log.
const raceReport = "WARNING: DATA RACE"

// Races is the first data race report in the daemon's log, if any (the
// daemon is built with -race when the tests are).
func (d *Daemon) Races() string {
	if d.Log == nil {
		return ""
	}
	s := d.Log.String()
	i := strings.Index(s, raceReport)
	if i < 0 {
		return ""
	}
	end := strings.Index(s[i:], "==================")
	if end < 0 {
		end = min(len(s)-i, 8000)
	}
	return s[i : i+end]
}

// Runsc is the runsc the daemons run: $LOAM_RUNSC, or runsc on PATH; ""
// when there is none.
func Runsc() string {
	if p := os.Getenv("LOAM_RUNSC"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, _ := exec.LookPath("runsc")
	return p
}

// TemplateCache is where the tests' daemons share built templates, so the
// base template is built once per machine, not once per test.
func TemplateCache() string {
	if dir := os.Getenv("LOAM_TEMPLATE_CACHE"); dir != "" {
		return dir
	}
	return "/var/cache/loam/templates"
}

// Daemon is a `loam serve` process run by a test.
type Daemon struct {
	// T is the test it runs for; DataDir and Subnet are its own.
	T       testing.TB
	DataDir string
	Subnet  string
	// started are the flags of its last start, for its clean-up (a
	// node's namespaces carry its --node).
	started []string
	// Proc is the running daemon; Cmd its process (nil once stopped),
	// Exited closed when it has exited, so that Stop, Kill and the crash
	// tests can all watch. Log is its output; URL, Token and C are how to
	// reach its API.
	Proc   *launch.Process
	Cmd    *exec.Cmd
	Exited <-chan struct{}
	Log    *SyncBuffer
	URL    string
	Token  string
	C      *client.Client
	// Bin is the binary it runs (DaemonBin when empty), Env more of its
	// environment.
	Bin string
	Env []string
	// Roots, when set, are the CAs its TLS certificate is checked against
	// (a daemon started with --tls-cert).
	Roots *x509.CertPool
	// Netns, when set, is the network namespace it runs in (see
	// launch.Options.Netns).
	Netns string
	// Credential, when set, is the user it runs as (see
	// launch.Options.Credential).
	Credential *syscall.Credential
	// Database, when set, is the PostgreSQL database it keeps its
	// records in (--database), on every start; else SQLite in DataDir.
	Database string
	// cpu is the CPU time its runs that ended took, with the commands
	// they ran and waited for (runsc's, mkfs): the suite's time goes
	// mostly to daemons and sandboxes, and Destroy logs it per test.
	cpu  time.Duration
	runs int
}

// ended counts the CPU time of the daemon's run that just exited.
func (d *Daemon) ended() {
	if st := d.Cmd.ProcessState; st != nil {
		d.cpu += st.UserTime() + st.SystemTime()
		d.runs++
	}
	d.Cmd = nil
}

// HTTPClient is a client for the daemon's API: the default one, or one
// that trusts d.Roots.
func (d *Daemon) HTTPClient() *http.Client { return d.Proc.HTTPClient }

// subnetSeq hands each daemon of this package its own address range, so that
// two daemons never give out the same addresses. Tests that call
// t.Parallel start daemons at once, so it is atomic.
var subnetSeq atomic.Int64

// Subnet is the n-th /24 of this run's test range, 10.89.0.0/16 unless
// LOAM_TEST_NET names another second octet (two runs at once on one host,
// from two checkouts, must use two).
func Subnet(n int) string {
	octet := 89
	if v, err := strconv.Atoi(os.Getenv("LOAM_TEST_NET")); err == nil && v > 0 && v < 256 {
		octet = v
	}
	return fmt.Sprintf("10.%d.%d.0/24", octet, n)
}

// NextSubnet is the next test subnet for a daemon.
// It cycles through the package's block: a subnet comes round again only
// after as many daemons as the block holds, long after its first daemon
// is gone.
func NextSubnet() string {
	n := block.Last - block.First + 1
	return Subnet(block.First + int((subnetSeq.Add(1)-1)%int64(n)))
}

// StartDaemon runs a daemon on a new data dir; it is stopped, and all it
// made removed, when the test ends.
func StartDaemon(t testing.TB, extra ...string) *Daemon {
	t.Helper()
	dataDir, err := os.MkdirTemp("", "loam-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	d := &Daemon{T: t, DataDir: dataDir, Subnet: NextSubnet()}
	if OnPostgres() {
		d.Database = pgtest.NewDatabase(t)
	}
	d.Start(extra...)
	t.Cleanup(func() { d.Destroy() })
	return d
}

// OnPostgres reports whether this run keeps the daemons' records in
// PostgreSQL (LOAM_TEST_STORE=postgres): StartDaemon gives each daemon a
// database of its own on the test binary's server (pgtest), so that the
// end-to-end suite runs on the store many machines share as it does on
// SQLite.
func OnPostgres() bool { return os.Getenv("LOAM_TEST_STORE") == "postgres" }

// SQLiteOnly skips t on a run on PostgreSQL (OnPostgres): a test of what
// only the SQLite store does (its file, its locks), saying why.
func SQLiteOnly(t testing.TB, why string) {
	t.Helper()
	if OnPostgres() {
		t.Skip("SQLite's alone (LOAM_TEST_STORE=postgres): " + why)
	}
}

// Start runs the daemon (again, on its data dir) with more flags, and
// fails the test unless it answers.
func (d *Daemon) Start(extra ...string) {
	d.T.Helper()
	if err := d.Launch(extra...); err != nil {
		d.T.Fatal(err)
	}
}

// ErrDaemonExited is wrapped by launch's error when the daemon exited
// before it answered.
var ErrDaemonExited = launch.ErrExited

// Options are the launcher's Options for this daemon, with more flags.
func (d *Daemon) Options(extra ...string) launch.Options {
	bin := DaemonBin
	if d.Bin != "" {
		bin = d.Bin
	}
	args := []string{"--disk-size-gib", "8", "--systrap-fast-path=" + strconv.FormatBool(FastPath)}
	if d.Database != "" {
		args = append(args, "--database", d.Database)
	}
	return launch.Options{Bin: bin, DataDir: d.DataDir, Subnet: d.Subnet, Runsc: Runsc(),
		TemplateCache: TemplateCache(), DefaultTemplate: "busybox",
		Args: append(args, extra...),
		// The launcher's default wait: a restart on a CI host busy with
		// the other parallel tests has taken over a minute (a kill
		// mid-sleep, then a pool, a firewall and sandboxes to take back).
		Env: d.Env, Output: d.Log, Roots: d.Roots, Netns: d.Netns, Credential: d.Credential}
}

// Launch runs `loam serve` and waits until it answers.
func (d *Daemon) Launch(extra ...string) error {
	d.Log = &SyncBuffer{}
	d.started = extra
	p, err := launch.Start(context.Background(), d.Options(extra...))
	if err != nil {
		return fmt.Errorf("%w:\n%s", err, d.Log.String())
	}
	d.Proc, d.Cmd, d.Exited = p, p.Cmd, p.Exited()
	d.URL, d.Token, d.C = p.URL, p.Token, p.Client
	return nil
}

// Stop ends the daemon process (SIGTERM) and waits for it; its sandboxes
// keep running.
func (d *Daemon) Stop() {
	if d.Cmd == nil {
		return
	}
	d.Proc.Stop()
	d.ended()
}

// Destroy deletes every sandbox through the API, stops the daemon, and
// removes whatever is left: runsc containers, namespaces, mounts.
func (d *Daemon) Destroy() {
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	failed := false
	if d.T != nil {
		logf, failed = d.T.Logf, d.T.Failed()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if d.Cmd != nil {
		if err := d.Proc.DeleteSandboxes(ctx); err != nil {
			logf("cleanup: %v", err)
		}
		d.Stop()
	}
	if race := d.Races(); race != "" && d.T != nil {
		d.T.Errorf("the daemon had a data race:\n%s", race)
		failed = true
	}
	if failed || os.Getenv("LOAM_TEST_LOG") != "" {
		logf("daemon log:\n%s", d.Log.String())
	}
	if d.runs > 0 {
		logf("daemon CPU: %v in %d runs (with the runsc commands it waited for; not its sandboxes')", d.cpu.Round(10*time.Millisecond), d.runs)
	}
	// Whatever the API could not delete: containers, namespaces, mounts,
	// the pool, the data dir, and the firewall (the daemon leaves it in
	// place when it stops, for its sandboxes; the test is done with it).
	if err := launch.Cleanup(ctx, d.Options(d.started...)); err != nil {
		logf("cleanup: %v", err)
	}
}

// DeleteContainers force-deletes every runsc container under runscRoot.
func DeleteContainers(runscRoot string) {
	launch.DeleteContainers(context.Background(), Runsc(), runscRoot)
}

// UnmountUnder unmounts every mount below dir and detaches loop devices.
func UnmountUnder(dir string) { launch.UnmountUnder(context.Background(), dir) }

// StartDaemonB is StartDaemon for benchmarks.
func StartDaemonB(b *testing.B, extra ...string) *Daemon { return StartDaemon(b, extra...) }

// CLI runs the loam CLI against the daemon with stdin from in (nil: /dev/null).
func (d *Daemon) CLI(in string, args ...string) (stdout, stderr string, code int) {
	d.T.Helper()
	cmd := exec.Command(LoamBin, args...)
	cmd.Env = append(os.Environ(), "LOAM_API_URL="+d.URL, "LOAM_TOKEN="+d.Token)
	if in != "" {
		cmd.Stdin = strings.NewReader(in)
	}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		d.T.Fatalf("running loam %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

// Command runs a host command (npm, node) in dir with env added to the
// test's environment, logs how long it took, and fails the test with its
// output unless it succeeds. It returns the output (stdout and stderr).
func Command(ctx context.Context, t testing.TB, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	line := strings.Join(append([]string{name}, args...), " ")
	if err != nil {
		t.Fatalf("%s: %v\n%s", line, err, out.String())
	}
	t.Logf("%s: %s", line, time.Since(start).Round(time.Millisecond))
	return out.String()
}

// Run runs a command in a sandbox and returns its stdout, failing the test
// unless it exits 0.
func (d *Daemon) Run(sb string, cmd ...string) string {
	d.T.Helper()
	return d.RunB(d.T, sb, cmd...)
}

// RunB is run for a test or benchmark other than the daemon's own.
func (d *Daemon) RunB(t testing.TB, sb string, cmd ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, errb, code, err := d.C.Output(ctx, sb, cmd...)
	if err != nil || code != 0 {
		t.Fatalf("run %v in %s: code %d, err %v, stderr %q", cmd, sb, code, err, errb)
	}
	return string(out)
}

// Kill ends the daemon process with SIGKILL, as a crash would.
func (d *Daemon) Kill() {
	if d.Cmd == nil {
		return
	}
	d.Proc.Kill()
	d.ended()
}

// SyncBuffer is a bytes.Buffer that the daemon's output can be written to
// while a test reads it.
type SyncBuffer = testenv.SyncBuffer

// Eventually waits until cond holds (returns nil), looking every 50 ms,
// and fails the test after within, with what cond saw last (its error).
// It is the tests' one way to wait for what they can only see by looking
// (a process listed by ps, a file a daemon writes, a state an API shows):
// where something sends an event, the tests wait for that instead.
func Eventually(t testing.TB, within time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		<-tick.C
	}
}

// Seen looks for a file matching pattern (a filepath.Glob pattern) every
// 2 ms until one exists, or until done closes, when it looks once more.
// It is for what only exists while an operation runs, such as a
// checkpoint's or a sleep's image being written (.tmp-*): false means the
// operation ended without a look seeing it (a busy host can run it between
// two looks), and the caller tries again.
func Seen(pattern string, done <-chan struct{}) bool {
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			return true
		}
		select {
		case <-done:
			m, _ := filepath.Glob(pattern)
			return len(m) > 0
		case <-tick.C:
		}
	}
}

// KillSettled ends the daemon with SIGKILL, as a crash would, and waits
// until the runsc commands it was running when it died have exited too:
// they outlive it and finish or fail what they were doing, as after a
// real crash, and the next daemon must not race them.
func (d *Daemon) KillSettled() {
	d.T.Helper()
	var kids []int
	if d.Cmd != nil {
		kids = runscCommands(d.Cmd.Process.Pid)
	}
	d.Kill()
	Eventually(d.T, time.Minute, "the runsc commands of a killed daemon exit", func() error {
		for _, pid := range kids {
			if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
				return fmt.Errorf("runsc command %d still runs", pid)
			}
		}
		return nil
	})
}

// runscCommands are the pids of the runsc commands (checkpoint, restore,
// delete...) that are children of pid; a sandbox's own runsc processes
// (boot, gofer) are not: they run as long as the sandbox.
func runscCommands(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var kids []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after
		// its closing parenthesis.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 2 || f[1] != strconv.Itoa(pid) {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		args := strings.Split(string(cmdline), "\x00")
		if args[0] == Runsc() && !slices.Contains(args, "boot") && !slices.Contains(args, "gofer") {
			kids = append(kids, n)
		}
	}
	return kids
}
