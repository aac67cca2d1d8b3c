package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/runtime"
)

// Names of the two drivers, as results show them.
const (
	DriverLoam = "loam"
	DriverRaw  = "raw"
)

// ErrUnsupported is returned by a Driver for an operation it has no
// equivalent of (raw runsc has no disk-only checkpoint).
var ErrUnsupported = errors.New("not supported by this driver")

// Driver does the bench's operations on one kind of sandbox. A box is the
// driver's name for one sandbox, a cp for one checkpoint of it. Every
// method is safe for concurrent use on different boxes.
type Driver interface {
	// Name is DriverLoam or DriverRaw.
	Name() string
	// Create starts a sandbox of template running the workload with mib
	// MiB (0: only the ticker) and returns once the sandbox answers an
	// exec; the workload may still be writing its memory.
	Create(ctx context.Context, template string, mib int) (box string, err error)
	// Exec runs cmd in box and returns its stdout; a nonzero exit is an
	// error with its stderr.
	Exec(ctx context.Context, box string, cmd ...string) (string, error)
	// Binary is the path of the loam binary inside the driver's sandboxes.
	Binary() string
	// Checkpoint takes a checkpoint of box, with its memory or of its disk
	// alone, leaving box running, and returns it with its size on disk in
	// bytes (0 when unknown).
	Checkpoint(ctx context.Context, box string, memory bool) (cp string, size int64, err error)
	// Restore puts box back to cp in place, returning once it runs.
	Restore(ctx context.Context, box, cp string) error
	// Fork starts a new sandbox from cp of box and returns it once it runs.
	Fork(ctx context.Context, box, cp string) (string, error)
	// Sleep stops box keeping its memory; Wake brings it back.
	Sleep(ctx context.Context, box string) error
	Wake(ctx context.Context, box string) error
	// Delete removes box and what it holds, checkpoints included.
	Delete(ctx context.Context, box string) error
	// HostID is the string that names box on its host processes' command
	// lines (the runsc container id), for measuring their memory.
	HostID(box string) string
}

// randomHex returns n random bytes in hex: ids that never meet another
// run's.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// workloadCmd is the command line that runs the workload in a sandbox.
func workloadCmd(bin string, mib int) []string {
	return []string{bin, "bench", "workload", "--mib", strconv.Itoa(mib), "--dir", WorkloadDir}
}

// LoamDriver drives a loam daemon through the Go client.
type LoamDriver struct {
	c *client.Client
	// dataDir is the daemon's data dir, for checkpoint sizes; "" if
	// unknown.
	dataDir string
	prefix  string
	seq     atomicCounter
}

// NewLoamDriver returns a driver for the daemon c talks to. dataDir is
// that daemon's data dir when it is on this host and readable (checkpoint
// images are measured there), else "".
func NewLoamDriver(c *client.Client, dataDir string) *LoamDriver {
	return &LoamDriver{c: c, dataDir: dataDir, prefix: "loambench-" + randomHex(3)}
}

// Name implements Driver.
func (d *LoamDriver) Name() string { return DriverLoam }

// Binary implements Driver: the agent is the loam binary.
func (d *LoamDriver) Binary() string { return runtime.AgentPath }

// HostID implements Driver: loam names a sandbox's container by its id.
func (d *LoamDriver) HostID(box string) string { return box }

func (d *LoamDriver) name() string {
	return fmt.Sprintf("%s-%04d", d.prefix, d.seq.next())
}

