package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent/proc"
	"loam.dev/loam/internal/atomicfile"
)

// DefaultServicesDir is where the agent keeps service definitions: on the
// sandbox's disk, so that they go with disk snapshots (checkpoints, forks).
const DefaultServicesDir = "/etc/loam/services"

// Supervision of services.
const (
	// serviceMinBackoff is the wait before the first restart; each
	// restart in a row doubles it, up to api.ServiceMaxBackoff.
	serviceMinBackoff = 100 * time.Millisecond
	// serviceStable is how long a service must stay up for its backoff to
	// start again from serviceMinBackoff.
	serviceStable = 10 * time.Second
	// serviceStopGrace is how long a stop waits after SIGTERM to the
	// service's process group before it sends SIGKILL.
	serviceStopGrace = 10 * time.Second
	// serviceIdentityWait bounds how long services wait, on a fresh boot,
	// for the daemon to say which sandbox this is and what its env is
	// (see Identity) before they start without.
	serviceIdentityWait = 10 * time.Second
	// serviceLogBuffer is the size of each of a service's log rings
	// (stdout, stderr); they keep the newest output across restarts.
	serviceLogBuffer = api.DefaultSessionBuffer
)

// serviceFile is a service's definition as kept on disk: the definition and
// whether it should run, which is what a fresh boot acts on.
type serviceFile struct {
	Service api.Service `json:"service"`
	Running bool        `json:"running"`
}

// services is the agent's registry of services. Definitions are kept as
// DIR/NAME.json (dir "" keeps them in memory only, as in tests of other
// parts). load, at the agent's start, is what makes services start on a
// fresh boot; after a memory restore the agent's memory already holds them
// as they were, and nothing loads them again.
type services struct {
	h   *handler
	log *slog.Logger
	dir string
	// stopGrace is serviceStopGrace, identityWait serviceIdentityWait;
	// tests shorten them.
	stopGrace, identityWait time.Duration
	// identifiedCh is closed when the daemon first tells the agent its
	// identity; once closes it.
	identifiedCh chan struct{}
	once         sync.Once

	mu     sync.Mutex
	byName map[string]*service
}

// service is one supervised service. ops serializes what is done to it
// (start, stop, redefine, delete); mu guards its state.
type service struct {
	log  *slog.Logger
	outs []sessionOutput // stdout and stderr rings, kept across runs

	ops sync.Mutex
	// cancel ends the running supervisor, done is closed once it has
	// returned; nil when none runs.
	cancel context.CancelFunc
	done   chan struct{}

	// pending is set for a service loaded to run at boot until it starts
	// or a client acts on it first; removed once it is deleted. Under ops.
	pending, removed bool

	mu       sync.Mutex
	def      api.Service
	state    string
	pid      int
	restarts int
	exitCode *int
	started  *time.Time
	errMsg   string
}

func newServices(h *handler, dir string) *services {
	return &services{
		h: h, log: h.log, dir: dir,
		stopGrace: serviceStopGrace, identityWait: serviceIdentityWait,
		identifiedCh: make(chan struct{}), byName: map[string]*service{},
	}
}

func newService(log *slog.Logger, def api.Service) *service {
	return &service{
		log:   log.With("service", def.Name),
		def:   def,
		state: api.ServiceStopped,
		outs: []sessionOutput{
			{stream: api.StreamStdout, ring: proc.NewRing(serviceLogBuffer)},
			{stream: api.StreamStderr, ring: proc.NewRing(serviceLogBuffer)},
		},
	}
}

