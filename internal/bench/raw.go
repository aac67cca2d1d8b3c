package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"loam.dev/loam/internal/checkpoint"
)

// rawBinDir is where a raw container sees the directory holding the loam
// binary: /tmp exists in every template, and a read-only root cannot get
// a new mount point (runsc would make it in the shared template tree).
const rawBinDir = "/tmp"

// RawDriver does the bench's operations with plain runsc commands, as
// RUNTIME.md measured them: systrap, no network, -direct checkpoints and
// restores, the template's tree as a read-only root shared by every
// container (the workload writes only to /dev/shm, a tmpfs). It keeps all
// its state in one directory of its own, removed by Close with every
// container left in it.
type RawDriver struct {
	runsc string
	// dir holds root/ (runsc's --root), bin/ (the loam binary), one
	// bundle per container and one image directory per checkpoint.
	dir string
	// rootfs maps a template name to its tree.
	rootfs map[string]string
	prefix string
	seq    atomicCounter

	mu    sync.Mutex
	boxes map[string]rawBox
	cps   map[string]string // checkpoint → image dir
}

// rawBox is what it takes to restore a container again.
type rawBox struct {
	template string
	mib      int
	// slept is the image a sleeping container wakes from.
	slept string
}

// NewRawDriver makes a driver keeping its state in a new directory under
// parent. rootfs maps template names to their trees; loamBin is the loam
// binary to run as each container's workload.
func NewRawDriver(runsc, parent, loamBin string, rootfs map[string]string) (*RawDriver, error) {
	dir, err := os.MkdirTemp(parent, "lb-")
	if err != nil {
		return nil, fmt.Errorf("making the raw driver's directory: %w", err)
	}
	d := &RawDriver{runsc: runsc, dir: dir, rootfs: rootfs, prefix: "loambench-" + randomHex(3),
		boxes: map[string]rawBox{}, cps: map[string]string{}}
	for _, sub := range []string{"root", "bin", "bundles", "images"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			d.Close()
			return nil, fmt.Errorf("making the raw driver's directory: %w", err)
		}
	}
	if err := copyFile(loamBin, filepath.Join(dir, "bin", "loam")); err != nil {
		d.Close()
		return nil, fmt.Errorf("copying the loam binary for raw containers: %w", err)
	}
	return d, nil
}

// Name implements Driver.
func (d *RawDriver) Name() string { return DriverRaw }

// Binary implements Driver.
func (d *RawDriver) Binary() string { return rawBinDir + "/loam" }

// HostID implements Driver: the box is the container id.
func (d *RawDriver) HostID(box string) string { return box }

// newID is a fixed-length container id: runsc matches ids by prefix.
func (d *RawDriver) newID() string {
	return fmt.Sprintf("%s-%06d", d.prefix, d.seq.next())
}

// Create implements Driver: runsc run -detach, then exec until it answers.
func (d *RawDriver) Create(ctx context.Context, template string, mib int) (string, error) {
	if _, ok := d.rootfs[template]; !ok {
		return "", fmt.Errorf("raw runsc: no tree for template %q", template)
	}
	id := d.newID()
	b := rawBox{template: template, mib: max(mib, 0)}
	if err := d.writeBundle(id, b); err != nil {
		return "", err
	}
	d.mu.Lock()
	d.boxes[id] = b
	d.mu.Unlock()
	if err := d.launch(ctx, id, "run", "-detach", "-bundle", d.bundle(id), id); err != nil {
		return id, err
	}
	return id, d.waitExec(ctx, id)
}

