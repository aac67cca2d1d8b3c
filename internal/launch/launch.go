// Package launch starts a `loam serve` daemon as a child process on a data
// dir of its own, and tears down all it made: the one launcher of the bench
// (`loam bench --private`) and the end-to-end tests.
//
// A daemon leaves its sandboxes, their mounts, network namespaces, loop
// devices and its nftables table in place when it stops (a restarted daemon
// takes them back). A launched daemon is a throwaway: Cleanup removes all of
// that, so nothing outlives the bench run or the test.
package launch

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"loam.dev/loam/client"
	"loam.dev/loam/internal/network"
)

// ErrExited is wrapped by Start's error when the daemon exited before it
// answered.
var ErrExited = errors.New("the daemon exited before it answered")

// ErrTimeout is wrapped by Start's error when the daemon did not answer in
// Options.Timeout.
var ErrTimeout = errors.New("the daemon did not answer in time")

// DefaultTimeout is how long Start waits for a daemon to answer when
// Options.Timeout is zero: a first start may build the base template.
const DefaultTimeout = 2 * time.Minute

// StopGrace is how long Stop waits after SIGTERM before it kills.
const StopGrace = 30 * time.Second

// Options says how to run `loam serve`.
type Options struct {
	// Bin is the loam binary to run.
	Bin string
	// DataDir is the daemon's data dir; it must exist.
	DataDir string
	// Subnet is the daemon's address range; no other daemon on the host
	// may use it (its nftables table is named after it).
	Subnet string
	// Runsc is the runsc binary; "" is runsc in PATH.
	Runsc string
	// TemplateCache is where built templates are shared between daemons;
	// "" is the daemon's default.
	TemplateCache string
	// DefaultTemplate is the daemon's default template; "" is the
	// daemon's default.
	DefaultTemplate string
	// Args are more flags of `loam serve`, after the ones above (a later
	// flag wins).
	Args []string
	// Env is more of the daemon's environment, after the caller's own
	// (where LOAM_TOKEN and LOAM_DATA_DIR are cleared: a launched daemon
	// has its own token file, never the caller's).
	Env []string
	// Output receives the daemon's stdout and stderr; nil discards them.
	Output io.Writer
	// Roots, when set, are the CAs the daemon's TLS certificate is
	// checked against (a daemon started with --tls-cert).
	Roots *x509.CertPool
	// OwnProcessGroup runs the daemon in a process group of its own, so a
	// Ctrl-C at the terminal reaches only the caller, which then tears
	// the daemon down in order.
	OwnProcessGroup bool
	// Timeout bounds the wait for the daemon's first answer; 0 is
	// DefaultTimeout.
	Timeout time.Duration
	// Netns, when set, is the path of a network namespace to run the
	// daemon in (a node of a test's cluster, with a link of its own to
	// drop). Only the network is entered (nsenter --net), not a mount
	// namespace as `ip netns exec` makes: the daemon's mounts must stay
	// the host's, for its restart to find them and Cleanup to remove
	// them. Its firewall is in that namespace, and goes with it.
	Netns string
	// Credential, when set, is the user and group the daemon runs as
	// instead of the caller's: a cluster's front end (--role api), which
	// needs no root. Its data dir must be that user's.
	Credential *syscall.Credential
}

// Process is a running `loam serve`.
type Process struct {
	// URL and Token are the daemon's API address and token, read from
	// its data dir.
	URL, Token string
	// Client is a client of the daemon's API.
	Client *client.Client
	// HTTPClient is an HTTP client that trusts the daemon's certificate.
	HTTPClient *http.Client
	// Cmd is the daemon's process.
	Cmd *exec.Cmd
	// exited is closed once Cmd has exited: one goroutine waits for it,
	// so that Stop, Kill and the caller can all watch.
	exited chan struct{}
}