// load reads every definition in the services directory and starts the
// services that should run, once the daemon has said which sandbox this is
// (see identified), or after identityWait. A definition it cannot read is
// logged and skipped.
func (r *services) load() {
	if r.dir == "" {
		return
	}
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			r.log.Warn("reading service definitions", "dir", r.dir, "err", err)
		}
		return
	}
	var pending []*service
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !api.ValidServiceName(name) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(r.dir, e.Name()))
		var f serviceFile
		if err == nil {
			err = json.Unmarshal(b, &f)
		}
		if err == nil && f.Service.Name != name {
			err = fmt.Errorf("it defines %q", f.Service.Name)
		}
		if err == nil {
			err = api.CheckService(&f.Service)
		}
		if err != nil {
			r.log.Warn("skipping a service definition", "file", e.Name(), "err", err)
			continue
		}
		s := newService(r.log, f.Service)
		s.pending = f.Running
		r.mu.Lock()
		r.byName[name] = s
		r.mu.Unlock()
		if f.Running {
			pending = append(pending, s)
		}
		r.log.Info("service loaded", "service", name, "running", f.Running)
	}
	if len(pending) == 0 {
		return
	}
	go func() {
		t := time.NewTimer(r.identityWait)
		defer t.Stop()
		select {
		case <-r.identifiedCh:
		case <-t.C:
			r.log.Warn("starting services without the sandbox's identity", "waited", r.identityWait)
		}
		for _, s := range pending {
			s.ops.Lock()
			if s.pending {
				s.pending = false
				s.startLocked(r.h)
			}
			s.ops.Unlock()
		}
	}()
}

// identified is called when the daemon has told the agent its identity.
func (r *services) identified() {
	r.once.Do(func() { close(r.identifiedCh) })
}

// save writes a definition and its desired state, atomically and durably.
func (r *services) save(def api.Service, running bool) error {
	if r.dir == "" {
		return nil
	}
	b, err := json.Marshal(serviceFile{Service: def, Running: running})
	if err != nil {
		return fmt.Errorf("encoding service %s: %w", def.Name, err)
	}
	if err := os.MkdirAll(r.dir, 0o700); err != nil {
		return fmt.Errorf("saving service %s: %w", def.Name, err)
	}
	return atomicfile.WriteFile(filepath.Join(r.dir, def.Name+".json"), b, 0o600)
}

