package gvisor

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"loam.dev/loam/internal/runtime"
)

var _ runtime.HeldCheckpointer = (*Runtime)(nil)

// holdPausedFlag is the flag of runsc checkpoint that loam's runsc patch
// 0002 adds (tools/runsc/patches): pause, save, say "saved" on stdout, and
// resume once stdin gives a byte or EOF.
const holdPausedFlag = "-hold-paused"

// savedLine is what runsc checkpoint -hold-paused writes once the image is
// saved and the container is still paused.
const savedLine = "saved"

// syncedLine is what runsc checkpoint -hold-paused (of loam's patch 0002
// since it learned to) writes before "saved", once the sandbox's
// filesystems are flushed: from then on its disk matches the image being
// written, and may be snapshotted while the memory is.
const syncedLine = "synced"

// syncedFlag is the flag of runsc checkpoint (loam's patch 0002, since it
// learned to) that writes "synced" on stdout, without -hold-paused too.
const syncedFlag = "-synced"

// checkpointFlags asks runsc, once, in New, whether its checkpoint command
// has -hold-paused and -synced: a runsc given by the user may be an
// unpatched one, or one patched before -synced, whose checkpoint would
// fail on the flag.
func checkpointFlags(runsc string) (holdPaused, synced bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, runsc, "help", "checkpoint").CombinedOutput()
	return bytes.Contains(out, []byte(holdPausedFlag)), bytes.Contains(out, []byte(syncedFlag+"\n"))
}

// runSynced runs runsc checkpoint with -synced and calls flushed from its
// "synced" line, while it writes the memory, or once it has written it
// when it says no such line. It returns runsc's error and flushed's, once
// both are done; flushed is not called when runsc fails first.
func (r *Runtime) runSynced(ctx context.Context, id string, args []string, flushed func() error) (err, ferr error) {
	cmd := r.command(ctx, r.debugFlags(id), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err, nil
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return err, nil
	}
	f := &fromSynced{r: r, fn: flushed}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		f.line(strings.TrimSpace(sc.Text()))
	}
	err = cmd.Wait()
	r.log.DebugContext(ctx, "runsc", "args", args, "duration", time.Since(start), "overlapped", f.started(), "err", err)
	if err != nil {
		err = &commandError{command: args[0], err: err, stderr: strings.TrimSpace(stderr.String())}
	}
	return err, f.wait(err == nil)
}

// fromSynced runs fn, the caller's work on a checkpointed container's
// disk, once: from runsc's "synced" line, while runsc goes on writing the
// memory, or else once the image is written.
type fromSynced struct {
	r       *Runtime
	fn      func() error
	running chan error // fn's result, once started from "synced"
}

// line takes a line of runsc's stdout: the first "synced" starts fn.
func (f *fromSynced) line(l string) {
	if l != syncedLine || f.running != nil {
		return
	}
	f.r.overlapped.Add(1)
	f.running = make(chan error, 1)
	go func() { f.running <- f.fn() }()
}

// started says whether fn ran from "synced".
func (f *fromSynced) started() bool { return f.running != nil }

// wait returns fn's error: once the run started from "synced" ends, or
// from a run now when written says the image is written; nil, fn not
// run, when neither.
func (f *fromSynced) wait(written bool) error {
	switch {
	case f.running != nil:
		return <-f.running
	case written:
		return f.fn()
	}
	return nil
}

// debugFlags are runsc's global flags that write container id's debug
// log, when r.debug.
func (r *Runtime) debugFlags(id string) []string {
	if !r.debug {
		return nil
	}
	return []string{"--debug", "--debug-log=" + filepath.Join(r.root, debugDir, id) + "/"}
}

