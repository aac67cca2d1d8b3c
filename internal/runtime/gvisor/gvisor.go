// Package gvisor is loam's container runtime: it drives gVisor's runsc
// binary, one command per call, and keeps no state of its own, so a
// restarted daemon finds its containers again through runsc.
//
// On-disk layout: runsc keeps its container state in Config.Root, one per
// daemon. Each container's bundle directory (runtime.Spec.BundleDir) holds
//
//	config.json  the OCI spec, rewritten at every Start and Restore
//	init.log     init's stdout and stderr, appended to across restores and
//	             restarts of the daemon
//	runsc.log    errors of runsc run and restore and of the sandbox and
//	             gofer processes they start, as JSON objects
//	*.log.1      the newest part of a log before TrimLogs last emptied it
//	debug/       runsc's debug logs, when Config.Debug is set
//
// The logs grow until TrimLogs cuts them (LogKeeper does, every few
// seconds).
//
// Containers run detached: runsc's sandbox and gofer processes start their
// own sessions and are re-parented to the host's init, so they outlive the
// daemon, and the daemon has no children left to reap once a call returns.
package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"loam.dev/loam/internal/runtime"
)

// Config configures a Runtime.
type Config struct {
	// Runsc is the path of the runsc binary (a static build).
	Runsc string
	// Root is runsc's state directory (--root). Each daemon needs its own,
	// so that containers of two daemons (or two tests) never meet. Keep its
	// path short: runsc makes a Unix socket per container in it, and
	// socket paths are limited to 107 bytes.
	Root string
	// Platform is gVisor's platform; default "systrap".
	Platform string
	// DisableFastPath turns systrap's fast path off
	// (--systrap-disable-fast-path). By default gVisor turns it on while
	// it pays: a thread spins for the next syscall instead of sleeping.
	// On a host with more busy sandboxes than cores the spinning takes
	// the CPU the others need: 3 sandboxes running commands at once on 2
	// cores took 14% less CPU and time with it off, one alone on an idle
	// host 7% longer (README, "Sandbox settings").
	DisableFastPath bool
	// Debug makes runsc write debug logs: those of the sandbox into the
	// bundle's debug/ directory, those of other commands into Root/debug/.
	Debug bool
	// Logger receives one debug record per runsc command; default none.
	Logger *slog.Logger
}

// Runtime runs containers with runsc. It implements runtime.Runtime and is
// safe for concurrent use on different ids.
type Runtime struct {
	runsc  string
	root   string
	global []string
	debug  bool
	log    *slog.Logger
	// background makes every Restore load the memory image in the
	// background, as runtime.Spec.Background does one: the package's
	// benchmarks set it to compare the two.
	background bool
	// holdPaused: runsc checkpoint has -hold-paused (CheckpointHeld).
	holdPaused bool
	// synced: runsc checkpoint has -synced (Checkpoint's Flushed runs
	// while the memory is written).
	synced bool
	// overlapped counts the held checkpoints whose whilePaused ran from
	// runsc's "synced", while the memory was written (tests read it).
	overlapped atomic.Int64
	// writeCgroup writes a cgroup control file: writeCgroupFile, or in
	// tests one that fails.
	writeCgroup func(path, value string) error
}

var _ runtime.Runtime = (*Runtime)(nil)

// cleanupTimeout bounds the removal of a half-made container after a
// failed (or cancelled) start or restore.
const cleanupTimeout = 30 * time.Second