// Start runs `loam serve` on o.DataDir and waits until it answers on
// /healthz. On an error the process, if it started, is killed and waited
// for; the data dir is left to the caller (see Cleanup).
func Start(ctx context.Context, o Options) (*Process, error) {
	if _, err := netip.ParsePrefix(o.Subnet); err != nil {
		return nil, fmt.Errorf("starting a daemon: subnet: %w", err)
	}
	// A file of a previous run of this data dir must not be taken for
	// this one's answer.
	os.Remove(filepath.Join(o.DataDir, "api_url"))
	args := []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", o.DataDir, "--subnet", o.Subnet,
		// No launched daemon's DNS leaves the machine: a closed port,
		// unless the caller gives its own server (a later flag wins).
		"--dns-upstream", "127.0.0.1:1"}
	if o.Runsc != "" {
		args = append(args, "--runsc", o.Runsc)
	}
	if o.TemplateCache != "" {
		args = append(args, "--template-cache", o.TemplateCache)
	}
	if o.DefaultTemplate != "" {
		args = append(args, "--default-template", o.DefaultTemplate)
	}
	args = append(args, o.Args...)
	cmd := exec.Command(o.Bin, args...)
	if o.Netns != "" {
		// nsenter execs the daemon: its pid is the daemon's.
		cmd = exec.Command("nsenter", append([]string{"--net=" + o.Netns, "--", o.Bin}, args...)...)
	}
	cmd.Env = append(append(os.Environ(), "LOAM_TOKEN=", "LOAM_DATA_DIR="), o.Env...)
	if o.Output != nil {
		cmd.Stdout, cmd.Stderr = o.Output, o.Output
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: o.OwnProcessGroup, Credential: o.Credential}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting a daemon: %w", err)
	}
	p := &Process{Cmd: cmd, exited: make(chan struct{}), HTTPClient: http.DefaultClient}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	if o.Roots != nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{RootCAs: o.Roots}
		p.HTTPClient = &http.Client{Transport: tr}
	}
	timeout := o.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("%w (%v)", ErrTimeout, timeout))
	defer cancel()
	if err := p.await(ctx, o.DataDir); err != nil {
		p.Kill()
		return nil, fmt.Errorf("starting a daemon on %s: %w", o.DataDir, err)
	}
	return p, nil
}

// await waits for the daemon's api_url and token files, then for its
// answer. The daemon writes api_url once it listens, so there is nothing
// to be told but by looking; it looks every 20 ms.
func (p *Process) await(ctx context.Context, dataDir string) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	// What was last seen, for an error that says where the daemon was.
	seen := "its api_url file was not written"
	for {
		if p.URL == "" {
			if b, err := os.ReadFile(filepath.Join(dataDir, "api_url")); err == nil {
				tok, err := os.ReadFile(filepath.Join(dataDir, "token"))
				if err != nil {
					return fmt.Errorf("reading the token: %w", err)
				}
				p.URL, p.Token = strings.TrimSpace(string(b)), strings.TrimSpace(string(tok))
				var opts []client.Option
				if p.HTTPClient != http.DefaultClient {
					opts = append(opts, client.WithHTTPClient(p.HTTPClient))
				}
				p.Client = client.New(p.URL, p.Token, opts...)
			}
		}
		if p.URL != "" {
			// Bound by ctx: a port that takes the connection but does not
			// answer yet must not hold the wait past its end.
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/healthz", nil)
			if err != nil {
				return err
			}
			resp, err := p.HTTPClient.Do(req)
			if err == nil {
				resp.Body.Close()
				return nil
			}
			seen = "its /healthz: " + err.Error()
		}
		select {
		case <-p.exited:
			return ErrExited
		case <-ctx.Done():
			return fmt.Errorf("%w; %s", context.Cause(ctx), seen)
		case <-tick.C:
		}
	}
}

// Exited is closed once the daemon process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Stop ends the daemon with SIGTERM and waits for it; after StopGrace it
// kills it. Its sandboxes keep running (see DeleteSandboxes, Cleanup).
func (p *Process) Stop() {
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(StopGrace):
		p.Kill()
	}
}

// Kill ends the daemon with SIGKILL, as a crash would, and waits for it.
func (p *Process) Kill() {
	_ = p.Cmd.Process.Kill()
	<-p.exited
}

