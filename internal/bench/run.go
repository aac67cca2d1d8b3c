package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Ops are the operations a run can do, in the order they run.
var Ops = []string{"create", "create-pool", "exec", "checkpoint", "disk-checkpoint", "restore", "fork", "fork4", "fork16",
	"fork-pool", "fork16-pool", "wake"}

// rowOrder is the order of rows in results: each op, then what it
// measured besides time.
var rowOrder = []string{"create", "create-pool", "exec", "checkpoint", "checkpoint-durable", "checkpoint-pause", "checkpoint-image",
	"disk-checkpoint", "disk-checkpoint-pause", "restore", "fork", "fork-pss", "fork-rss", "fork-disk", "fork4", "fork4-pss",
	"fork16", "fork16-pss", "fork-pool", "fork16-pool", "wake"}

// imageSyncer is a driver whose checkpoints are not durable when made: it
// makes one so (fsyncs its image) and says how long that took.
type imageSyncer interface {
	SyncImage(ctx context.Context, cp string) (time.Duration, error)
}

// Config says what a run measures.
type Config struct {
	// Sizes are the workloads' memory sizes, MiB.
	Sizes []int
	// Reps is how many times each operation runs per size and driver.
	Reps int
	// Ops is a subset of Ops; empty is all.
	Ops []string
	// Templates are timed by "create"; the workloads use the first.
	Templates []string
	// ExecRounds is how many exec round trips "exec" times per rep.
	ExecRounds int
	// MemAvailableMiB is the host memory concurrent forks may take; a
	// concurrent-fork op that would need more is skipped with a note.
	MemAvailableMiB int
	// Progress, if not nil, gets a line per measurement.
	Progress io.Writer
}

// ValidOps checks that every op is one of Ops.
func ValidOps(ops []string) error {
	for _, op := range ops {
		if !slices.Contains(Ops, op) {
			return fmt.Errorf("unknown operation %q (one of %s)", op, strings.Join(Ops, ","))
		}
	}
	return nil
}

// runner is one run: the config, the drivers and what they measured.
type runner struct {
	cfg   Config
	rec   *recorder
	notes []string
}

func (r *runner) want(op string) bool { return len(r.cfg.Ops) == 0 || slices.Contains(r.cfg.Ops, op) }

func (r *runner) note(format string, args ...any) {
	n := fmt.Sprintf(format, args...)
	if !slices.Contains(r.notes, n) {
		r.notes = append(r.notes, n)
	}
}