// CheckpointHeld implements runtime.HeldCheckpointer. With a runsc that has
// checkpoint -hold-paused it is one runsc process, started before the
// pause, which pauses, saves, waits while whilePaused runs, and resumes:
// the pause holds no runsc start-up. A daemon that dies meanwhile closes
// that process's stdin, and it resumes the container; if it dies too, runsc
// says the container is paused, and recovery resumes it. With another
// runsc it is runsc pause, checkpoint and resume. The CPU quota is lifted
// while the image is written, as in Checkpoint.
func (r *Runtime) CheckpointHeld(ctx context.Context, id, imageDir string, whilePaused func() error) (err error) {
	if err := checkID(id); err != nil {
		return fmt.Errorf("checkpointing %s: %w", id, err)
	}
	if _, err := os.Lstat(imageDir); err == nil {
		return fmt.Errorf("checkpointing %s: image directory %s: %w", id, imageDir, fs.ErrExist)
	}
	if !r.exists(id) {
		return fmt.Errorf("checkpointing %s: %w", id, runtime.ErrNotExist)
	}
	if !r.holdPaused {
		return r.checkpointPaused(ctx, id, imageDir, whilePaused)
	}
	agent, aerr := r.agentBinary(id)
	if aerr != nil {
		r.log.WarnContext(ctx, "finding the agent binary of a container", "container", id, "err", aerr)
	}
	defer func() {
		if err == nil {
			r.noteAgent(id, imageDir, agent)
		}
	}()
	defer r.liftCPUQuota(ctx, id, imageDir, &err)()
	defer func() {
		if err != nil {
			_ = os.RemoveAll(imageDir)
			err = errors.Join(err, r.unpause(ctx, id))
		}
	}()

	args := []string{"checkpoint", "-direct", "-leave-running", holdPausedFlag, "-image-path", imageDir, id}
	cmd := r.command(ctx, r.debugFlags(id), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fmt.Errorf("checkpointing %s: %w", id, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("checkpointing %s: %w", id, err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("checkpointing %s: starting runsc: %w", id, err)
	}
	// whilePaused runs from "synced" when runsc says it (the memory is
	// still being written then, the disk no longer changes), or else from
	// "saved"; either way the container stays paused until it returns.
	saved := false
	f := &fromSynced{r: r, fn: whilePaused}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		f.line(l)
		if l == savedLine {
			saved = true
			break
		}
	}
	werr := f.wait(saved)
	// One byte, then EOF: runsc resumes the container and exits. Without
	// "saved" it fails on its own, and EOF only ends its wait sooner.
	_, _ = stdin.Write([]byte{'\n'})
	_ = stdin.Close()
	_, _ = io.Copy(io.Discard, stdout)
	cerr := cmd.Wait()
	r.log.DebugContext(ctx, "runsc", "args", args, "duration", time.Since(start), "overlapped", f.started(), "err", cerr)
	if cerr != nil {
		cerr = r.classify(id, &commandError{command: args[0], err: cerr, stderr: strings.TrimSpace(stderr.String())})
		cerr = fmt.Errorf("checkpointing %s into %s: %w", id, imageDir, cerr)
	} else if !saved {
		cerr = fmt.Errorf("checkpointing %s into %s: runsc exited without saying the image is saved", id, imageDir)
	}
	return errors.Join(werr, cerr)
}

// checkpointPaused is CheckpointHeld with three runsc commands, for a runsc
// without -hold-paused.
func (r *Runtime) checkpointPaused(ctx context.Context, id, imageDir string, whilePaused func() error) (err error) {
	if err := r.Pause(ctx, id); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(imageDir)
		}
	}()
	err = r.Checkpoint(ctx, id, imageDir, runtime.CheckpointOptions{LeaveRunning: true})
	if err == nil {
		err = whilePaused()
	}
	if rerr := r.Resume(ctx, id); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return err
}

// unpause resumes container id if it is paused: the way out of a held
// checkpoint that failed. It fails when the container is left paused.
func (r *Runtime) unpause(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	st, err := r.State(ctx, id)
	if errors.Is(err, runtime.ErrNotExist) || (err == nil && st != runtime.StatusPaused) {
		return nil
	}
	if err == nil {
		err = r.Resume(ctx, id)
	}
	if err != nil {
		return fmt.Errorf("leaving %s paused after a failed checkpoint: %w", id, err)
	}
	return nil
}

// liftCPUQuota lifts container id's CPU quota, if it has one, for a
// checkpoint that leaves it running (it is paused while it writes its image,
// so the quota only lengthens the pause), and returns the function that
// puts it back, to defer: one that fails to makes *err an error (and
// removes imageDir).
func (r *Runtime) liftCPUQuota(ctx context.Context, id, imageDir string, err *error) func() {
	q, qerr := cpuQuota(id)
	if qerr != nil || q <= 0 {
		return func() {}
	}
	if lerr := r.setCPUQuota(id, 0); lerr != nil {
		r.log.WarnContext(ctx, "lifting the CPU quota for a checkpoint", "container", id, "err", lerr)
	}
	return func() {
		perr := r.setCPUQuota(id, q)
		if perr == nil || (errors.Is(perr, fs.ErrNotExist) && !r.exists(id)) {
			return
		}
		if *err == nil {
			_ = os.RemoveAll(imageDir)
		}
		*err = errors.Join(*err, fmt.Errorf("checkpointing %s: putting back its CPU quota: %w", id, perr))
	}
}
