// Package account is the sandbox's users as the agent sees them: looked up
// in its passwd and group files, each process's environment built for one,
// and file-system work done with a user's rights (AsUser).
package account

import (
	"bufio"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// The sandbox's account databases. The agent parses them itself rather than
// using os/user: os/user (without cgo) has no login shell, and SHELL is part
// of every process's environment.
const (
	PasswdFile = "/etc/passwd"
	GroupFile  = "/etc/group"
)

// DefaultUser runs commands whose request names no user.
const DefaultUser = "loam"

// DefaultPath is every process's PATH unless the sandbox or the request
// sets another.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// ErrNoAccount is returned by Lookup for a user the passwd file lacks.
var ErrNoAccount = errors.New("no such user")

// Account is one user of the sandbox, as a process is started under it.
type Account struct {
	Name   string
	UID    uint32
	GID    uint32   // primary group
	Groups []uint32 // supplementary groups, the primary one included
	Home   string
	Shell  string
}

// Lookup finds a user by name, or by numeric uid when no user has
// that name, in the passwd file, and collects its groups from the group file.
func Lookup(passwdPath, groupPath, name string) (Account, error) {
	f, err := os.Open(passwdPath)
	if err != nil {
		return Account{}, fmt.Errorf("looking up user %q: %w", name, err)
	}
	defer f.Close()

	var byUID *Account
	var found *Account
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		a, ok := parsePasswdLine(sc.Text())
		if !ok {
			continue
		}
		if a.Name == name {
			found = &a
			break
		}
		if byUID == nil && strconv.FormatUint(uint64(a.UID), 10) == name {
			byUID = &a
		}
	}
	if err := sc.Err(); err != nil {
		return Account{}, fmt.Errorf("reading %s: %w", passwdPath, err)
	}
	if found == nil {
		found = byUID
	}
	if found == nil {
		return Account{}, fmt.Errorf("looking up user %q in %s: %w", name, passwdPath, ErrNoAccount)
	}
	groups, err := supplementaryGroups(groupPath, found.Name, found.GID)
	if err != nil {
		return Account{}, err
	}
	found.Groups = groups
	return *found, nil
}

// parsePasswdLine parses name:password:uid:gid:gecos:home:shell.
func parsePasswdLine(line string) (Account, bool) {
	if line == "" || line[0] == '#' {
		return Account{}, false
	}
	fields := strings.Split(line, ":")
	if len(fields) < 7 || fields[0] == "" {
		return Account{}, false
	}
	uid, err1 := strconv.ParseUint(fields[2], 10, 32)
	gid, err2 := strconv.ParseUint(fields[3], 10, 32)
	if err1 != nil || err2 != nil {
		return Account{}, false
	}
	return Account{
		Name:  fields[0],
		UID:   uint32(uid),
		GID:   uint32(gid),
		Home:  fields[5],
		Shell: fields[6],
	}, true
}

// supplementaryGroups is gid plus every group of the group file
// (name:password:gid:member,member) that lists user as a member. A missing
// group file leaves the primary group alone, as login does.
func supplementaryGroups(groupPath, user string, gid uint32) ([]uint32, error) {
	groups := []uint32{gid}
	f, err := os.Open(groupPath)
	if errors.Is(err, os.ErrNotExist) {
		return groups, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading groups of %q: %w", user, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 4 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		id, err := strconv.ParseUint(fields[2], 10, 32)
		if err != nil {
			continue
		}
		if slices.Contains(strings.Split(fields[3], ","), user) && !slices.Contains(groups, uint32(id)) {
			groups = append(groups, uint32(id))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", groupPath, err)
	}
	return groups, nil
}

// executableBy reports whether a could execute the regular file at path,
// judged by its mode bits as the kernel would (root needs any x bit). The
// agent runs as root, so access(2) would answer for root, not for a.
func executableBy(path string, a Account) bool {
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	perm := fi.Mode().Perm()
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case a.UID == 0:
		return perm&0o111 != 0
	case !ok:
		return perm&0o001 != 0
	case st.Uid == a.UID:
		return perm&0o100 != 0
	case slices.Contains(a.Groups, st.Gid):
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}

// LookPath finds file in the directories of pathEnv as a's shell would:
// the first one holding a file a may execute. Relative PATH entries are
// relative to dir, the directory the command will run in.
func LookPath(file, pathEnv, dir string, a Account) (string, bool) {
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, file)
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if executableBy(p, a) {
			return p, true
		}
	}
	return "", false
}

// AgentEnvPrefix starts the names of the agent's own variables (its token
// among them): BuildEnv never passes one to a process.
const AgentEnvPrefix = "LOAM_AGENT_"

// perUserEnv are the variables that describe the user a process runs as;
// they always come from the account, never from the sandbox's environment.
var perUserEnv = []string{"HOME", "USER", "LOGNAME", "SHELL"}

// BuildEnv makes a process's environment. Later layers win: defaults (PATH,
// LANG), then the sandbox's environment (the agent's own, LOAM_AGENT_*
// removed), then the user's identity (HOME, USER, LOGNAME, SHELL), then TERM
// for a terminal, then the request's variables.
func BuildEnv(sandbox []string, a Account, tty bool, req map[string]string) []string {
	env := map[string]string{
		"PATH": DefaultPath,
		"LANG": "C.UTF-8",
	}
	for _, kv := range sandbox {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.HasPrefix(k, AgentEnvPrefix) || slices.Contains(perUserEnv, k) {
			continue
		}
		env[k] = v
	}
	shell := a.Shell
	if shell == "" {
		shell = "/bin/sh"
	}
	env["HOME"] = a.Home
	env["USER"] = a.Name
	env["LOGNAME"] = a.Name
	env["SHELL"] = shell
	if tty {
		env["TERM"] = "xterm-256color"
	}
	maps.Copy(env, req)

	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// EnvValue is the value of key in env (KEY=VALUE strings), the last one
// winning as in execve.
func EnvValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}
