package cli

import (
	"context"
	"io"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// progressDelay is how long work goes before it shows progress: shorter
// work is over before a bar would tell anything.
const progressDelay = time.Second

// progressOut is where progress is drawn: stderr, when stdout and stderr
// are both terminals; nil otherwise, so that output piped, captured or
// read by a script stays exactly what it was.
func (a *app) progressOut() io.Writer {
	out, ok1 := a.stdout.(*os.File)
	errOut, ok2 := a.stderr.(*os.File)
	if ok1 && ok2 && term.IsTerminal(int(out.Fd())) && term.IsTerminal(int(errOut.Fd())) {
		return errOut
	}
	return nil
}

// progress is a bar on the terminal for one piece of work, drawn once the
// work has gone on for progressDelay and cleared when it ends. Without a
// terminal it draws nothing. It is safe for concurrent use; as an
// io.Writer it counts the bytes written to it (for io.TeeReader).
type progress struct {
	mu    sync.Mutex
	out   io.Writer
	desc  string
	max   int64 // -1: not known; a spinner and a count
	bytes bool
	cur   int64
	bar   *progressbar.ProgressBar
	timer *time.Timer
	spin  chan struct{} // closed to stop turn
	ended bool
}

// startProgress starts a progress of work measured in bytes (bytes true) or
// in units of max (a percentage: max 100).
func (a *app) startProgress(desc string, max int64, bytes bool) *progress {
	p := &progress{out: a.progressOut(), desc: desc, max: max, bytes: bytes}
	if p.out != nil {
		p.timer = time.AfterFunc(progressDelay, p.show)
	}
	return p
}

// show draws the bar, as far as the work has got.
func (p *progress) show() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended || p.bar != nil {
		return
	}
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(p.out),
		progressbar.OptionSetDescription(p.desc),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100 * time.Millisecond),
		progressbar.OptionSpinnerType(14),
		// No spinner goroutine of progressbar's: it reads the bar without
		// the bar's lock (a data race); turn draws the spinner instead,
		// and it turns once a draw.
		progressbar.OptionSetSpinnerChangeInterval(0),
		progressbar.OptionClearOnFinish(),
	}
	if p.bytes {
		opts = append(opts, progressbar.OptionShowBytes(true), progressbar.OptionShowTotalBytes(true),
			progressbar.OptionShowCount(), progressbar.OptionUseIECUnits(true))
	}
	p.bar = progressbar.NewOptions64(p.max, opts...)
	_ = p.bar.Set64(p.shown())
	p.spin = make(chan struct{})
	go p.turn(p.spin)
}

// spinEvery is how often turn redraws the bar, which turns its spinner.
const spinEvery = 100 * time.Millisecond

// turn redraws the bar every spinEvery until stop is closed, so that its
// spinner and elapsed time move while the work reports nothing.
func (p *progress) turn(stop <-chan struct{}) {
	t := time.NewTicker(spinEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			p.mu.Lock()
			if !p.ended {
				p.bar.Describe(p.desc)
			}
			p.mu.Unlock()
		}
	}
}

// shown is the figure the bar shows: short of the end until the work ends,
// because a bar at its end is finished and cleared, while the work may
// still be waiting (bytes all sent, the daemon not yet done with them).
func (p *progress) shown() int64 {
	if p.max > 0 && p.cur >= p.max {
		return p.max - 1
	}
	return p.cur
}

// set records how far the work has got.
func (p *progress) set(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cur = n
	if p.bar != nil && !p.ended {
		_ = p.bar.Set64(p.shown())
	}
}

// setMax changes the work's size (-1: not known).
func (p *progress) setMax(max int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.max = max
	if p.bar != nil && !p.ended {
		p.bar.ChangeMax64(max)
		_ = p.bar.Set64(p.shown())
	}
}

// describe changes what the bar says the work is.
func (p *progress) describe(desc string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.desc = desc
	if p.bar != nil && !p.ended {
		p.bar.Describe(desc)
	}
}

// Write counts len(b) bytes done.
func (p *progress) Write(b []byte) (int, error) {
	p.mu.Lock()
	n := p.cur + int64(len(b))
	p.mu.Unlock()
	p.set(n)
	return len(b), nil
}

// end stops the progress and clears its bar, leaving the terminal as it
// was for what the command prints next.
func (p *progress) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return
	}
	p.ended = true
	if p.timer != nil {
		p.timer.Stop()
	}
	if p.spin != nil {
		close(p.spin)
	}
	if p.bar != nil {
		// Finish, not Clear: Clear reads the bar without the bar's
		// lock, which Finish takes; with OptionClearOnFinish the
		// bar's last draw clears it.
		_ = p.bar.Finish()
	}
}

// templatePoll is how often a create that waits asks how the template's
// build is getting on.
const templatePoll = 500 * time.Millisecond

// watchCreate shows the progress of a create of a sandbox from template
// (the daemon's default when "", or an image's ref): "creating NAME" while
// it takes long, and the template's build or the image's pull while the
// create waits for one (GET /v1/templates, api.Template.Progress). It
// returns the function that ends it.
func (a *app) watchCreate(ctx context.Context, c *client.Client, name, template string) (end func()) {
	desc := "creating " + name
	if name == "" {
		desc = "creating the sandbox"
	}
	p := a.startProgress(desc, -1, false)
	if p.out == nil {
		return p.end
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
			return
		case <-time.After(progressDelay):
		}
		for {
			if tpl, ok := findTemplate(ctx, c, template); ok && !tpl.Ready {
				if tpl.Kind == api.TemplateImage {
					p.describe("pulling " + tpl.Name)
				} else {
					p.describe("building template " + tpl.Name)
				}
				p.setMax(100)
				p.set(int64(tpl.Progress))
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(templatePoll):
			}
		}
	}()
	return func() {
		cancel()
		<-done
		p.end()
	}
}

// findTemplate finds the template a create uses: the one named, or the
// default when name is "".
func findTemplate(ctx context.Context, c *client.Client, name string) (api.Template, bool) {
	tpls, err := c.Templates(ctx)
	if err != nil {
		return api.Template{}, false
	}
	for _, t := range tpls {
		if t.Name == name || (name == "" && t.Default) {
			return t, true
		}
	}
	return api.Template{}, false
}