// New checks cfg and makes Root. It starts nothing; see Close.
func New(cfg Config) (*Runtime, error) {
	st, err := os.Stat(cfg.Runsc)
	if err != nil {
		return nil, fmt.Errorf("configuring gvisor runtime: runsc binary: %w", err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return nil, fmt.Errorf("configuring gvisor runtime: runsc binary %s is not an executable file", cfg.Runsc)
	}
	if !filepath.IsAbs(cfg.Root) {
		return nil, fmt.Errorf("configuring gvisor runtime: root %q is not an absolute path", cfg.Root)
	}
	if err := os.MkdirAll(cfg.Root, 0o700); err != nil {
		return nil, fmt.Errorf("configuring gvisor runtime: making root: %w", err)
	}
	if cfg.Platform == "" {
		cfg.Platform = "systrap"
	}
	if cfg.DisableFastPath && cfg.Platform != "systrap" {
		return nil, fmt.Errorf("configuring gvisor runtime: the fast path is systrap's, not %s's", cfg.Platform)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Runtime{
		runsc: cfg.Runsc,
		root:  cfg.Root,
		global: []string{
			"--root=" + cfg.Root,
			"--platform=" + cfg.Platform,
			// gVisor's own network stack on the namespace's veth.
			"--network=sandbox",
			// The rootfs is a writable host directory that package disk
			// snapshots itself; gVisor's overlay would keep writes in
			// memory, where those snapshots cannot see them.
			"--overlay2=none",
			// The settings below are runsc's defaults, the most
			// restrictive each has, written out so that a new runsc with
			// other defaults cannot loosen them unseen (README, "Sandbox
			// settings"): the rootfs is the sandbox's alone; no host Unix
			// sockets, FIFOs, raw sockets or packet writes; no GPU.
			"--file-access=exclusive",
			"--host-uds=none",
			"--host-fifo=none",
			"--net-raw=false",
			"--allow-packet-socket-write=false",
			"--nvproxy=false",
		},
		debug:       cfg.Debug,
		log:         log,
		writeCgroup: writeCgroupFile,
	}
	if cfg.DisableFastPath {
		r.global = append(r.global, "--systrap-disable-fast-path")
	}
	r.holdPaused, r.synced = checkpointFlags(cfg.Runsc)
	return r, nil
}

// Start writes spec's bundle and runs its container detached.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) error {
	if err := r.prepareBundle(spec); err != nil {
		return fmt.Errorf("starting %s: %w", spec.ID, err)
	}
	if err := r.launch(ctx, spec, "run", "-detach", "-bundle", spec.BundleDir, spec.ID); err != nil {
		return fmt.Errorf("starting %s: %w", spec.ID, err)
	}
	return nil
}

// Restore writes spec's bundle and restores its container from the memory
// image in imageDir, detached. The image must have been made from a
// container whose rootfs looked like spec.Rootfs does now. A Restore that
// fails leaves no container; one that it cannot remove is left with its
// limits.
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec, imageDir string) error {
	if st, err := os.Stat(imageDir); err != nil {
		return fmt.Errorf("restoring %s: %w", spec.ID, err)
	} else if !st.IsDir() {
		return fmt.Errorf("restoring %s: image %s is not a directory", spec.ID, imageDir)
	}
	// The sandbox loads its whole memory image before it answers, and that
	// load runs under the container's CPU quota: at 2 GiB a one-CPU quota
	// made a fork take 10 s instead of 5 s. So restore without the quota and
	// set it once the memory is in. A known limitation of a background
	// restore (spec.Background): launch returns, and the quota is set,
	// while the pages are still loading, so the rest of the load runs
	// under the quota.
	limits := spec.Limits()
	spec.CPUs = 0
	if agent := r.imageAgent(imageDir); agent != "" {
		spec.AgentBinary = agent
	}
	if err := r.prepareBundle(spec); err != nil {
		return fmt.Errorf("restoring %s from %s: %w", spec.ID, imageDir, err)
	}
	// -direct reads the pages with O_DIRECT: several times faster than
	// through the page cache, which would also hold a second copy.
	args := []string{"restore", "-detach", "-direct", "-image-path", imageDir, "-bundle", spec.BundleDir}
	if spec.Background || r.background {
		args = append(args, "-background")
	}
	if err := r.launch(ctx, spec, append(args, spec.ID)...); err != nil {
		// launch removes what a failed runsc left, but may fail to: what
		// is left is not to run without its limits.
		if r.exists(spec.ID) {
			if lerr := r.applyLimits(spec.ID, limits); lerr != nil {
				err = errors.Join(err, fmt.Errorf("setting limits of the container left behind: %w", lerr))
			}
		}
		return fmt.Errorf("restoring %s from %s: %w", spec.ID, imageDir, err)
	}
	if err := r.applyLimits(spec.ID, limits); err != nil {
		// It must not run without its quota: remove it, Restore fails
		// whole.
		err = fmt.Errorf("setting limits: %w", err)
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if derr := r.Delete(cctx, spec.ID); derr != nil {
			err = errors.Join(err, fmt.Errorf("removing the restored container: %w", derr))
		}
		return fmt.Errorf("restoring %s from %s: %w", spec.ID, imageDir, err)
	}
	return nil
}