// forgetFile removes a definition from the disk.
func (r *services) forgetFile(name string) error {
	if r.dir == "" {
		return nil
	}
	err := os.Remove(filepath.Join(r.dir, name+".json"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing service %s: %w", name, err)
	}
	return atomicfile.SyncDir(r.dir)
}

// get returns a service, or a not_found error.
func (r *services) get(name string) (*service, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.byName[name]
	if !ok {
		return nil, api.Errorf(api.CodeNotFound, "no service %q", name)
	}
	return s, nil
}

// all returns every service, by name.
func (r *services) all() []api.ServiceStatus {
	r.mu.Lock()
	list := make([]*service, 0, len(r.byName))
	for _, s := range r.byName {
		list = append(list, s)
	}
	r.mu.Unlock()
	out := make([]api.ServiceStatus, 0, len(list))
	for _, s := range list {
		out = append(out, s.view())
	}
	slices.SortFunc(out, func(a, b api.ServiceStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// check resolves a definition against the sandbox (user, directory,
// program) so that a mistake is the client's error now, not a service that
// never starts.
func (r *services) check(def api.Service) error {
	if err := api.CheckService(&def); err != nil {
		return err
	}
	_, err := r.h.prepare(r.h.serviceRequest(def))
	var e *api.Error
	if errors.As(err, &e) && e.Code == api.CodeNotFound {
		// A 404 of the service endpoints means no such service; a
		// program that is not there is a mistake in the definition.
		return api.Errorf(api.CodeInvalid, "cmd: %s", e.Message)
	}
	return err
}

// put defines a service, or redefines one, and starts it: a redefined
// service is stopped first. It reports whether the service is new.
func (r *services) put(def api.Service) (*service, bool, error) {
	if err := r.check(def); err != nil {
		return nil, false, err
	}
	var s *service
	var ok bool
	for {
		r.mu.Lock()
		s, ok = r.byName[def.Name]
		if !ok {
			s = newService(r.log, def)
			r.byName[def.Name] = s
		}
		r.mu.Unlock()
		s.ops.Lock()
		if !s.removed {
			break
		}
		// Deleted meanwhile: define it anew.
		s.ops.Unlock()
	}
	defer s.ops.Unlock()
	s.pending = false
	if ok {
		s.stopLocked(r.h)
	}
	if err := r.save(def, true); err != nil {
		if !ok {
			s.removed = true
			r.mu.Lock()
			delete(r.byName, def.Name)
			r.mu.Unlock()
		}
		return nil, false, err
	}
	s.mu.Lock()
	s.def = def
	s.mu.Unlock()
	s.startLocked(r.h)
	return s, !ok, nil
}

// act starts, stops or restarts a service, and keeps whether it should run.
func (r *services) act(s *service, action string) error {
	s.ops.Lock()
	defer s.ops.Unlock()
	if s.removed {
		return api.Errorf(api.CodeNotFound, "no service %q", s.definition().Name)
	}
	s.pending = false
	def := s.definition()
	switch action {
	case api.ServiceStart:
		if err := r.check(def); err != nil {
			return err
		}
		if err := r.save(def, true); err != nil {
			return err
		}
		if !s.supervised() {
			s.stopLocked(r.h) // collects a supervisor that has returned
			s.startLocked(r.h)
		}
	case api.ServiceStop:
		if err := r.save(def, false); err != nil {
			return err
		}
		s.stopLocked(r.h)
	case api.ServiceRestart:
		if err := r.check(def); err != nil {
			return err
		}
		if err := r.save(def, true); err != nil {
			return err
		}
		s.stopLocked(r.h)
		s.startLocked(r.h)
	default:
		return api.Errorf(api.CodeNotFound, "no service action %q (start, stop, restart)", action)
	}
	return nil
}

// remove stops a service and forgets it, on disk too.
func (r *services) remove(s *service) error {
	s.ops.Lock()
	defer s.ops.Unlock()
	name := s.definition().Name
	if s.removed {
		return api.Errorf(api.CodeNotFound, "no service %q", name)
	}
	s.pending = false
	s.stopLocked(r.h)
	if err := r.forgetFile(name); err != nil {
		return err
	}
	s.removed = true
	r.mu.Lock()
	if r.byName[name] == s {
		delete(r.byName, name)
	}
	r.mu.Unlock()
	for _, o := range s.outs {
		o.ring.Close()
	}
	return nil
}

func (s *service) definition() api.Service {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.def
}

// view is the service as the API shows it.
func (s *service) view() api.ServiceStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := api.ServiceStatus{
		Service: s.def, State: s.state, PID: s.pid, Restarts: s.restarts,
		Error: s.errMsg,
	}
	if s.exitCode != nil {
		c := *s.exitCode
		v.ExitCode = &c
	}
	if s.started != nil {
		t := *s.started
		v.StartedAt = &t
	}
	return v
}

// serviceRequest is the exec request a service's command is resolved from.
// Its environment is as an exec's: the sandbox's env as the daemon last
// told it (see Identity), the service's env over it, and the sandbox's name
// and id, which a memory fork changes.
func (h *handler) serviceRequest(def api.Service) *api.ExecRequest {
	env := map[string]string{}
	id := h.identity.Load()
	if id != nil {
		maps.Copy(env, id.Env)
	}
	maps.Copy(env, def.Env)
	if id != nil {
		// As on exec, these are always the sandbox's.
		env["LOAM_SANDBOX"], env["LOAM_SANDBOX_ID"] = id.SandboxName, id.SandboxID
	}
	return &api.ExecRequest{Cmd: def.Cmd, Env: env, Dir: def.Dir, User: def.User}
}

// startLocked starts a supervisor for s; s.ops is held and none runs.
func (s *service) startLocked(h *handler) {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan struct{})
	s.mu.Lock()
	// Starting from now, not stopped: the supervisor starts the command
	// a moment later, and a caller that looks at once must not read that
	// the service it just started is stopped.
	s.restarts, s.errMsg, s.state, s.pid = 0, "", api.ServiceStarting, 0
	def := s.def
	s.mu.Unlock()
	go func(done chan struct{}) {
		defer close(done)
		s.supervise(ctx, h, def)
	}(s.done)
}

// supervised reports whether a supervisor runs s (it returns once the
// service has exited for good); s.ops is held.
func (s *service) supervised() bool {
	if s.done == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// stopLocked ends s's supervisor, if one runs, and waits until its process
// has exited; s.ops is held.
func (s *service) stopLocked(h *handler) {
	if s.cancel == nil {
		return
	}
	s.cancel()
	<-s.done
	s.cancel, s.done = nil, nil
	s.set(func() { s.state, s.pid = api.ServiceStopped, 0 })
}

func (s *service) set(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
}

// serviceBackoff is how long a service waits before its next start, given
// the wait before its last one (0 for none) and how long it then ran:
// serviceMinBackoff at first and after a run of serviceStable or more, else
// twice the last wait, up to api.ServiceMaxBackoff.
func serviceBackoff(last, ran time.Duration) time.Duration {
	if last == 0 || ran >= serviceStable {
		return serviceMinBackoff
	}
	return min(2*last, api.ServiceMaxBackoff)
}

// supervise runs def until ctx ends, restarting it as its policy says.
func (s *service) supervise(ctx context.Context, h *handler, def api.Service) {
	var backoff time.Duration
	for {
		started := time.Now()
		code, err := s.runOnce(ctx, h, def)
		if ctx.Err() != nil {
			return
		}
		restart := true
		if err != nil {
			s.log.Warn("service failed to start", "err", err)
			msg := "the agent could not start the command"
			var e *api.Error
			if errors.As(err, &e) {
				msg = e.Message
			}
			s.set(func() { s.errMsg = msg })
			restart = def.Restart != api.RestartNever
		} else {
			s.log.Info("service exited", "exit_code", code)
			switch def.Restart {
			case api.RestartNever:
				restart = false
			case api.RestartOnFailure:
				restart = code != 0
			}
		}
		if !restart {
			s.set(func() { s.state, s.pid = api.ServiceExited, 0 })
			return
		}
		backoff = serviceBackoff(backoff, time.Since(started))
		s.set(func() { s.state, s.pid = api.ServiceBackoff, 0 })
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		s.set(func() { s.restarts++; s.state = api.ServiceStarting })
	}
}

// runOnce starts def's command and waits until it has exited, and its
// output is in the rings; when ctx ends first it stops the command: TERM
// to its process group, KILL after serviceStopGrace.
func (s *service) runOnce(ctx context.Context, h *handler, def api.Service) (int, error) {
	c, err := h.prepare(h.serviceRequest(def))
	if err != nil {
		return 0, err
	}
	p, sio, err := h.spawn(c)
	if err != nil {
		return 0, err
	}
	now := time.Now().UTC()
	s.set(func() { s.state, s.pid, s.started, s.errMsg = api.ServiceRunning, p.PID(), &now, "" })
	s.log.Info("service started", "pid", p.PID())
	outs := make([]sessionOutput, 0, len(sio.outs))
	for _, o := range sio.outs {
		for _, so := range s.outs {
			if so.stream == o.stream {
				outs = append(outs, sessionOutput{stream: o.stream, f: o.f, ring: so.ring})
			}
		}
	}
	pumped := make(chan struct{})
	go func() {
		pumpOutputs(outs, p.Done())
		sio.close()
		close(pumped)
	}()
	select {
	case <-p.Done():
	case <-ctx.Done():
		s.terminate(h, p)
	}
	<-pumped
	code := proc.ExitCode(p.Status())
	s.set(func() { s.exitCode = &code })
	return code, nil
}

// terminate sends SIGTERM to p's process group, and SIGKILL to the group if
// p has not exited after the stop grace; it returns once p is reaped.
func (s *service) terminate(h *handler, p *proc.Process) {
	if err := h.reaper.Signal(p, syscall.SIGTERM); err != nil && !errors.Is(err, proc.ErrExited) {
		s.log.Warn("stopping service", "err", err)
	}
	grace := h.services.stopGrace
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.Done():
		return
	case <-t.C:
	}
	s.log.Warn("service did not stop on SIGTERM; killing it", "grace", grace)
	_ = h.reaper.Signal(p, syscall.SIGKILL)
	<-p.Done()
}