// DeleteSandboxes deletes every sandbox of the daemon through its API.
func (p *Process) DeleteSandboxes(ctx context.Context) error {
	sbs, err := p.Client.ListSandboxes(ctx, client.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing sandboxes: %w", err)
	}
	var errs []error
	for _, sb := range sbs {
		if err := p.Client.DeleteSandbox(ctx, sb.ID); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w", sb.Name, err))
		}
	}
	return errors.Join(errs...)
}

// Close deletes the daemon's sandboxes, stops it, and removes all it
// left (Cleanup).
func (p *Process) Close(ctx context.Context, o Options) error {
	err := p.DeleteSandboxes(ctx)
	p.Stop()
	return errors.Join(err, Cleanup(ctx, o))
}

// Cleanup removes whatever a stopped daemon of o left: its runsc
// containers, the network namespaces of its sandboxes, the mounts below
// its data dir and its disk pool's loop device, the data dir itself, and
// its firewall (a stopped daemon leaves it for its sandboxes; they are
// gone). It goes on past a failure and returns them all.
func Cleanup(ctx context.Context, o Options) error {
	var errs []error
	DeleteContainers(ctx, o.Runsc, filepath.Join(o.DataDir, "runsc"))
	if out, err := exec.CommandContext(ctx, "ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			name, _, _ := strings.Cut(line, " ")
			// loam-sb-ID alone, loam-NODE-sb-ID on a node of a cluster
			// (network.Config.Node).
			i := strings.LastIndex(name, "sb-")
			if !strings.HasPrefix(name, "loam-") || i < 0 || name[:i] != "loam-"+nodePrefix(o.Args) {
				continue
			}
			// Only namespaces of this daemon's sandboxes: they have a
			// directory in its data dir.
			if _, err := os.Stat(filepath.Join(o.DataDir, "sandboxes", name[i:])); err == nil {
				if err := exec.CommandContext(ctx, "ip", "netns", "del", name).Run(); err != nil {
					errs = append(errs, fmt.Errorf("deleting netns %s: %w", name, err))
				}
			}
		}
	}
	UnmountUnder(ctx, o.DataDir)
	if err := os.RemoveAll(o.DataDir); err != nil {
		errs = append(errs, fmt.Errorf("removing %s: %w", o.DataDir, err))
	}
	if prefix, err := netip.ParsePrefix(o.Subnet); err == nil && o.Netns == "" {
		if nets, err := network.New(network.Config{Subnet: prefix}); err == nil {
			if err := nets.Firewall().Remove(ctx); err != nil {
				errs = append(errs, fmt.Errorf("removing the firewall of %s: %w", o.Subnet, err))
			}
		}
	}
	return errors.Join(errs...)
}

// nodePrefix is "NODE-" for the --node NODE (or --node=NODE) of args, the
// last one winning, and "" without one: what a node's namespace names
// carry (network.Config.Node).
func nodePrefix(args []string) string {
	node := ""
	for i, a := range args {
		switch {
		case a == "--node" && i+1 < len(args):
			node = args[i+1]
		case strings.HasPrefix(a, "--node="):
			node = strings.TrimPrefix(a, "--node=")
		}
	}
	if node == "" {
		return ""
	}
	return node + "-"
}

// DeleteContainers force-deletes every runsc container under root; runsc
// "" is runsc in PATH.
func DeleteContainers(ctx context.Context, runsc, root string) {
	if runsc == "" {
		runsc = "runsc"
	}
	out, err := exec.CommandContext(ctx, runsc, "--root", root, "list", "-quiet").Output()
	if err != nil {
		return
	}
	for _, id := range strings.Fields(string(out)) {
		_ = exec.CommandContext(ctx, runsc, "--root", root, "delete", "-force", id).Run()
	}
}

// UnmountUnder unmounts every mount below dir, deepest first, and detaches
// the loop device of a disk pool at dir/disk/disk.img.
func UnmountUnder(ctx context.Context, dir string) {
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
		_ = exec.CommandContext(ctx, "umount", "-l", mounts[i]).Run()
	}
	if out, err := exec.CommandContext(ctx, "losetup", "-j", filepath.Join(dir, "disk", "disk.img")).Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if dev, _, ok := strings.Cut(line, ":"); ok {
				_ = exec.CommandContext(ctx, "losetup", "-d", dev).Run()
			}
		}
	}
}
