// Package test holds loam's end-to-end tests: they build the real loam
// binary, run `loam serve` as a separate process on a data dir of their own,
// and drive real gVisor sandboxes through the Go client and the CLI.
//
// Every test runs in parallel (t.Parallel): each daemon has its own data
// dir, subnet (nextSubnet, within LOAM_TEST_NET's /16) and nftables table,
// and the sandboxes' names are per daemon. A test that changes what is the
// machine's (a sysctl, a fixed port) is not parallel, and says why in a
// "Not parallel:" comment; Go runs those first, alone. The tests wait on
// events, or with eventually for what can only be seen by looking, never
// by sleeping a while.
package test

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
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"loam.dev/loam/client"
	"loam.dev/loam/internal/launch"
	"loam.dev/loam/internal/testenv"
)

// loamBin is the loam binary built for this run: the CLI, and the agent
// in sandboxes. daemonBin is the one `loam serve` runs: loamBin, or when
// the tests run under the race detector, loam built with -race, so that a
// data race in the daemon fails the test that made it (see races).
var loamBin, daemonBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 || findRunsc() == "" {
		if testenv.CI() {
			fmt.Fprintln(os.Stderr, "end-to-end tests need root and runsc (run scripts/setup); CI=true, so this is a failure")
			return 1
		}
		fmt.Fprintln(os.Stderr, "skipping end-to-end tests: they need root and runsc (run scripts/setup)")
		return 0
	}
	dir, err := os.MkdirTemp("", "loam-e2e-bin-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	loamBin, daemonBin = filepath.Join(dir, "loam"), filepath.Join(dir, "loam")
	if err := buildLoam(loamBin, false); err != nil {
		fmt.Fprintln(os.Stderr, "building loam:", err)
		return 1
	}
	if raceEnabled {
		// Only the daemon is built with -race (which needs cgo): the
		// agent in each sandbox must stay static, and the CLI, run a
		// great many times, would make the CLI-heavy tests four to five
		// times slower (its races are the unit tests' to find).
		daemonBin = filepath.Join(dir, "loam-race")
		if err := buildLoam(daemonBin, true); err != nil {
			fmt.Fprintln(os.Stderr, "building loam with -race:", err)
			return 1
		}
		os.Setenv("LOAM_AGENT_BINARY", loamBin)
	}
	// The SDK examples talk to a daemon of their own, found as a user's
	// program finds one: through LOAM_API_URL and LOAM_TOKEN.
	ex, err := exampleDaemon()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the examples' daemon:", err)
		return 1
	}
	os.Setenv("LOAM_API_URL", ex.URL)
	os.Setenv("LOAM_TOKEN", ex.Token)
	code := m.Run()
	ex.destroy()
	if race := ex.races(); race != "" {
		fmt.Fprintf(os.Stderr, "the examples' daemon had a data race:\n%s\n", race)
		code = 1
	}
	return code
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

