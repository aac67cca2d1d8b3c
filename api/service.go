package api

import (
	"regexp"
	"strings"
	"time"
)

// A service is a named, supervised command of a sandbox. The sandbox's agent
// starts it, restarts it as its restart policy says (with a backoff that
// grows up to ServiceMaxBackoff), keeps its output (stdout and stderr) in
// ring buffers addressed by byte offsets as a detachable session's, and
// keeps its definition, with whether it should run, on the sandbox's disk:
// definitions go with checkpoints and forks, and a sandbox that boots fresh
// (a disk-only restore or fork, a cold start) starts every service that
// was running. Through a memory checkpoint, restore or fork, services carry
// on as the checkpoint had them.
type Service struct {
	// Name is 1–63 of a-z, 0-9 and '-', starting with a letter.
	Name string   `json:"name"`
	Cmd  []string `json:"cmd"`
	// Env, Dir and User are as for exec: variables over the sandbox's
	// environment, the directory (relative to the user's home), the user
	// (the sandbox's user when empty).
	Env  map[string]string `json:"env,omitempty"`
	Dir  string            `json:"dir,omitempty"`
	User string            `json:"user,omitempty"`
	// Restart is RestartAlways (when empty), RestartOnFailure or
	// RestartNever.
	Restart string `json:"restart,omitempty"`
}

// Restart policies of a service.
const (
	// RestartAlways restarts the service whenever it exits.
	RestartAlways = "always"
	// RestartOnFailure restarts it when it exits with a code other than 0.
	RestartOnFailure = "on-failure"
	// RestartNever leaves it exited.
	RestartNever = "never"
)

// ServiceMaxBackoff is the longest a service waits between two starts.
const ServiceMaxBackoff = 30 * time.Second

// Service states.
const (
	// ServiceStarting: its command is being started (for the first time
	// since it was started, or again after a backoff).
	ServiceStarting = "starting"
	// ServiceRunning: its command runs.
	ServiceRunning = "running"
	// ServiceBackoff: it exited or failed to start, and waits to start again.
	ServiceBackoff = "backoff"
	// ServiceExited: it exited and its policy does not restart it.
	ServiceExited = "exited"
	// ServiceStopped: it was stopped (or never started) and stays so until
	// started.
	ServiceStopped = "stopped"
)

// ServiceStatus is a service as the API shows it: its definition and how it
// is doing.
type ServiceStatus struct {
	Service
	// State is one of ServiceStarting, ServiceRunning, ServiceBackoff,
	// ServiceExited and ServiceStopped.
	State string `json:"state"`
	// PID is the command's pid while it runs, else 0.
	PID int `json:"pid,omitempty"`
	// Restarts counts the starts after the first one since the service
	// was last started by hand (or by the sandbox's boot).
	Restarts int `json:"restarts"`
	// ExitCode is the code of the last exit (128+N for signal N), null
	// before any.
	ExitCode *int `json:"exit_code"`
	// StartedAt is when the command last started, null before any.
	StartedAt *time.Time `json:"started_at"`
	// Error says why the command last failed to start, if it did.
	Error string `json:"error,omitempty"`
}

// ServiceList is the body of GET /v1/sandboxes/{sandbox}/services, by name.
type ServiceList struct {
	Services []ServiceStatus `json:"services"`
}

// Service actions, as in POST …/services/{name}/{action}.
const (
	ServiceStart   = "start"
	ServiceStop    = "stop"
	ServiceRestart = "restart"
)

var serviceNameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)

// ValidServiceName reports whether name is a service name, so that nothing
// else is ever put into a path to an agent or a file name.
func ValidServiceName(name string) bool { return serviceNameRE.MatchString(name) }

// CheckService checks what a service definition holds, before anything is
// resolved against a sandbox, with an invalid error that names the field.
func CheckService(s *Service) error {
	if !ValidServiceName(s.Name) {
		return Errorf(CodeInvalid, "name: %q is not a service name (1–63 of a-z, 0-9 and '-', starting with a letter)", s.Name)
	}
	if len(s.Cmd) == 0 || s.Cmd[0] == "" {
		return Errorf(CodeInvalid, "cmd: give the command to run")
	}
	for _, a := range s.Cmd {
		if strings.ContainsRune(a, 0) {
			return Errorf(CodeInvalid, "cmd: holds a NUL byte")
		}
	}
	for k, v := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return Errorf(CodeInvalid, "env: %q is not a valid variable", k)
		}
	}
	if strings.ContainsRune(s.Dir, 0) || strings.ContainsRune(s.User, 0) {
		return Errorf(CodeInvalid, "dir or user: holds a NUL byte")
	}
	switch s.Restart {
	case "", RestartAlways, RestartOnFailure, RestartNever:
	default:
		return Errorf(CodeInvalid, "restart: %q is none of always, on-failure and never", s.Restart)
	}
	return nil
}
