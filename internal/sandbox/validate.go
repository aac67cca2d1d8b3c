package sandbox

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/randid"
)

var (
	nameRE   = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)
	envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	idRE     = regexp.MustCompile(`^sb-[a-z0-9]{12}$`)
)

// ValidName reports whether s is a valid sandbox name: 1–63 of a-z, 0-9 and
// '-', starting with a letter.
func ValidName(s string) bool { return nameRE.MatchString(s) }

// maxLabel is the longest label of a DNS name. A sandbox's URL starts with
// the label NAME--ORG, which must fit.
const maxLabel = 63

// MaxNameLen is the longest sandbox name whose URL label, NAME--ORG, is a
// valid DNS label under org.
func MaxNameLen(org string) int { return maxLabel - len("--") - len(org) }

// CheckOrg refuses an org that cannot make URLs: it must be a name as
// sandbox names are, and leave room for a sandbox's id in the URL label.
func CheckOrg(org string) error {
	if !ValidName(org) || strings.HasSuffix(org, "-") || strings.Contains(org, "--") {
		return fmt.Errorf("org %q: an org is a-z, 0-9 and '-', starting with a letter, not ending with '-' nor containing '--'", org)
	}
	if MaxNameLen(org) < len(newID()) {
		return fmt.Errorf("org %q: at most %d characters, so that NAME--ORG is a DNS label for every sandbox", org, maxLabel-len("--")-len(newID()))
	}
	return nil
}

// CheckName refuses a name that a sandbox of org may not have, saying why:
// one that is not valid (ValidName and the rules of ids and URLs), or too
// long for the sandbox's URL label, NAME--ORG. Create checks every name
// with it; a caller that names sandboxes itself (a count of forks, NAME-1
// … NAME-N) checks its names before it makes any.
func CheckName(name, org string) error { return checkName(name, MaxNameLen(org)) }

// checkName refuses a sandbox name that is not valid, or longer than max.
func checkName(s string, max int) error {
	if !ValidName(s) {
		return api.Errorf(api.CodeInvalid, "name %q: a name is 1-63 characters of a-z, 0-9 and '-', starting with a letter", s)
	}
	if len(s) > max {
		return api.Errorf(api.CodeInvalid, "name %q: at most %d characters here (the sandbox's URL starts with NAME--ORG, which DNS allows 63 characters)", s, max)
	}
	if idRE.MatchString(s) {
		// Lookups try ids first: such a name would hide, or be hidden by,
		// the sandbox with that id.
		return api.Errorf(api.CodeInvalid, "name %q: names of the form sb-xxxxxxxxxxxx are kept for sandbox ids", s)
	}
	if strings.HasSuffix(s, "-") || strings.Contains(s, "--") {
		// "--" separates the name from the org in URLs (NAME--ORG.domain).
		return api.Errorf(api.CodeInvalid, "name %q: a name may not end with '-' or contain '--'", s)
	}
	return nil
}

func checkEnv(env map[string]string) error {
	for k, v := range env {
		if !envKeyRE.MatchString(k) {
			return api.Errorf(api.CodeInvalid, "env: %q is not a valid variable name", k)
		}
		if strings.HasPrefix(k, "LOAM_AGENT_") {
			return api.Errorf(api.CodeInvalid, "env: %q: names starting with LOAM_AGENT_ are reserved", k)
		}
		if strings.ContainsRune(v, 0) {
			return api.Errorf(api.CodeInvalid, "env: the value of %s contains a NUL byte", k)
		}
	}
	if len(env) > 256 {
		return api.Errorf(api.CodeInvalid, "env: at most 256 variables")
	}
	return nil
}

func checkLabels(labels map[string]string) error { return api.CheckLabels(labels) }

// Resource bounds: a sandbox may ask for anything in between.
const (
	minMemoryMiB = 64
	maxMemoryMiB = 64 << 10
	minDiskMiB   = 256
	maxDiskMiB   = 1 << 20
	maxCPUs      = 64
)

func checkResources(r api.Resources) error {
	switch {
	// Written so that NaN, which no comparison holds for, is refused:
	// JSON cannot carry one, but a Resources need not come from JSON.
	case !(r.CPUs == 0 || r.CPUs >= 0.1 && r.CPUs <= maxCPUs):
		return api.Errorf(api.CodeInvalid, "resources.cpus: %g is out of range (0.1 to %d)", r.CPUs, maxCPUs)
	case r.MemoryMiB != 0 && (r.MemoryMiB < minMemoryMiB || r.MemoryMiB > maxMemoryMiB):
		return api.Errorf(api.CodeInvalid, "resources.memory_mib: %d is out of range (%d to %d)", r.MemoryMiB, minMemoryMiB, maxMemoryMiB)
	case r.DiskMiB != 0 && (r.DiskMiB < minDiskMiB || r.DiskMiB > maxDiskMiB):
		return api.Errorf(api.CodeInvalid, "resources.disk_mib: %d is out of range (%d to %d)", r.DiskMiB, minDiskMiB, maxDiskMiB)
	}
	return nil
}

// checkIdle checks a sandbox's idle: a duration of at least min, or "0"
// for never, or "" for the daemon's default.
func checkIdle(s string, min time.Duration) error {
	if s == "" {
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < min && d != 0 {
		return api.Errorf(api.CodeInvalid, "idle: %q is not a duration of at least %s (like \"10m\" or \"1h\"), or \"0\" for never", s, shortDuration(min))
	}
	return nil
}

// shortDuration writes d as a user would: 1m, not 1m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func checkPort(p int) error {
	if p < 0 || p > 65535 {
		return api.Errorf(api.CodeInvalid, "http_port: %d is not a port (1-65535)", p)
	}
	return nil
}

// newID makes a sandbox id: "sb-" and 12 random lowercase letters and digits.
// Fixed length matters: runsc matches container ids by prefix.
func newID() string { return "sb-" + randid.String(12) }

// checkRecover checks a recover policy (api.CreateSandbox.Recover).
func checkRecover(p string) error {
	if p == "" || p == api.RecoverLatestCheckpoint {
		return nil
	}
	return api.Errorf(api.CodeInvalid, "recover: %q is no policy; give %q (brought back on another node from its latest stored checkpoint if its node is lost) or \"\" (none)", p, api.RecoverLatestCheckpoint)
}