// Create implements Driver. The sandbox's memory limit leaves room above
// the workload for the agent and the shell.
func (d *LoamDriver) Create(ctx context.Context, template string, mib int) (string, error) {
	req := api.CreateSandbox{Name: d.name(), Template: template}
	if mib > 0 {
		req.Resources = &api.Resources{MemoryMiB: mib + 1024}
	}
	sb, err := d.c.CreateSandbox(ctx, req)
	if err != nil {
		return "", fmt.Errorf("creating a %s sandbox: %w", template, err)
	}
	if mib < 0 {
		return sb.ID, nil
	}
	// Detachable: a memory checkpoint ends exec streams, and the workload
	// must run through it.
	if _, err := d.c.CreateSession(ctx, sb.ID, api.ExecRequest{Cmd: workloadCmd(runtime.AgentPath, mib), Detachable: true}); err != nil {
		return sb.ID, fmt.Errorf("starting the workload in %s: %w", sb.ID, err)
	}
	return sb.ID, nil
}

// Exec implements Driver.
func (d *LoamDriver) Exec(ctx context.Context, box string, cmd ...string) (string, error) {
	out, errOut, code, err := d.c.Output(ctx, box, cmd...)
	if err != nil {
		return "", fmt.Errorf("running %s in %s: %w", cmd[0], box, err)
	}
	if code != 0 {
		return "", fmt.Errorf("running %s in %s: exit %d: %s", cmd[0], box, code, strings.TrimSpace(string(errOut)))
	}
	return string(out), nil
}

// Checkpoint implements Driver.
func (d *LoamDriver) Checkpoint(ctx context.Context, box string, memory bool) (string, int64, error) {
	cp, err := d.c.CreateCheckpoint(ctx, box, api.CreateCheckpoint{Memory: &memory, Comment: "loam bench"})
	if err != nil {
		return "", 0, fmt.Errorf("checkpointing %s: %w", box, err)
	}
	var size int64
	if d.dataDir != "" {
		size = dirSize(filepath.Join(d.dataDir, "checkpoints", box, cp.ID))
	}
	return cp.ID, size, nil
}

// Restore implements Driver.
func (d *LoamDriver) Restore(ctx context.Context, box, cp string) error {
	if _, err := d.c.RestoreCheckpoint(ctx, box, cp); err != nil {
		return fmt.Errorf("restoring %s to %s: %w", box, cp, err)
	}
	return nil
}

// Fork implements Driver.
func (d *LoamDriver) Fork(ctx context.Context, box, cp string) (string, error) {
	sb, err := d.c.Fork(ctx, box, cp, d.name())
	if err != nil {
		return "", fmt.Errorf("forking %s of %s: %w", cp, box, err)
	}
	return sb.ID, nil
}

// SetPool implements pooler: the warm pool of cp of box, waited for until
// ready members are.
func (d *LoamDriver) SetPool(ctx context.Context, box, cp string, size, ready int) error {
	if _, err := d.c.SetCheckpointPool(ctx, box, cp, size); err != nil {
		return err
	}
	return waitPool(ctx, ready, func() (*api.Pool, error) { return d.c.CheckpointPool(ctx, box, cp) })
}

// SetTemplatePool implements pooler.
func (d *LoamDriver) SetTemplatePool(ctx context.Context, template string, size, ready int) error {
	if _, err := d.c.SetTemplatePool(ctx, template, size); err != nil {
		return err
	}
	return waitPool(ctx, ready, func() (*api.Pool, error) { return d.c.TemplatePool(ctx, template) })
}