// waitExec runs true in id until it answers: runsc run -detach returns
// before init has run.
func (d *RawDriver) waitExec(ctx context.Context, id string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := d.Exec(ctx, id, "/bin/true")
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (d *RawDriver) bundle(id string) string { return filepath.Join(d.dir, "bundles", id) }

// writeBundle writes id's config.json: the workload as init, the template
// read-only, /dev/shm a tmpfs, no network.
func (d *RawDriver) writeBundle(id string, b rawBox) error {
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETGID", "CAP_SETUID"}
	spec := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Args: workloadCmd(d.Binary(), b.mib),
			Env:  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
		},
		Root:     &specs.Root{Path: d.rootfs[b.template], Readonly: true},
		Hostname: "loambench",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: rawBinDir, Type: "bind", Source: filepath.Join(d.dir, "bin"), Options: []string{"rbind", "ro"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace},
			},
		},
	}
	raw, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the spec of %s: %w", id, err)
	}
	if err := os.MkdirAll(d.bundle(id), 0o700); err != nil {
		return fmt.Errorf("writing the bundle of %s: %w", id, err)
	}
	if err := os.WriteFile(filepath.Join(d.bundle(id), "config.json"), raw, 0o600); err != nil {
		return fmt.Errorf("writing the bundle of %s: %w", id, err)
	}
	return nil
}

