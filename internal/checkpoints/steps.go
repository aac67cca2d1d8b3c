package checkpoints

import (
	"context"
	"log/slog"
	"time"
)

// steps times the steps of one operation (a checkpoint, a restore) for a
// debug log line that says where its time went: each step's milliseconds
// since the one before, in order. It costs a time.Now per step, so it is
// always on; the line is written only when the log takes debug records.
// The zero value is not ready: use newSteps.
type steps struct {
	start, last time.Time
	attrs       []any
}

func newSteps() *steps {
	now := time.Now()
	return &steps{start: now, last: now}
}

// done records that step name ended now.
func (s *steps) done(name string) {
	if s == nil {
		return
	}
	now := time.Now()
	s.attrs = append(s.attrs, name+"_ms", ms(now.Sub(s.last)))
	s.last = now
}

// took records that step name, run beside the others, took d.
func (s *steps) took(name string, d time.Duration) {
	if s == nil {
		return
	}
	s.attrs = append(s.attrs, name+"_ms", ms(d))
}

// log writes the steps as one debug record, with attrs first and the
// total last.
func (s *steps) log(ctx context.Context, log *slog.Logger, msg string, attrs ...any) {
	if s == nil || !log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	all := append(attrs, s.attrs...)
	log.DebugContext(ctx, msg, append(all, "total_ms", ms(time.Since(s.start)))...)
}

// ms is d in milliseconds, to a tenth.
func ms(d time.Duration) float64 {
	return float64(d.Round(100*time.Microsecond)) / float64(time.Millisecond)
}
