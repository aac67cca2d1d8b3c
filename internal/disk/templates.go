package disk

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Template is a recipe for a root filesystem that sandboxes start from.
type Template struct {
	// Name is the template's name in a Pool.
	Name string
	// Description says what is in it, for people choosing one.
	Description string
	// Build builds the tree into dir, an empty directory that exists. It
	// runs as root and may take a minute.
	Build func(ctx context.Context, dir string) error
	// Recipe describes everything Build does. Its hash keys the Cache, so
	// any change to what Build makes must change Recipe.
	Recipe string
}

// DefaultTemplate is the template sandboxes start from when none is named.
const DefaultTemplate = "base"

// The user sandboxes run as, in every template.
const (
	userName = "loam"
	userID   = 1000
	userHome = "/home/loam"
)

// TemplateOptions say how this host builds the built-in templates. None of
// them changes what a template holds, so none is part of a Recipe: a
// template cached by one daemon serves another whatever its options.
type TemplateOptions struct {
	// DebianMirror is the Debian archive debootstrap fetches base's
	// packages from; "" is DefaultDebianMirror. Any mirror of Debian's
	// archive yields the same tree: its /etc/apt/sources.list names
	// DefaultDebianMirror whichever mirror built it.
	DebianMirror string
}

// Templates returns the built-in templates: "base", a minimal Debian 12
// with python3 (the default), and "busybox", a 2 MB tree for fast tests.
func Templates(o TemplateOptions) []Template {
	return []Template{baseTemplate(o), busyboxTemplate()}
}

// FindTemplate returns the built-in template called name.
func FindTemplate(name string, o TemplateOptions) (Template, error) {
	for _, t := range Templates(o) {
		if t.Name == name {
			return t, nil
		}
	}
	return Template{}, fmt.Errorf("template %s: %w", name, ErrNotFound)
}

// The base template's debootstrap invocation; the recipe quotes it, so
// changing it rebuilds the template. The recipe names DefaultDebianMirror
// whatever mirror the build fetches from (TemplateOptions.DebianMirror):
// the mirror changes where the packages come from, not the tree, so the
// template's identity (and the cache key of every base built so far) stays.
var (
	debianSuite     = "bookworm"
	debootstrapArgs = []string{"--variant=minbase", "--include=python3,procps,ca-certificates"}
)

func baseTemplate(o TemplateOptions) Template {
	mirror := o.DebianMirror
	if mirror == "" {
		mirror = DefaultDebianMirror
	}
	return Template{
		Name:        "base",
		Description: "Debian 12 (bookworm) minbase with python3, procps and ca-certificates; user loam (1000) with bash",
		Build:       func(ctx context.Context, dir string) error { return buildBase(ctx, dir, mirror) },
		Recipe: fmt.Sprintf("base/1\ndebootstrap %s %s DIR %s\nuser %s %d:%d %s /bin/bash\nhostname loam, hosts\nno apt caches\n",
			strings.Join(debootstrapArgs, " "), debianSuite, DefaultDebianMirror, userName, userID, userID, userHome),
	}
}

// debootstrapShare is the part of the base template's build that
// debootstrap takes, for its progress; copying the tree into a pool takes
// most of the rest.
const debootstrapShare = 0.9

func buildBase(ctx context.Context, dir, mirror string) error {
	if err := debootstrap(ctx, dir, mirror); err != nil {
		return fmt.Errorf("building base template from %s: %w", mirror, err)
	}
	// debootstrap names the mirror it used; the tree names Debian's own
	// archive, as the recipe does, whichever mirror built it.
	sources := fmt.Sprintf("deb %s %s main\n", DefaultDebianMirror, debianSuite)
	if err := os.WriteFile(filepath.Join(dir, "etc/apt/sources.list"), []byte(sources), 0o644); err != nil {
		return fmt.Errorf("building base template: %w", err)
	}
	if err := addUser(dir, "/bin/bash"); err != nil {
		return fmt.Errorf("building base template: %w", err)
	}
	if err := copySkel(dir); err != nil {
		return fmt.Errorf("building base template: %w", err)
	}
	if err := writeHostFiles(dir); err != nil {
		return fmt.Errorf("building base template: %w", err)
	}
	// Package caches are most of the tree's size and useless in a template:
	// apt-get update refetches lists, and archives are only downloads.
	for _, pattern := range []string{"var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*"} {
		matches, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			return fmt.Errorf("building base template: %w", err)
		}
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				return fmt.Errorf("building base template: removing apt caches: %w", err)
			}
		}
	}
	return nil
}

// debootstrap runs debootstrap into dir, reporting its progress (see
// debootstrapProgress) as the first debootstrapShare of the build's.
// --debian-installer changes only how debootstrap reports (progress lines
// on fd 3, the full log on stdout and stderr), not what it installs, so
// it is not part of the recipe.
func debootstrap(ctx context.Context, dir, mirror string) error {
	pr, pw, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("running debootstrap: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		debootstrapProgress(pr, func(f float64) { ReportProgress(ctx, f*debootstrapShare) })
	}()
	args := append(append([]string{"--debian-installer"}, debootstrapArgs...), debianSuite, dir, mirror)
	_, err = runFd3(ctx, pw, "debootstrap", args...)
	pw.Close() // the child has its own copy; the reader ends when it exits
	<-done
	pr.Close()
	if err != nil {
		// debootstrap's own output often just says to see its log.
		return fmt.Errorf("%w%s", err, logTail(filepath.Join(dir, "debootstrap", "debootstrap.log")))
	}
	return nil
}

// logTail returns the end of a log file for an error message, or "" if it
// cannot be read.
func logTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return "; " + filepath.Base(path) + stderrSuffix(string(data))
}