// State reports the container's status, or runtime.ErrNotExist.
func (r *Runtime) State(ctx context.Context, id string) (runtime.Status, error) {
	if err := checkID(id); err != nil {
		return "", fmt.Errorf("getting state of %s: %w", id, err)
	}
	if !r.exists(id) {
		return "", fmt.Errorf("getting state of %s: %w", id, runtime.ErrNotExist)
	}
	out, err := r.run(ctx, id, "state", id)
	if err != nil {
		return "", fmt.Errorf("getting state of %s: %w", id, r.classify(id, err))
	}
	var st specs.State
	if err := json.Unmarshal(out, &st); err != nil {
		return "", fmt.Errorf("getting state of %s: decoding runsc state: %w", id, err)
	}
	switch st.Status {
	case specs.StateRunning:
		return runtime.StatusRunning, nil
	case "paused":
		return runtime.StatusPaused, nil
	case specs.StateCreating, specs.StateCreated, specs.StateStopped:
		return runtime.StatusStopped, nil
	default:
		return "", fmt.Errorf("getting state of %s: unknown runsc status %q", id, st.Status)
	}
}

// SandboxPid is the host pid of container id's sandbox process: the gVisor
// kernel (the "sentry") that runs every process of the container, whose
// end is the container's end. It is read from runsc's state file (the
// daemon asks at every start and restore, and a runsc command would add
// tens of ms to each), or from runsc state when the file says nothing.
func (r *Runtime) SandboxPid(ctx context.Context, id string) (int, error) {
	if err := checkID(id); err != nil {
		return 0, fmt.Errorf("getting sandbox pid of %s: %w", id, err)
	}
	if b, err := os.ReadFile(r.stateFile(id)); err == nil {
		var st struct {
			Sandbox struct {
				Pid int `json:"pid"`
			} `json:"sandbox"`
		}
		if json.Unmarshal(b, &st) == nil && st.Sandbox.Pid > 0 {
			return st.Sandbox.Pid, nil
		}
	}
	if !r.exists(id) {
		return 0, fmt.Errorf("getting sandbox pid of %s: %w", id, runtime.ErrNotExist)
	}
	out, err := r.run(ctx, id, "state", id)
	if err != nil {
		return 0, fmt.Errorf("getting sandbox pid of %s: %w", id, r.classify(id, err))
	}
	var st specs.State
	if err := json.Unmarshal(out, &st); err != nil {
		return 0, fmt.Errorf("getting sandbox pid of %s: decoding runsc state: %w", id, err)
	}
	if st.Pid <= 0 {
		return 0, fmt.Errorf("getting sandbox pid of %s: runsc reports none (status %s)", id, st.Status)
	}
	return st.Pid, nil
}

// Delete kills the container's processes and removes it, with its cgroup.
// A container that does not exist is no error.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return fmt.Errorf("deleting %s: %w", id, err)
	}
	if _, err := r.run(ctx, id, "delete", "-force", id); err != nil {
		if !errors.Is(r.classify(id, err), runtime.ErrNotExist) {
			return fmt.Errorf("deleting %s: %w", id, err)
		}
	}
	removeCgroups(id)
	return nil
}

// Pause freezes every process of the container.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	if err := r.simple(ctx, id, "pause"); err != nil {
		return fmt.Errorf("pausing %s: %w", id, err)
	}
	return nil
}

// Resume thaws a paused container.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	if err := r.simple(ctx, id, "resume"); err != nil {
		return fmt.Errorf("resuming %s: %w", id, err)
	}
	return nil
}

