package disk

import (
	"bufio"
	"context"
	"io"
	"slices"
	"strconv"
	"strings"
)

// A build reports how far it has got through its context (see
// WithProgress), so that Template.Build keeps its signature: a template's
// recipe that has nothing to report reports nothing.

type progressKey struct{}

// WithProgress returns a context under which a template build reports its
// progress to report, as a fraction from 0 to 1 that never goes down.
func WithProgress(ctx context.Context, report func(done float64)) context.Context {
	return context.WithValue(ctx, progressKey{}, report)
}

// ReportProgress reports done (0 to 1) to the context's WithProgress, if
// any. A Template's Build calls it as it goes.
func ReportProgress(ctx context.Context, done float64) {
	if report, ok := ctx.Value(progressKey{}).(func(float64)); ok {
		report(min(max(done, 0), 1))
	}
}

// debootstrapSteps are the steps debootstrap reports progress of, in the
// order it takes them, each with the share of its run that it took in a
// build of the base template (bookworm minbase with python3, procps and
// ca-certificates from deb.debian.org, 74 s on 2 cores). Work it reports
// nothing of (resolving dependencies, 10 s) is counted in the step before.
var debootstrapSteps = []debootstrapStep{
	{"DOWNREL", 0.003},
	{"DOWNRELSIG", 0.003},
	{"DOWNPKGS", 0.151},
	{"DOWNMAINPKGS", 0}, // instead of DOWNPKGS, by some mirrors
	{"SIZEDEBS", 0.011},
	{"DOWNDEBS", 0.156},
	{"EXTRACTPKGS", 0.127},
	{"INSTCORE", 0.026},
	{"UNPACKREQ", 0.178},
	{"CONFREQ", 0.236},
	{"UNPACKBASE", 0.037},
	{"CONFBASE", 0.072},
}

// debootstrapStep is a step of debootstrap's and its share of the run.
type debootstrapStep struct {
	name  string
	share float64
}

// debootstrapProgress reads debootstrap's --debian-installer messages
// (lines "P: NOW END [STEP]" give the progress of a step; other lines are
// ignored) from r until it ends, and reports the build's progress to
// report: the shares of the steps done plus the done part of the current
// one's, never going down.
func debootstrapProgress(r io.Reader, report func(float64)) {
	var (
		before, share float64 // the shares of the steps before the current one, and its own
		current       = -1    // the current step's index
		last          float64 // the last value reported
	)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 || f[0] != "P:" {
			continue
		}
		now, err1 := strconv.ParseFloat(f[1], 64)
		end, err2 := strconv.ParseFloat(f[2], 64)
		if err1 != nil || err2 != nil || end <= 0 {
			continue
		}
		// A line without a step (wget's progress through pkgdetails) is
		// of the current step; steps only go forward.
		if len(f) > 3 {
			i := slices.IndexFunc(debootstrapSteps, func(s debootstrapStep) bool { return s.name == f[3] })
			if i < 0 || i < current {
				continue // a step we do not know, or one gone by
			}
			current, before, share = i, 0, debootstrapSteps[i].share
			for _, s := range debootstrapSteps[:i] {
				before += s.share
			}
		}
		if current < 0 {
			continue
		}
		if done := before + share*min(now/end, 1); done > last {
			last = done
			report(done)
		}
	}
	// Drain what is left, so that debootstrap never blocks on a full pipe.
	_, _ = io.Copy(io.Discard, r)
}