// command is one runsc command with the driver's global flags.
func (d *RawDriver) command(ctx context.Context, args ...string) *exec.Cmd {
	full := append([]string{"--root=" + filepath.Join(d.dir, "root"), "--platform=systrap",
		"--network=none", "--overlay2=none", "--ignore-cgroups"}, args...)
	cmd := exec.CommandContext(ctx, d.runsc, full...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// launch runs a runsc command that starts a container (run, restore).
// Init's stdio are files, not pipes: the detached sandbox keeps them.
func (d *RawDriver) launch(ctx context.Context, id string, args ...string) error {
	logf, err := os.OpenFile(filepath.Join(d.bundle(id), "init.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("runsc %s %s: %w", args[0], id, err)
	}
	defer logf.Close()
	cmd := d.command(ctx, append([]string{"--log=" + filepath.Join(d.bundle(id), "runsc.log")}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		tail, _ := os.ReadFile(filepath.Join(d.bundle(id), "runsc.log"))
		return fmt.Errorf("runsc %s %s: %w: %s", args[0], id, err, lastLine(string(tail)))
	}
	return nil
}

// run runs a runsc command and returns its stdout.
func (d *RawDriver) run(ctx context.Context, args ...string) (string, error) {
	cmd := d.command(ctx, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("runsc %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errOut.String()))
	}
	return out.String(), nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// Exec implements Driver: runsc exec, output through pipes.
func (d *RawDriver) Exec(ctx context.Context, box string, cmd ...string) (string, error) {
	return d.run(ctx, append([]string{"exec", box}, cmd...)...)
}

// newImage is a new, not yet existing image directory.
func (d *RawDriver) newImage() string {
	return filepath.Join(d.dir, "images", fmt.Sprintf("img-%06d", d.seq.next()))
}

// Checkpoint implements Driver: checkpoint -direct -leave-running. runsc
// has no disk-only checkpoint of its own.
func (d *RawDriver) Checkpoint(ctx context.Context, box string, memory bool) (string, int64, error) {
	if !memory {
		return "", 0, ErrUnsupported
	}
	img := d.newImage()
	if _, err := d.run(ctx, "checkpoint", "-direct", "-leave-running", "-image-path", img, box); err != nil {
		os.RemoveAll(img)
		return "", 0, err
	}
	cp := filepath.Base(img)
	d.mu.Lock()
	d.cps[cp] = img
	d.mu.Unlock()
	return cp, dirSize(img), nil
}

// SyncImage implements imageSyncer: raw runsc leaves its image in the page
// cache, and this fsyncs it the way loam does before it answers
// (checkpoint.SyncTree), for a comparison at equal durability.
func (d *RawDriver) SyncImage(ctx context.Context, cp string) (time.Duration, error) {
	d.mu.Lock()
	img, ok := d.cps[cp]
	d.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("no raw checkpoint %s", cp)
	}
	start := time.Now()
	if err := checkpoint.SyncTree(img); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// stop checkpoints box into a new image, stopping it, and removes the
// container: what loam's automatic checkpoint before a restore, and a
// sleep, do.
func (d *RawDriver) stop(ctx context.Context, box string) (string, error) {
	img := d.newImage()
	if _, err := d.run(ctx, "checkpoint", "-direct", "-image-path", img, box); err != nil {
		os.RemoveAll(img)
		return "", err
	}
	// A checkpointed container reports running for a second or so: force.
	if _, err := d.run(ctx, "delete", "-force", box); err != nil {
		return img, err
	}
	return img, nil
}

// restore restores id from img with b's bundle.
func (d *RawDriver) restore(ctx context.Context, id, img string) error {
	return d.launch(ctx, id, "restore", "-detach", "-direct", "-image-path", img, "-bundle", d.bundle(id), id)
}

// Restore implements Driver: checkpoint and stop (loam keeps such an
// automatic checkpoint), then restore the same id from cp.
func (d *RawDriver) Restore(ctx context.Context, box, cp string) error {
	img, err := d.image(cp)
	if err != nil {
		return err
	}
	auto, err := d.stop(ctx, box)
	if err != nil {
		return err
	}
	defer os.RemoveAll(auto)
	return d.restore(ctx, box, img)
}

func (d *RawDriver) image(cp string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	img, ok := d.cps[cp]
	if !ok {
		return "", fmt.Errorf("raw runsc: no checkpoint %s", cp)
	}
	return img, nil
}

// Fork implements Driver: restore cp into a new container id.
func (d *RawDriver) Fork(ctx context.Context, box, cp string) (string, error) {
	img, err := d.image(cp)
	if err != nil {
		return "", err
	}
	d.mu.Lock()
	b := d.boxes[box]
	d.mu.Unlock()
	id := d.newID()
	if err := d.writeBundle(id, b); err != nil {
		return "", err
	}
	d.mu.Lock()
	d.boxes[id] = rawBox{template: b.template, mib: b.mib}
	d.mu.Unlock()
	return id, d.restore(ctx, id, img)
}

// Sleep implements Driver.
func (d *RawDriver) Sleep(ctx context.Context, box string) error {
	img, err := d.stop(ctx, box)
	if err != nil {
		return err
	}
	d.mu.Lock()
	b := d.boxes[box]
	b.slept = img
	d.boxes[box] = b
	d.mu.Unlock()
	return nil
}

// Wake implements Driver.
func (d *RawDriver) Wake(ctx context.Context, box string) error {
	d.mu.Lock()
	img := d.boxes[box].slept
	d.mu.Unlock()
	if img == "" {
		return fmt.Errorf("raw runsc: %s is not asleep", box)
	}
	defer os.RemoveAll(img)
	return d.restore(ctx, box, img)
}

// Delete implements Driver.
func (d *RawDriver) Delete(ctx context.Context, box string) error {
	_, err := d.run(ctx, "delete", "-force", box)
	if err != nil && !strings.Contains(err.Error(), "does not exist") {
		return err
	}
	d.mu.Lock()
	delete(d.boxes, box)
	d.mu.Unlock()
	return os.RemoveAll(d.bundle(box))
}

// Close deletes every container the driver left and removes its
// directory.
func (d *RawDriver) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	if out, err := d.run(ctx, "list", "-quiet"); err == nil {
		for _, id := range strings.Fields(out) {
			if _, err := d.run(ctx, "delete", "-force", id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// runsc pins a network namespace for its gofers in its root.
	for {
		err := unix.Unmount(filepath.Join(d.dir, "root", "null-netns"), unix.MNT_DETACH)
		if err != nil {
			break
		}
	}
	if err := os.RemoveAll(d.dir); err != nil {
		errs = append(errs, fmt.Errorf("removing %s: %w", d.dir, err))
	}
	return errors.Join(errs...)
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o755)
}

// dropAll removes every checkpoint image: the runner calls it once a
// sequence's sandboxes are gone.
func (d *RawDriver) dropAll() {
	d.mu.Lock()
	cps := d.cps
	d.cps = map[string]string{}
	d.mu.Unlock()
	for _, img := range cps {
		os.RemoveAll(img)
	}
}

// OwnDisk implements diskMeasurer: a raw container's own files are its
// bundle and logs; its root is the shared template, its memory image the
// shared checkpoint.
func (d *RawDriver) OwnDisk(_ context.Context, box string) (int64, error) {
	return dirSize(d.bundle(box)), nil
}