// Checkpoint writes the container's memory image into imageDir, which must
// not exist. The container is paused while the image is written. Without
// opts.LeaveRunning the container stops, but runsc goes on reporting it as
// running for about 2 s (its sandbox process sleeps before it exits), so the
// caller deletes it rather than wait. The image files are not synced: the
// caller makes them durable. On error imageDir is removed; a container left
// without its CPU quota (lifted for the checkpoint) is an error too.
func (r *Runtime) Checkpoint(ctx context.Context, id, imageDir string, opts runtime.CheckpointOptions) (err error) {
	if err := checkID(id); err != nil {
		return fmt.Errorf("checkpointing %s: %w", id, err)
	}
	if _, err := os.Lstat(imageDir); err == nil {
		return fmt.Errorf("checkpointing %s: image directory %s: %w", id, imageDir, fs.ErrExist)
	}
	if !r.exists(id) {
		return fmt.Errorf("checkpointing %s: %w", id, runtime.ErrNotExist)
	}
	// -direct writes the pages with O_DIRECT: 3-5x faster, and the image
	// does not push the sandboxes' memory out of the page cache.
	args := []string{"checkpoint", "-direct", "-image-path", imageDir}
	if opts.LeaveRunning {
		args = append(args, "-leave-running")
	}
	// The sandbox is paused while it writes its image, so the quota only
	// lengthens the pause; lift it for the checkpoint. It is put back on
	// every way out, also when lifting failed half-way, but for a
	// checkpoint that stopped the container: nothing is left to limit.
	if q, qerr := cpuQuota(id); qerr == nil && q > 0 {
		defer func() {
			if err == nil && !opts.LeaveRunning {
				return
			}
			perr := r.setCPUQuota(id, q)
			if perr == nil || (errors.Is(perr, fs.ErrNotExist) && !r.exists(id)) {
				return
			}
			if err == nil {
				_ = os.RemoveAll(imageDir)
			}
			err = errors.Join(err, fmt.Errorf("checkpointing %s: putting back its CPU quota: %w", id, perr))
		}()
		if lerr := r.setCPUQuota(id, 0); lerr != nil {
			r.log.WarnContext(ctx, "lifting the CPU quota for a checkpoint", "container", id, "err", lerr)
		}
	}
	// Read before the checkpoint, which may leave the container stopped.
	agent, aerr := r.agentBinary(id)
	if aerr != nil {
		r.log.WarnContext(ctx, "finding the agent binary of a container", "container", id, "err", aerr)
	}
	var ferr error
	if opts.Flushed != nil && r.synced {
		err, ferr = r.runSynced(ctx, id, append(args, syncedFlag, id), opts.Flushed)
	} else {
		_, err = r.run(ctx, id, append(args, id)...)
		if err == nil && opts.Flushed != nil {
			ferr = opts.Flushed()
		}
	}
	if err != nil {
		// The directory did not exist before: whatever is there is ours
		// and incomplete.
		_ = os.RemoveAll(imageDir)
		return errors.Join(fmt.Errorf("checkpointing %s into %s: %w", id, imageDir, r.classify(id, err)), ferr)
	}
	r.noteAgent(id, imageDir, agent)
	return ferr
}

// simple runs a runsc command that takes only the id.
func (r *Runtime) simple(ctx context.Context, id, command string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if !r.exists(id) {
		return runtime.ErrNotExist
	}
	if _, err := r.run(ctx, id, command, id); err != nil {
		return r.classify(id, err)
	}
	return nil
}

// prepareBundle checks spec and writes its config.json, refusing an id that
// is taken: runsc would fail too, but only after the config is overwritten.
func (r *Runtime) prepareBundle(spec runtime.Spec) error {
	if err := checkSpec(spec); err != nil {
		return err
	}
	if r.exists(spec.ID) {
		return runtime.ErrExist
	}
	return writeBundle(spec)
}

// launch runs a runsc command that starts a container (run or restore).
// runsc hands its own stdio to the container's init, so init's stdin is
// /dev/null and its stdout and stderr go to the bundle's init.log, opened
// for appending: a file outlives the daemon, unlike a pipe (whose reader
// would be gone after a restart), and O_APPEND keeps a restored init, which
// remembers its old file offset, from writing over earlier lines. Errors
// are read back from runsc.log (--log), where the sandbox and the gofer
// write theirs too: runsc's stderr alone only says the sandbox went away.
func (r *Runtime) launch(ctx context.Context, spec runtime.Spec, args ...string) error {
	out, err := os.OpenFile(filepath.Join(spec.BundleDir, initLogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("opening init log: %w", err)
	}
	defer out.Close()
	in, err := os.Open(os.DevNull)
	if err != nil {
		return fmt.Errorf("opening init's stdin: %w", err)
	}
	defer in.Close()
	errLog := filepath.Join(spec.BundleDir, runscLogFile)
	offset := int64(0)
	if st, err := os.Stat(errLog); err == nil {
		offset = st.Size()
	}

	flags := []string{"--log=" + errLog}
	if r.debug {
		flags = append(flags, "--debug", "--debug-log="+filepath.Join(spec.BundleDir, debugDir)+"/")
	}
	cmd := r.command(ctx, flags, args...)
	// *os.File values are passed to runsc as they are: no copying
	// goroutines that the detached sandbox could keep waiting.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = in, out, out
	start := time.Now()
	err = cmd.Run()
	r.log.DebugContext(ctx, "runsc", "args", args, "duration", time.Since(start), "err", err)
	if err == nil {
		return nil
	}
	msg := readErrors(errLog, offset)
	// A failed or cancelled run may leave a created container behind,
	// which would block the next try at this id.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if derr := r.Delete(cctx, spec.ID); derr != nil {
		r.log.WarnContext(ctx, "removing a container that failed to start", "id", spec.ID, "err", derr)
	}
	if msg == "" {
		return fmt.Errorf("runsc %s: %w", args[0], err)
	}
	return fmt.Errorf("runsc %s: %w: %s", args[0], err, msg)
}

