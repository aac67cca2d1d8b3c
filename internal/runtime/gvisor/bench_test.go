package gvisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"loam.dev/loam/internal/runtime"
)

// The benchmarks time what a user waits for: from the call until the
// counter in the sandbox answers over the network. Run them with, e.g.,
//
//	go test -run '^$' -bench . -benchtime 5x ./internal/runtime/gvisor/
//
// Sizes are MiB of random (incompressible) memory the counter fills first.
var benchSizes = []int{64, 512}

func BenchmarkStart(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	sb := e.newSandbox(b, "sb-gvbenchstart", 20)
	for b.Loop() {
		b.StopTimer()
		sb.prepare(b)
		b.StartTimer()
		if err := e.rt.Start(ctx, sb.spec); err != nil {
			b.Fatal(err)
		}
		sb.ask(b)
		b.StopTimer()
		if err := e.rt.Delete(ctx, sb.spec.ID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkCheckpoint times checkpoints with -leave-running: the first of a
// fresh sandbox, and later ones.
func BenchmarkCheckpoint(b *testing.B) {
	for _, mib := range benchSizes {
		b.Run(fmt.Sprintf("first/mib=%d", mib), func(b *testing.B) {
			e := newEnv(b)
			ctx := context.Background()
			sb := e.newSandbox(b, "sb-gvbenchckpt1", 21)
			sb.spec.Env = append(sb.spec.Env, "COUNTER_ALLOC_MIB="+strconv.Itoa(mib))
			dir := b.TempDir()
			i := 0
			for b.Loop() {
				b.StopTimer()
				sb.prepare(b)
				if err := e.rt.Start(ctx, sb.spec); err != nil {
					b.Fatal(err)
				}
				sb.ask(b)
				img := filepath.Join(dir, strconv.Itoa(i))
				i++
				b.StartTimer()
				if err := e.rt.Checkpoint(ctx, sb.spec.ID, img, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := e.rt.Delete(ctx, sb.spec.ID); err != nil {
					b.Fatal(err)
				}
				os.RemoveAll(img)
				b.StartTimer()
			}
		})
		b.Run(fmt.Sprintf("again/mib=%d", mib), func(b *testing.B) {
			e := newEnv(b)
			ctx := context.Background()
			sb := e.newSandbox(b, "sb-gvbenchckpt2", 22)
			sb.spec.Env = append(sb.spec.Env, "COUNTER_ALLOC_MIB="+strconv.Itoa(mib))
			if err := e.rt.Start(ctx, sb.spec); err != nil {
				b.Fatal(err)
			}
			sb.ask(b)
			dir := b.TempDir()
			if err := e.rt.Checkpoint(ctx, sb.spec.ID, filepath.Join(dir, "first"), runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
				b.Fatal(err)
			}
			i := 0
			for b.Loop() {
				img := filepath.Join(dir, strconv.Itoa(i))
				i++
				if err := e.rt.Checkpoint(ctx, sb.spec.ID, img, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				os.RemoveAll(img)
				b.StartTimer()
			}
		})
	}
}

// BenchmarkRestore times a restore in place (a wake): the container was
// checkpointed and deleted; restore it into the same id.
func BenchmarkRestore(b *testing.B) {
	for _, mode := range []string{"eager", "background"} {
		for _, mib := range benchSizes {
			b.Run(fmt.Sprintf("%s/mib=%d", mode, mib), func(b *testing.B) {
				e := newEnv(b)
				e.rt.background = mode == "background"
				ctx := context.Background()
				sb := e.newSandbox(b, "sb-gvbenchrest0", 23)
				sb.spec.Env = append(sb.spec.Env, "COUNTER_ALLOC_MIB="+strconv.Itoa(mib))
				if err := e.rt.Start(ctx, sb.spec); err != nil {
					b.Fatal(err)
				}
				sb.ask(b)
				img := filepath.Join(b.TempDir(), "img")
				if err := e.rt.Checkpoint(ctx, sb.spec.ID, img, runtime.CheckpointOptions{}); err != nil {
					b.Fatal(err)
				}
				if err := e.rt.Delete(ctx, sb.spec.ID); err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					b.StopTimer()
					sb.prepare(b)
					b.StartTimer()
					if err := e.rt.Restore(ctx, sb.spec, img); err != nil {
						b.Fatal(err)
					}
					sb.ask(b)
					b.StopTimer()
					if err := e.rt.Delete(ctx, sb.spec.ID); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			})
		}
	}
}

// BenchmarkFork times a fork: a checkpoint of a running sandbox restored
// into a new id in another namespace, while the original runs on.
func BenchmarkFork(b *testing.B) {
	for _, mode := range []string{"eager", "background"} {
		for _, mib := range benchSizes {
			b.Run(fmt.Sprintf("%s/mib=%d", mode, mib), func(b *testing.B) {
				e := newEnv(b)
				e.rt.background = mode == "background"
				ctx := context.Background()
				a := e.newSandbox(b, "sb-gvbenchforka", 24)
				a.spec.Env = append(a.spec.Env, "COUNTER_ALLOC_MIB="+strconv.Itoa(mib))
				if err := e.rt.Start(ctx, a.spec); err != nil {
					b.Fatal(err)
				}
				a.ask(b)
				img := filepath.Join(b.TempDir(), "img")
				if err := e.rt.Checkpoint(ctx, a.spec.ID, img, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
					b.Fatal(err)
				}
				f := e.newSandbox(b, "sb-gvbenchforkb", 25)
				for b.Loop() {
					b.StopTimer()
					f.prepare(b)
					b.StartTimer()
					if err := e.rt.Restore(ctx, f.spec, img); err != nil {
						b.Fatal(err)
					}
					f.ask(b)
					b.StopTimer()
					if err := e.rt.Delete(ctx, f.spec.ID); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			})
		}
	}
}
