// Package test holds loam's end-to-end tests: they build the real loam
// binary, run `loam serve` as a separate process on a data dir of their own,
// and drive real gVisor sandboxes through the Go client and the CLI.
package test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"loam.dev/loam/client"
	"loam.dev/loam/internal/network"
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
	cmd     *exec.Cmd
	// exited is closed when cmd has exited: one goroutine waits for it,
	// so that launch, stop, kill and the crash tests can all watch.
	exited chan struct{}
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
func (d *daemon) httpClient() *http.Client {
	if d.roots == nil {
		return http.DefaultClient
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: d.roots}
	return &http.Client{Transport: tr}
}

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
var errDaemonExited = errors.New("the daemon exited before it answered")

// launch runs `loam serve` and waits until it answers.
func (d *daemon) launch(extra ...string) error {
	os.Remove(filepath.Join(d.dataDir, "api_url"))
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", d.dataDir,
		"--subnet", d.subnet, "--runsc", findRunsc(), "--default-template", "busybox",
		"--template-cache", templateCache(),
		// No test's DNS ever leaves the machine: a closed port here, unless
		// the test gives its own server (a later flag wins).
		"--dns-upstream", "127.0.0.1:1",
		"--disk-size-gib", "8"}, extra...)
	bin := daemonBin
	if d.bin != "" {
		bin = d.bin
	}
	d.cmd = exec.Command(bin, args...)
	d.cmd.Env = append(append(os.Environ(), "LOAM_TOKEN="), d.env...) // a test's own token file, never the caller's
	d.log = &syncBuffer{}
	d.cmd.Stdout = d.log
	d.cmd.Stderr = d.log
	if err := d.cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	d.exited = exited
	go func(cmd *exec.Cmd) { _ = cmd.Wait(); close(exited) }(d.cmd)
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join(d.dataDir, "api_url"))
		if err == nil {
			d.URL = strings.TrimSpace(string(b))
			break
		}
		select {
		case <-exited:
			return fmt.Errorf("%w:\n%s", errDaemonExited, d.log.String())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("daemon did not start:\n%s", d.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	tok, err := os.ReadFile(filepath.Join(d.dataDir, "token"))
	if err != nil {
		return err
	}
	d.Token = strings.TrimSpace(string(tok))
	hc := d.httpClient()
	d.C = client.New(d.URL, d.Token)
	if d.roots != nil {
		d.C = client.New(d.URL, d.Token, client.WithHTTPClient(hc))
	}
	for {
		resp, err := hc.Get(d.URL + "/healthz")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("daemon does not answer: %v\n%s", err, d.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// stop ends the daemon process (SIGTERM) and waits for it; its sandboxes
// keep running.
func (d *daemon) stop() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
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
	if d.cmd != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		sbs, err := d.C.ListSandboxes(ctx, client.ListOptions{})
		if err == nil {
			for _, sb := range sbs {
				if err := d.C.DeleteSandbox(ctx, sb.ID); err != nil {
					logf("cleanup: deleting %s: %v", sb.Name, err)
				}
			}
		}
		cancel()
		d.stop()
	}
	if race := d.races(); race != "" && d.t != nil {
		d.t.Errorf("the daemon had a data race:\n%s", race)
		failed = true
	}
	if failed || os.Getenv("LOAM_TEST_LOG") != "" {
		logf("daemon log:\n%s", d.log.String())
	}
	// Whatever the API could not delete: containers, namespaces, the pool.
	deleteContainers(filepath.Join(d.dataDir, "runsc"))
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			name, _, _ := strings.Cut(line, " ")
			if strings.HasPrefix(name, "loam-sb-") && d.ownsNetns(name) {
				exec.Command("ip", "netns", "del", name).Run()
			}
		}
	}
	unmountUnder(d.dataDir)
	os.RemoveAll(d.dataDir)
	// The daemon leaves its firewall in place when it stops (its sandboxes
	// outlive it); the test is done with it.
	if nets, err := network.New(network.Config{Subnet: netip.MustParsePrefix(d.subnet)}); err == nil {
		if err := nets.Firewall().Remove(context.Background()); err != nil {
			logf("cleanup: removing the firewall of %s: %v", d.subnet, err)
		}
	}
}

// deleteContainers force-deletes every runsc container under runscRoot.
func deleteContainers(runscRoot string) {
	out, err := exec.Command(findRunsc(), "--root", runscRoot, "list", "-quiet").Output()
	if err != nil {
		return
	}
	for _, id := range strings.Fields(string(out)) {
		exec.Command(findRunsc(), "--root", runscRoot, "delete", "-force", id).Run()
	}
}

// ownsNetns tells whether a namespace belongs to this daemon: its sandbox
// has a directory in the daemon's data dir.
func (d *daemon) ownsNetns(name string) bool {
	_, err := os.Stat(filepath.Join(d.dataDir, "sandboxes", strings.TrimPrefix(name, "loam-")))
	return err == nil
}

// unmountUnder unmounts every mount below dir and detaches loop devices.
func unmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return
	}
	var mounts []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
			mounts = append(mounts, f[1])
		}
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		exec.Command("umount", "-l", mounts[i]).Run()
	}
	if out, err := exec.Command("losetup", "-j", filepath.Join(dir, "disk", "disk.img")).Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if dev, _, ok := strings.Cut(line, ":"); ok {
				exec.Command("losetup", "-d", dev).Run()
			}
		}
	}
}

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
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	_ = d.cmd.Process.Kill()
	<-d.exited
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
