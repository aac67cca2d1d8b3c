package bench

import (
	"context"
	"errors"
	"fmt"
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

// PrivateConfig configures a private daemon.
type PrivateConfig struct {
	// Loam is the loam binary to run as `loam serve`.
	Loam string
	// Runsc is the runsc binary; "" is runsc in PATH.
	Runsc string
	// Subnet is the daemon's address range; it must not be another
	// daemon's.
	Subnet string
	// TemplateCache is where built templates are shared.
	TemplateCache string
	// DefaultTemplate is the daemon's default template.
	DefaultTemplate string
	// Log receives the daemon's output; nil discards it.
	Log *os.File
}

// Private is a `loam serve` the bench started on a temporary data dir of
// its own; Close stops it and removes all it made.
type Private struct {
	cfg     PrivateConfig
	DataDir string
	Client  *client.Client
	cmd     *exec.Cmd
	// exited is closed once the daemon process has exited.
	exited chan struct{}
}

// StartPrivate starts a daemon and waits until it answers.
func StartPrivate(ctx context.Context, cfg PrivateConfig) (*Private, error) {
	if _, err := netip.ParsePrefix(cfg.Subnet); err != nil {
		return nil, fmt.Errorf("starting a private daemon: subnet: %w", err)
	}
	dir, err := os.MkdirTemp("", "loam-bench-")
	if err != nil {
		return nil, fmt.Errorf("starting a private daemon: %w", err)
	}
	p := &Private{cfg: cfg, DataDir: dir}
	args := []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", dir, "--subnet", cfg.Subnet,
		"--template-cache", cfg.TemplateCache, "--default-template", cfg.DefaultTemplate,
		// Nothing the bench runs resolves names; no DNS leaves the host.
		"--dns-upstream", "127.0.0.1:1",
		// Every rep takes checkpoints of its own sandboxes.
		"--checkpoint-limit", "1000"}
	if cfg.Runsc != "" {
		args = append(args, "--runsc", cfg.Runsc)
	}
	p.cmd = exec.Command(cfg.Loam, args...)
	// Its own token file, never the caller's token.
	p.cmd.Env = append(os.Environ(), "LOAM_TOKEN=", "LOAM_DATA_DIR=")
	if cfg.Log != nil {
		p.cmd.Stdout, p.cmd.Stderr = cfg.Log, cfg.Log
	}
	// Its own process group: a Ctrl-C at the terminal stops the bench,
	// which then deletes the sandboxes through the daemon before stopping it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting a private daemon: %w", err)
	}
	if err := p.wait(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("starting a private daemon: %w", err), p.Close())
	}
	return p, nil
}

// wait waits for the daemon's api_url and token files, then its answer.
func (p *Private) wait(ctx context.Context) error {
	exited := make(chan struct{})
	p.exited = exited
	go func() {
		_ = p.cmd.Wait()
		close(exited)
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		url, err1 := os.ReadFile(filepath.Join(p.DataDir, "api_url"))
		tok, err2 := os.ReadFile(filepath.Join(p.DataDir, "token"))
		if err1 == nil && err2 == nil {
			p.Client = client.New(strings.TrimSpace(string(url)), strings.TrimSpace(string(tok)))
			if resp, err := http.Get(p.Client.URL() + "/healthz"); err == nil {
				resp.Body.Close()
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("the daemon exited (see --daemon-log)")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("the daemon did not answer within 2 minutes")
		}
	}
}

// Close deletes the daemon's sandboxes, stops it, and removes what it
// left: runsc containers, network namespaces, mounts, loop devices, its
// firewall and the data dir.
func (p *Private) Close() error {
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if p.Client != nil {
		if sbs, err := p.Client.ListSandboxes(ctx, client.ListOptions{}); err == nil {
			for _, sb := range sbs {
				if err := p.Client.DeleteSandbox(ctx, sb.ID); err != nil {
					errs = append(errs, fmt.Errorf("deleting %s: %w", sb.Name, err))
				}
			}
		}
	}
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	runsc := p.cfg.Runsc
	if runsc == "" {
		runsc = "runsc"
	}
	root := filepath.Join(p.DataDir, "runsc")
	if out, err := exec.Command(runsc, "--root", root, "list", "-quiet").Output(); err == nil {
		for _, id := range strings.Fields(string(out)) {
			_ = exec.Command(runsc, "--root", root, "delete", "-force", id).Run()
		}
	}
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			name, _, _ := strings.Cut(line, " ")
			if !strings.HasPrefix(name, "loam-sb-") {
				continue
			}
			// Only namespaces of this daemon's sandboxes.
			if _, err := os.Stat(filepath.Join(p.DataDir, "sandboxes", strings.TrimPrefix(name, "loam-"))); err == nil {
				_ = exec.Command("ip", "netns", "del", name).Run()
			}
		}
	}
	unmountUnder(p.DataDir)
	if err := os.RemoveAll(p.DataDir); err != nil {
		errs = append(errs, fmt.Errorf("removing %s: %w", p.DataDir, err))
	}
	// A stopped daemon leaves its firewall for its sandboxes; they are gone.
	if nets, err := network.New(network.Config{Subnet: netip.MustParsePrefix(p.cfg.Subnet)}); err == nil {
		if err := nets.Firewall().Remove(ctx); err != nil {
			errs = append(errs, fmt.Errorf("removing the firewall of %s: %w", p.cfg.Subnet, err))
		}
	}
	return errors.Join(errs...)
}

// unmountUnder unmounts every mount below dir, deepest first, and
// detaches the loop device of the daemon's disk pool.
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
		_ = exec.Command("umount", "-l", mounts[i]).Run()
	}
	if out, err := exec.Command("losetup", "-j", filepath.Join(dir, "disk", "disk.img")).Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if dev, _, ok := strings.Cut(line, ":"); ok {
				_ = exec.Command("losetup", "-d", dev).Run()
			}
		}
	}
}