// waitPool polls a pool until it has ready members ready; a pool that
// holds back (short of memory, failing) ends the wait with its reason.
func waitPool(ctx context.Context, ready int, get func() (*api.Pool, error)) error {
	for {
		p, err := get()
		if err != nil {
			return err
		}
		if p.Ready >= ready {
			return nil
		}
		if p.Held != "" && p.Starting == 0 {
			return fmt.Errorf("the warm pool has %d of %d ready and is not filling: %s", p.Ready, ready, p.Held)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the warm pool: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Sleep implements Driver.
func (d *LoamDriver) Sleep(ctx context.Context, box string) error {
	if _, err := d.c.Sleep(ctx, box); err != nil {
		return fmt.Errorf("putting %s to sleep: %w", box, err)
	}
	return nil
}

// Wake implements Driver.
func (d *LoamDriver) Wake(ctx context.Context, box string) error {
	if _, err := d.c.Wake(ctx, box); err != nil {
		return fmt.Errorf("waking %s: %w", box, err)
	}
	return nil
}

// Delete implements Driver.
func (d *LoamDriver) Delete(ctx context.Context, box string) error {
	if err := d.c.DeleteSandbox(ctx, box); err != nil && !errors.Is(err, api.ErrNotFound) {
		return fmt.Errorf("deleting %s: %w", box, err)
	}
	return nil
}

// dirSize is the bytes the files under dir take on disk (allocated
// blocks: a sparse image counts what it holds).
func dirSize(dir string) int64 {
	out, err := exec.Command("du", "-s", "-B1", dir).Output()
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.Fields(string(out))[0], 10, 64)
	return n
}

// hostMemory sums the PSS and RSS, in KiB, of every host process whose
// command line holds id (runsc's sandbox and gofer of a container).
func hostMemory(id string) (pss, rss int, err error) {
	out, err := exec.Command("pgrep", "-f", "--", id).Output()
	if err != nil {
		return 0, 0, fmt.Errorf("finding the processes of %s: %w", id, err)
	}
	for _, pid := range strings.Fields(string(out)) {
		raw, err := os.ReadFile("/proc/" + pid + "/smaps_rollup")
		if err != nil {
			continue // gone meanwhile
		}
		for _, line := range strings.Split(string(raw), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			kib, _ := strconv.Atoi(f[1])
			switch f[0] {
			case "Pss:":
				pss += kib
			case "Rss:":
				rss += kib
			}
		}
	}
	return pss, rss, nil
}

// diskMeasurer is a Driver that can tell the host disk a sandbox holds of
// its own: what is not shared with its template or checkpoint.
type diskMeasurer interface {
	OwnDisk(ctx context.Context, box string) (int64, error)
}

// OwnDisk implements diskMeasurer: the bytes only box's btrfs volume holds
// (a fork's volume is a snapshot: it owns what it changed) plus its
// sandbox directory (bundle, logs).
func (d *LoamDriver) OwnDisk(ctx context.Context, box string) (int64, error) {
	if d.dataDir == "" {
		return 0, fmt.Errorf("measuring the disk of %s: %w", box, ErrUnsupported)
	}
	vol := ""
	for _, root := range []string{filepath.Join(d.dataDir, "disk", "mnt"), filepath.Join(d.dataDir, "disk")} {
		if _, err := os.Stat(filepath.Join(root, "volumes", box)); err == nil {
			vol = filepath.Join(root, "volumes", box)
			break
		}
	}
	if vol == "" {
		return 0, fmt.Errorf("measuring the disk of %s: no volume in %s", box, d.dataDir)
	}
	out, err := exec.CommandContext(ctx, "btrfs", "filesystem", "du", "-s", "--raw", vol).Output()
	if err != nil {
		return 0, fmt.Errorf("measuring the disk of %s: btrfs filesystem du: %w", box, err)
	}
	excl, err := parseBtrfsDu(string(out))
	if err != nil {
		return 0, fmt.Errorf("measuring the disk of %s: %w", box, err)
	}
	return excl + dirSize(filepath.Join(d.dataDir, "sandboxes", box)), nil
}

// parseBtrfsDu returns the Exclusive column of `btrfs filesystem du -s
// --raw`: a header line, then "TOTAL EXCLUSIVE SET-SHARED PATH".
func parseBtrfsDu(out string) (int64, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2 {
		return 0, fmt.Errorf("btrfs filesystem du said %q", out)
	}
	f := strings.Fields(lines[len(lines)-1])
	if len(f) < 3 {
		return 0, fmt.Errorf("btrfs filesystem du said %q", out)
	}
	n, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("btrfs filesystem du said %q: %w", out, err)
	}
	return n, nil
}