// run runs a runsc command that does not start a container and returns its
// stdout; an error carries its stderr.
func (r *Runtime) run(ctx context.Context, id string, args ...string) ([]byte, error) {
	cmd := r.command(ctx, r.debugFlags(id), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r.log.DebugContext(ctx, "runsc", "args", args, "duration", time.Since(start), "err", err)
	if err != nil {
		return nil, &commandError{command: args[0], err: err, stderr: strings.TrimSpace(stderr.String())}
	}
	return stdout.Bytes(), nil
}

// command makes the exec.Cmd of one runsc command with the global flags and
// flags, another few global flags.
func (r *Runtime) command(ctx context.Context, flags []string, args ...string) *exec.Cmd {
	full := slices.Concat(r.global, flags, args)
	cmd := exec.CommandContext(ctx, r.runsc, full...)
	// Its own process group: a Ctrl-C meant for the daemon in a terminal
	// must not kill runsc halfway through a checkpoint or restore.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A stray holder of the output pipes must not hang the daemon.
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// List returns the ids of the containers runsc has state for in Root,
// running or not, sorted: what a teardown of the data dir must delete.
func (r *Runtime) List() ([]string, error) {
	m, err := filepath.Glob(filepath.Join(r.root, "*_sandbox:*.state"))
	if err != nil {
		return nil, fmt.Errorf("listing containers: %w", err)
	}
	var ids []string
	for _, f := range m {
		id, _, _ := strings.Cut(filepath.Base(f), "_sandbox:")
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// exists reports whether runsc has state for exactly this id. runsc itself
// matches ids by prefix; looking for the state file (named
// <container>_sandbox:<sandbox>.state) matches exactly, and costs no
// process.
func (r *Runtime) exists(id string) bool {
	m, _ := filepath.Glob(filepath.Join(r.root, id+"_sandbox:*.state"))
	return len(m) > 0
}

// stateFile is runsc's state file of container id, which is the root
// container of a sandbox of the same id (runsc names it
// CONTAINER_sandbox:SANDBOX.state).
func (r *Runtime) stateFile(id string) string {
	return filepath.Join(r.root, id+"_sandbox:"+id+".state")
}

// classify turns a runsc error about a missing container into
// runtime.ErrNotExist (it may have gone between exists and the command).
func (r *Runtime) classify(id string, err error) error {
	var ce *commandError
	if errors.As(err, &ce) && strings.Contains(ce.stderr, "does not exist") && !r.exists(id) {
		return fmt.Errorf("%w: %w", runtime.ErrNotExist, err)
	}
	// runsc says so only in words: a full host filesystem (the image
	// being written, its state) is ENOSPC to the caller, who can then
	// tell the user the host is out of room rather than that runsc failed.
	if errors.As(err, &ce) && (strings.Contains(ce.stderr, "no space left on device") || strings.Contains(ce.stderr, "disk quota exceeded")) {
		return fmt.Errorf("%w: %w", syscall.ENOSPC, err)
	}
	return err
}

// commandError is a failed runsc command with what it said on stderr.
type commandError struct {
	command string
	err     error
	stderr  string
}

func (e *commandError) Error() string {
	if e.stderr == "" {
		return fmt.Sprintf("runsc %s: %v", e.command, e.err)
	}
	return fmt.Sprintf("runsc %s: %v: %s", e.command, e.err, e.stderr)
}

func (e *commandError) Unwrap() error { return e.err }

// readErrors returns the messages runsc wrote to its --log file at path
// from offset on (JSON objects, one after another), joined, for an error.
func readErrors(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	// A file shorter than offset was trimmed meanwhile (TrimLogs): runsc
	// wrote its messages from the start.
	if st, err := f.Stat(); err == nil && st.Size() < offset {
		offset = 0
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	var msgs []string
	dec := json.NewDecoder(io.LimitReader(f, 1<<20))
	for {
		var e struct{ Msg string }
		if err := dec.Decode(&e); err != nil {
			break
		}
		// runsc's last message repeats what its stderr said; the first
		// ones, from the sandbox or the gofer, say why.
		if e.Msg != "" && !slices.Contains(msgs, e.Msg) {
			msgs = append(msgs, e.Msg)
		}
	}
	return strings.Join(msgs, "; ")
}

// Close unmounts the network namespace runsc pins in Root for its gofers
// (Root/null-netns), so that Root can be removed. Containers that run on
// are not affected: their gofers are in the namespace already, and the
// next start pins a new one.
func (r *Runtime) Close() error {
	path := filepath.Join(r.root, "null-netns")
	// Concurrent starts may have stacked several mounts there.
	for {
		err := unix.Unmount(path, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("closing gvisor runtime: unmounting %s: %w", path, err)
		}
	}
}