// addUser adds the loam user and group to a Debian tree's account files,
// unless they are there, with no password (key or agent login only).
func addUser(root, shell string) error {
	entries := []struct{ file, prefix, line string }{
		{"etc/passwd", userName + ":", fmt.Sprintf("%s:x:%d:%d:%s:%s:%s", userName, userID, userID, userName, userHome, shell)},
		{"etc/group", userName + ":", fmt.Sprintf("%s:x:%d:", userName, userID)},
		{"etc/shadow", userName + ":", userName + ":*::0:99999:7:::"},
		{"etc/gshadow", userName + ":", userName + ":!::"},
	}
	for _, e := range entries {
		if err := appendLine(filepath.Join(root, e.file), e.prefix, e.line); err != nil {
			return fmt.Errorf("adding user %s: %w", userName, err)
		}
	}
	home := filepath.Join(root, userHome)
	if err := os.MkdirAll(home, 0o755); err != nil {
		return fmt.Errorf("adding user %s: %w", userName, err)
	}
	if err := os.Chown(home, userID, userID); err != nil {
		return fmt.Errorf("adding user %s: %w", userName, err)
	}
	return nil
}

// appendLine appends line to an existing file unless a line starts with
// prefix. Appending keeps the file's owner and mode (/etc/shadow's 0640
// root:shadow); a missing file (gshadow in some trees) is skipped.
func appendLine(path, prefix, line string) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, prefix) {
			return nil
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		line = "\n" + line
	}
	_, err = f.WriteString(line + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// copySkel gives the loam user the shell start-up files of /etc/skel, as
// useradd -m would.
func copySkel(root string) error {
	skel := filepath.Join(root, "etc/skel")
	entries, err := os.ReadDir(skel)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("copying /etc/skel: %w", err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		dst := filepath.Join(root, userHome, e.Name())
		if err := copyFile(filepath.Join(skel, e.Name()), dst, 0o644); err != nil {
			return fmt.Errorf("copying /etc/skel: %w", err)
		}
		if err := os.Chown(dst, userID, userID); err != nil {
			return fmt.Errorf("copying /etc/skel: %w", err)
		}
	}
	return nil
}

// writeHostFiles writes /etc/hostname and /etc/hosts, replacing the host's
// copies that debootstrap brings along.
func writeHostFiles(root string) error {
	files := map[string]string{
		"etc/hostname": "loam\n",
		"etc/hosts":    "127.0.0.1\tlocalhost\n127.0.1.1\tloam\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			return fmt.Errorf("writing /%s: %w", name, err)
		}
	}
	return nil
}

// hostBusybox is where Debian's busybox-static puts its binary.
const hostBusybox = "/bin/busybox"

func busyboxTemplate() Template {
	return Template{
		Name:        "busybox",
		Description: "the host's static busybox with its applets in /bin; user loam (1000) with sh",
		Build:       buildBusybox,
		Recipe: fmt.Sprintf("busybox/1\n%s (static), applet links in /bin\nusers root, %s %d:%d %s /bin/sh\n/tmp /root /proc /sys /dev, hostname loam, hosts\n",
			hostBusybox, userName, userID, userID, userHome),
	}
}

func buildBusybox(ctx context.Context, dir string) error {
	if err := requireStatic(hostBusybox); err != nil {
		return fmt.Errorf("building busybox template: %w (install busybox-static)", err)
	}
	dirs := []struct {
		path string
		mode os.FileMode
	}{
		{"bin", 0o755}, {"etc", 0o755}, {"home", 0o755}, {userHome[1:], 0o755},
		{"root", 0o700}, {"tmp", os.ModeSticky | 0o777}, {"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755},
	}
	for _, d := range dirs {
		p := filepath.Join(dir, d.path)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fmt.Errorf("building busybox template: %w", err)
		}
		// Chmod because Mkdir is subject to the umask and drops the sticky bit.
		if err := os.Chmod(p, d.mode); err != nil {
			return fmt.Errorf("building busybox template: %w", err)
		}
	}
	if err := os.Chown(filepath.Join(dir, userHome), userID, userID); err != nil {
		return fmt.Errorf("building busybox template: %w", err)
	}
	bb := filepath.Join(dir, "bin/busybox")
	if err := copyFile(hostBusybox, bb, 0o755); err != nil {
		return fmt.Errorf("building busybox template: %w", err)
	}
	out, err := run(ctx, bb, "--list")
	if err != nil {
		return fmt.Errorf("building busybox template: %w", err)
	}
	for _, applet := range strings.Fields(out) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", applet)); err != nil {
			return fmt.Errorf("building busybox template: linking %s: %w", applet, err)
		}
	}
	files := map[string]string{
		"etc/passwd": fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\n%s:x:%d:%d:%s:%s:/bin/sh\n",
			userName, userID, userID, userName, userHome),
		"etc/group": fmt.Sprintf("root:x:0:\n%s:x:%d:\n", userName, userID),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return fmt.Errorf("building busybox template: writing /%s: %w", name, err)
		}
	}
	if err := writeHostFiles(dir); err != nil {
		return fmt.Errorf("building busybox template: %w", err)
	}
	return nil
}

// requireStatic fails unless path is a statically linked ELF binary: the
// dynamic busybox package installs the same path, and its binary would not
// run in a tree without libc.
func requireStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("checking %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked", path)
		}
	}
	return nil
}

// copyFile copies a regular file's contents to dst with mode perm.
func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copying %s to %s: %w", src, dst, err)
	}
	// Chmod because OpenFile's mode is subject to the umask.
	return os.Chmod(dst, perm)
}