func (r *runner) record(op string, mib int, d Driver, unit string, v float64) {
	r.rec.add(op, mib, d.Name(), unit, v)
	if r.cfg.Progress != nil {
		size := ""
		if mib > 0 {
			size = fmt.Sprintf(" %d MiB", mib)
		}
		fmt.Fprintf(r.cfg.Progress, "%-5s %s%s: %s %s\n", d.Name(), op, size, formatValue(v), unit)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Run measures every op of cfg with each driver, interleaved: for every
// size and rep each driver does the whole sequence in turn, the order of
// the drivers alternating between reps, so that both see the same state of
// a noisy host. It fails on the first error, a memory check that fails
// included; it leaves no sandbox of its own behind.
func Run(ctx context.Context, cfg Config, drivers []Driver) (*Result, error) {
	if cfg.Reps < 1 {
		cfg.Reps = 1
	}
	if cfg.ExecRounds < 1 {
		cfg.ExecRounds = 10
	}
	if len(cfg.Templates) == 0 {
		return nil, errors.New("running the bench: no template")
	}
	r := &runner{cfg: cfg, rec: newRecorder()}
	res := &Result{Started: time.Now().UTC(), Reps: cfg.Reps}
	for rep := range cfg.Reps {
		order := slices.Clone(drivers)
		if rep%2 == 1 {
			slices.Reverse(order)
		}
		if r.want("create") {
			if rep == 0 {
				if err := r.warm(ctx, order); err != nil {
					return nil, err
				}
			}
			for _, tpl := range cfg.Templates {
				for _, d := range order {
					if err := r.create(ctx, d, tpl, "create"); err != nil {
						return nil, err
					}
				}
			}
		}
		if r.want("create-pool") {
			for _, tpl := range cfg.Templates {
				for _, d := range order {
					if err := r.createPooled(ctx, d, tpl); err != nil {
						return nil, err
					}
				}
			}
		}
		for _, mib := range cfg.Sizes {
			for _, d := range order {
				if err := r.sequence(ctx, d, mib); err != nil {
					return nil, fmt.Errorf("%s, %d MiB, rep %d: %w", d.Name(), mib, rep+1, err)
				}
			}
		}
	}
	res.Rows = r.rec.rows()
	res.Notes = r.notes
	return res, nil
}

// create times a sandbox of tpl from the call until it answers an exec,
// as row op/tpl.
func (r *runner) create(ctx context.Context, d Driver, tpl, op string) error {
	start := time.Now()
	box, err := d.Create(ctx, tpl, -1)
	if err == nil {
		_, err = d.Exec(ctx, box, "true")
	}
	took := time.Since(start)
	if box != "" {
		if derr := d.Delete(ctx, box); derr != nil && err == nil {
			err = derr
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %s %s: %w", d.Name(), op, tpl, err)
	}
	r.record(op+"/"+tpl, 0, d, UnitMS, ms(took))
	return nil
}

// pooler is a driver that keeps warm pools: loam's. Raw runsc has none.
type pooler interface {
	// SetPool keeps size forks of cp of box ready; SetTemplatePool size
	// sandboxes of template. Both return once ready are ready.
	SetPool(ctx context.Context, box, cp string, size, ready int) error
	SetTemplatePool(ctx context.Context, template string, size, ready int) error
}

// createPooled times a create of tpl from a warm pool of one, from the call
// until the sandbox answers an exec; the pool is filled first, untimed.
func (r *runner) createPooled(ctx context.Context, d Driver, tpl string) error {
	p, ok := d.(pooler)
	if !ok {
		r.noteOnce("create-pool: raw runsc has no warm pools")
		return nil
	}
	if err := p.SetTemplatePool(ctx, tpl, 1, 1); err != nil {
		return err
	}
	err := r.create(ctx, d, tpl, "create-pool")
	return errors.Join(err, p.SetTemplatePool(ctx, tpl, 0, 0))
}

// noteOnce notes msg unless it is noted already.
func (r *runner) noteOnce(msg string) {
	if !slices.Contains(r.notes, msg) {
		r.note("%s", msg)
	}
}

// warm creates and deletes a sandbox of every template with every driver,
// untimed: loam's first sandbox of a template imports the template into
// its disk pool, which later creates do not pay.
func (r *runner) warm(ctx context.Context, drivers []Driver) error {
	for _, tpl := range r.cfg.Templates {
		for _, d := range drivers {
			box, err := d.Create(ctx, tpl, -1)
			if box != "" {
				err = errors.Join(err, d.Delete(ctx, box))
			}
			if err != nil {
				return fmt.Errorf("%s: warming up %s: %w", d.Name(), tpl, err)
			}
		}
	}
	return nil
}

// verify checks the workload's memory in box; a mismatch fails the run.
func verify(ctx context.Context, d Driver, box, after string) error {
	if _, err := d.Exec(ctx, box, d.Binary(), "bench", "check", "--dir", WorkloadDir); err != nil {
		return fmt.Errorf("checking memory after %s: %w", after, err)
	}
	return nil
}

// waitReady waits until the workload in box has written its memory.
func waitReady(ctx context.Context, d Driver, box string) error {
	for {
		if _, err := d.Exec(ctx, box, "test", "-e", WorkloadDir+"/"+readyFile); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the workload in %s: %w", box, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// sequence does every wanted op once on a new sandbox holding mib MiB,
// and removes what it made.
func (r *runner) sequence(ctx context.Context, d Driver, mib int) (err error) {
	var made []string
	defer func() {
		// Cleaning up must not depend on a cancelled ctx.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		for _, b := range made {
			if derr := d.Delete(cctx, b); derr != nil {
				err = errors.Join(err, derr)
			}
		}
		if raw, ok := d.(*RawDriver); ok {
			raw.dropAll()
		}
	}()
	box, err := d.Create(ctx, r.cfg.Templates[0], mib)
	if box != "" {
		made = append(made, box)
	}
	if err != nil {
		return err
	}
	if err := waitReady(ctx, d, box); err != nil {
		return err
	}
	if r.want("exec") {
		for range r.cfg.ExecRounds {
			start := time.Now()
			if _, err := d.Exec(ctx, box, "true"); err != nil {
				return err
			}
			r.record("exec", mib, d, UnitMS, ms(time.Since(start)))
		}
	}
	needCP := r.want("checkpoint") || r.want("restore") || r.want("fork") || r.want("fork4") || r.want("fork16") ||
		r.want("fork-pool") || r.want("fork16-pool")
	var cp string
	if needCP {
		since := time.Now()
		var size int64
		cp, size, err = d.Checkpoint(ctx, box, true)
		took := time.Since(since)
		if err != nil {
			return err
		}
		if r.want("checkpoint") {
			r.record("checkpoint", mib, d, UnitMS, ms(took))
			// Durable: until the image would survive a power cut, which
			// loam's answer waits for and raw runsc does not.
			durable := took
			if s, ok := d.(imageSyncer); ok {
				t, err := s.SyncImage(ctx, cp)
				if err != nil {
					return err
				}
				durable += t
			}
			r.record("checkpoint-durable", mib, d, UnitMS, ms(durable))
			if size > 0 {
				r.record("checkpoint-image", mib, d, UnitMiB, float64(size)/(1<<20))
			}
			pause, err := pauseSince(ctx, d, box, since)
			if err != nil {
				return err
			}
			r.record("checkpoint-pause", mib, d, UnitMS, pause)
		}
	}
	if r.want("disk-checkpoint") {
		start := time.Now()
		_, _, err := d.Checkpoint(ctx, box, false)
		switch {
		case errors.Is(err, ErrUnsupported):
			r.note("disk-checkpoint: raw runsc has no disk of its own to snapshot (read-only template root)")
		case err != nil:
			return err
		default:
			r.record("disk-checkpoint", mib, d, UnitMS, ms(time.Since(start)))
			pause, err := pauseSince(ctx, d, box, start)
			if err != nil {
				return err
			}
			r.record("disk-checkpoint-pause", mib, d, UnitMS, pause)
		}
	}
	if r.want("restore") {
		start := time.Now()
		if err := d.Restore(ctx, box, cp); err != nil {
			return err
		}
		if _, err := d.Exec(ctx, box, "true"); err != nil {
			return err
		}
		r.record("restore", mib, d, UnitMS, ms(time.Since(start)))
		if err := verify(ctx, d, box, "restore"); err != nil {
			return err
		}
	}
	if r.want("fork") {
		forks, err := r.forks(ctx, d, box, cp, mib, 1, "fork", &made)
		if err != nil {
			return err
		}
		pss, rss, err := hostMemory(d.HostID(forks[0]))
		if err != nil {
			return err
		}
		r.record("fork-pss", mib, d, UnitMiB, float64(pss)/1024)
		r.record("fork-rss", mib, d, UnitMiB, float64(rss)/1024)
		if dm, ok := d.(diskMeasurer); ok {
			n, err := dm.OwnDisk(ctx, forks[0])
			if err != nil {
				return err
			}
			r.record("fork-disk", mib, d, UnitMiB, float64(n)/(1<<20))
		}
		if err := r.drop(ctx, d, forks, &made); err != nil {
			return err
		}
	}
	for _, n := range []int{4, 16} {
		op := fmt.Sprintf("fork%d", n)
		if !r.want(op) {
			continue
		}
		// Forks share no memory: each holds its own copy.
		if need := n * (mib + 256); r.cfg.MemAvailableMiB > 0 && need > r.cfg.MemAvailableMiB {
			r.note("%s at %d MiB skipped: it needs about %d MiB of host memory, %d available", op, mib, need, r.cfg.MemAvailableMiB)
			continue
		}
		forks, err := r.forks(ctx, d, box, cp, mib, n, op, &made)
		if err != nil {
			return err
		}
		var total int
		for _, f := range forks {
			pss, _, err := hostMemory(d.HostID(f))
			if err != nil {
				return err
			}
			total += pss
		}
		r.record(op+"-pss", mib, d, UnitMiB, float64(total)/1024/float64(n))
		if err := r.drop(ctx, d, forks, &made); err != nil {
			return err
		}
	}
	for _, n := range []int{1, 16} {
		op := "fork-pool"
		if n > 1 {
			op = fmt.Sprintf("fork%d-pool", n)
		}
		if !r.want(op) {
			continue
		}
		p, ok := d.(pooler)
		if !ok {
			r.noteOnce(op + ": raw runsc has no warm pools")
			continue
		}
		// The pool's members, which become the forks, and a couple made
		// again before the pool is drained.
		if need := (n + 2) * (mib + 256); r.cfg.MemAvailableMiB > 0 && need > r.cfg.MemAvailableMiB {
			r.note("%s at %d MiB skipped: it needs about %d MiB of host memory, %d available", op, mib, need, r.cfg.MemAvailableMiB)
			continue
		}
		if err := p.SetPool(ctx, box, cp, n, n); err != nil {
			return err
		}
		forks, err := r.forks(ctx, d, box, cp, mib, n, op, &made)
		if err == nil {
			err = p.SetPool(ctx, box, cp, 0, 0)
		}
		if err != nil {
			return err
		}
		if err := r.drop(ctx, d, forks, &made); err != nil {
			return err
		}
	}
	if r.want("wake") {
		if err := d.Sleep(ctx, box); err != nil {
			return err
		}
		start := time.Now()
		if err := d.Wake(ctx, box); err != nil {
			return err
		}
		if _, err := d.Exec(ctx, box, "true"); err != nil {
			return err
		}
		r.record("wake", mib, d, UnitMS, ms(time.Since(start)))
		if err := verify(ctx, d, box, "wake"); err != nil {
			return err
		}
	}
	return nil
}

// forks starts n forks of cp at once and times them until every one has
// answered an exec; then checks their memory (all of them up to 512 MiB,
// the first above, to keep the run short).
func (r *runner) forks(ctx context.Context, d Driver, box, cp string, mib, n int, op string, made *[]string) ([]string, error) {
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := d.Fork(ctx, box, cp)
			ids[i] = id
			if err == nil {
				_, err = d.Exec(ctx, id, "true")
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	took := time.Since(start)
	for _, id := range ids {
		if id != "" {
			*made = append(*made, id)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	r.record(op, mib, d, UnitMS, ms(took))
	check := ids
	if mib > 512 {
		check = ids[:1]
	}
	for _, id := range check {
		if err := verify(ctx, d, id, op); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// drop deletes forks and forgets them.
func (r *runner) drop(ctx context.Context, d Driver, forks []string, made *[]string) error {
	var errs []error
	for _, f := range forks {
		errs = append(errs, d.Delete(ctx, f))
		*made = slices.DeleteFunc(*made, func(b string) bool { return b == f })
	}
	return errors.Join(errs...)
}

// pauseSince is the longest gap the workload in box saw since since, in
// milliseconds: how long a checkpoint begun then stopped it.
func pauseSince(ctx context.Context, d Driver, box string, since time.Time) (float64, error) {
	out, err := d.Exec(ctx, box, d.Binary(), "bench", "gap", "--dir", WorkloadDir, "--since", strconv.FormatInt(since.UnixNano(), 10))
	if err != nil {
		return 0, fmt.Errorf("reading the pause: %w", err)
	}
	pause, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
	if err != nil {
		return 0, fmt.Errorf("reading the pause: %q: %w", out, err)
	}
	return pause, nil
}