// races is the first data race report in the daemon's log, if any (the
// daemon is built with -race when the tests are).
func (d *daemon) races() string {
	if d.log == nil {
		return ""
	}
	s := d.log.String()
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

func exampleDaemon() (*daemon, error) {
	dataDir, err := os.MkdirTemp("", "loam-e2e-examples-")
	if err != nil {
		return nil, err
	}
	d := &daemon{dataDir: dataDir, subnet: testSubnet(250)}
	if err := d.launch(); err != nil {
		d.destroy()
		return nil, err
	}
	return d, nil
}

func findRunsc() string {
	if p := os.Getenv("LOAM_RUNSC"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, _ := exec.LookPath("runsc")
	return p
}

// templateCache is where the tests' daemons share built templates, so the
// base template is built once per machine, not once per test.
func templateCache() string {
	if dir := os.Getenv("LOAM_TEMPLATE_CACHE"); dir != "" {
		return dir
	}
	return "/var/cache/loam/templates"
}

// daemon is a `loam serve` process run by a test.
type daemon struct {
	t       testing.TB
	dataDir string
	subnet  string
	// proc is the running daemon; cmd its process (nil once stopped),
	// exited closed when it has exited, so that stop, kill and the crash
	// tests can all watch.
	proc   *launch.Process
	cmd    *exec.Cmd
	exited <-chan struct{}
	log    *syncBuffer
	URL    string
	Token  string
	C      *client.Client
	// bin is the binary it runs (daemonBin when empty), env more of its
	// environment.
	bin string
	env []string
	// roots, when set, are the CAs its TLS certificate is checked against
	// (a daemon started with --tls-cert).
	roots *x509.CertPool
}

// httpClient is a client for the daemon's API: the default one, or one
// that trusts d.roots.
func (d *daemon) httpClient() *http.Client { return d.proc.HTTPClient }

// subnets hands each daemon of this package its own address range, so that
// two daemons never give out the same addresses. Tests that call
// t.Parallel start daemons at once, so it is atomic.
var subnetSeq atomic.Int64

// testSubnet is the n-th /24 of this run's test range, 10.89.0.0/16 unless
// LOAM_TEST_NET names another second octet (two runs at once on one host,
// from two checkouts, must use two).
func testSubnet(n int) string {
	octet := 89
	if v, err := strconv.Atoi(os.Getenv("LOAM_TEST_NET")); err == nil && v > 0 && v < 256 {
		octet = v
	}
	return fmt.Sprintf("10.%d.%d.0/24", octet, n)
}

// nextSubnet is the next test subnet for a daemon.
func nextSubnet() string {
	return testSubnet(int(subnetSeq.Add(1) % 250))
}

// startDaemon runs a daemon on a new data dir; it is stopped, and all it
// made removed, when the test ends.
func startDaemon(t testing.TB, extra ...string) *daemon {
	t.Helper()
	dataDir, err := os.MkdirTemp("", "loam-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, dataDir: dataDir, subnet: nextSubnet()}
	d.start(extra...)
	t.Cleanup(func() { d.destroy() })
	return d
}

func (d *daemon) start(extra ...string) {
	d.t.Helper()
	if err := d.launch(extra...); err != nil {
		d.t.Fatal(err)
	}
}

// errDaemonExited is wrapped by launch's error when the daemon exited
// before it answered.
var errDaemonExited = launch.ErrExited

// options are the launcher's options for this daemon, with more flags.
func (d *daemon) options(extra ...string) launch.Options {
	bin := daemonBin
	if d.bin != "" {
		bin = d.bin
	}
	return launch.Options{Bin: bin, DataDir: d.dataDir, Subnet: d.subnet, Runsc: findRunsc(),
		TemplateCache: templateCache(), DefaultTemplate: "busybox",
		Args: append([]string{"--disk-size-gib", "8"}, extra...),
		Env:  d.env, Output: d.log, Roots: d.roots, Timeout: 60 * time.Second}
}

// launch runs `loam serve` and waits until it answers.
func (d *daemon) launch(extra ...string) error {
	d.log = &syncBuffer{}
	p, err := launch.Start(context.Background(), d.options(extra...))
	if err != nil {
		return fmt.Errorf("%w:\n%s", err, d.log.String())
	}
	d.proc, d.cmd, d.exited = p, p.Cmd, p.Exited()
	d.URL, d.Token, d.C = p.URL, p.Token, p.Client
	return nil
}

// stop ends the daemon process (SIGTERM) and waits for it; its sandboxes
// keep running.
func (d *daemon) stop() {
	if d.cmd == nil {
		return
	}
	d.proc.Stop()
	d.cmd = nil
}

// destroy deletes every sandbox through the API, stops the daemon, and
// removes whatever is left: runsc containers, namespaces, mounts.
func (d *daemon) destroy() {
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	failed := false
	if d.t != nil {
		logf, failed = d.t.Logf, d.t.Failed()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if d.cmd != nil {
		if err := d.proc.DeleteSandboxes(ctx); err != nil {
			logf("cleanup: %v", err)
		}
		d.stop()
	}
	if race := d.races(); race != "" && d.t != nil {
		d.t.Errorf("the daemon had a data race:\n%s", race)
		failed = true
	}
	if failed || os.Getenv("LOAM_TEST_LOG") != "" {
		logf("daemon log:\n%s", d.log.String())
	}
	// Whatever the API could not delete: containers, namespaces, mounts,
	// the pool, the data dir, and the firewall (the daemon leaves it in
	// place when it stops, for its sandboxes; the test is done with it).
	if err := launch.Cleanup(ctx, d.options()); err != nil {
		logf("cleanup: %v", err)
	}
}

// deleteContainers force-deletes every runsc container under runscRoot.
func deleteContainers(runscRoot string) {
	launch.DeleteContainers(context.Background(), findRunsc(), runscRoot)
}

// unmountUnder unmounts every mount below dir and detaches loop devices.
func unmountUnder(dir string) { launch.UnmountUnder(context.Background(), dir) }

// startDaemonB is startDaemon for benchmarks.
func startDaemonB(b *testing.B, extra ...string) *daemon { return startDaemon(b, extra...) }

// cli runs the loam CLI against the daemon with stdin from in (nil: /dev/null).
func (d *daemon) cli(in string, args ...string) (stdout, stderr string, code int) {
	d.t.Helper()
	cmd := exec.Command(loamBin, args...)
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
		d.t.Fatalf("running loam %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

// run runs a command in a sandbox and returns its stdout, failing the test
// unless it exits 0.
func (d *daemon) run(sb string, cmd ...string) string {
	d.t.Helper()
	return d.runB(d.t, sb, cmd...)
}

// runB is run for a test or benchmark other than the daemon's own.
func (d *daemon) runB(t testing.TB, sb string, cmd ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, errb, code, err := d.C.Output(ctx, sb, cmd...)
	if err != nil || code != 0 {
		t.Fatalf("run %v in %s: code %d, err %v, stderr %q", cmd, sb, code, err, errb)
	}
	return string(out)
}

// kill ends the daemon process with SIGKILL, as a crash would.
func (d *daemon) kill() {
	if d.cmd == nil {
		return
	}
	d.proc.Kill()
	d.cmd = nil
}

// syncBuffer is a bytes.Buffer that the daemon's output can be written to
// while a test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// eventually waits until cond holds, looking every 50 ms, and fails the
// test after within. It is for what the tests can only see by looking (a
// process listed by ps, a file a daemon writes): where something sends an
// event, the tests wait for that instead.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		<-tick.C
	}
}

// killSettled ends the daemon with SIGKILL, as a crash would, and waits
// until the runsc commands it was running when it died have exited too:
// they outlive it and finish or fail what they were doing, as after a
// real crash, and the next daemon must not race them.
func (d *daemon) killSettled() {
	d.t.Helper()
	var kids []int
	if d.cmd != nil {
		kids = runscCommands(d.cmd.Process.Pid)
	}
	d.kill()
	eventually(d.t, time.Minute, "the runsc commands of a killed daemon exit", func() bool {
		for _, pid := range kids {
			if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
				return false
			}
		}
		return true
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
		if args[0] == findRunsc() && !slices.Contains(args, "boot") && !slices.Contains(args, "gofer") {
			kids = append(kids, n)
		}
	}
	return kids
}
