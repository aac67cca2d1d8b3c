package disk_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/testenv"
)

// TestHostDebianMirror reads the host's apt mirror from each format apt
// takes, and refuses what is no Debian mirror debootstrap could use.
func TestHostDebianMirror(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string // path under the apt dir -> content
		want  string            // "" for none
	}{
		{"none", nil, ""},
		{"deb822, as Debian 12 ships it", map[string]string{"sources.list.d/debian.sources": `Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian/
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
`}, "http://mirror.example/debian"},
		{"one-line, with options and comments", map[string]string{"sources.list": `# deb cdrom:[Debian GNU/Linux 12]/ bookworm main
deb-src http://src.example/debian bookworm main
deb http://security.debian.org/debian-security bookworm-security main
deb [ arch=amd64 signed-by=/k.gpg ] https://mirror.example/debian bookworm main contrib # the mirror
`}, "https://mirror.example/debian"},
		{"sources.list before sources.list.d", map[string]string{
			"sources.list":                 "deb http://first.example/debian stable main\n",
			"sources.list.d/a.list":        "deb http://second.example/debian stable main\n",
			"sources.list.d/other.sources": "Types: deb\nURIs: http://third.example/debian\nSuites: stable\nComponents: main\n",
		}, "http://first.example/debian"},
		{"an Ubuntu host's is no Debian mirror", map[string]string{
			"sources.list": "deb http://archive.ubuntu.com/ubuntu jammy main restricted\n",
		}, ""},
		{"disabled, cdrom, transports and other components are skipped", map[string]string{
			"sources.list":                   "deb cdrom:[Debian]/ bookworm main\ndeb mirror+file:/etc/apt/mirrors.txt bookworm main\ndeb http://x.example/debian bookworm contrib\n",
			"sources.list.d/a.sources":       "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n\nTypes: deb-src deb\nURIs:\n http://on.example/debian\nSuites: trixie\nComponents: main\n",
			"sources.list.d/b.list.disabled": "deb http://never.example/debian bookworm main\n",
		}, "http://on.example/debian"},
		{"a third party's repository is no Debian mirror", map[string]string{
			"sources.list.d/node.sources": "Types: deb\nURIs: https://deb.nodesource.com/node_20.x\nSuites: nodistro\nComponents: main\n",
			"sources.list.d/gcloud.list":  "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n",
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tc.files {
				path := filepath.Join(dir, name)
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, ok := disk.HostDebianMirror(dir)
			if got != tc.want || ok != (tc.want != "") {
				t.Errorf("HostDebianMirror = %q, %v; want %q", got, ok, tc.want)
			}
			want := tc.want
			if want == "" {
				want = disk.DefaultDebianMirror
			}
			if got := disk.ChooseDebianMirror("", dir); got != want {
				t.Errorf("ChooseDebianMirror without a flag = %q, want %q", got, want)
			}
			if got := disk.ChooseDebianMirror("http://flag.example/debian/", dir); got != "http://flag.example/debian" {
				t.Errorf("ChooseDebianMirror with a flag = %q", got)
			}
		})
	}
}

// TestBaseBuildsFromMirror: base's debootstrap fetches from the mirror it
// is given (it fetched from deb.debian.org whatever the host's apt said),
// while the template's identity (its cache key) and its tree's apt sources
// stay those of Debian's own archive, so a cached base serves every mirror.
func TestBaseBuildsFromMirror(t *testing.T) {
	testenv.Root(t) // the build gives the user's home to uid 1000
	bin := t.TempDir()
	argsFile := filepath.Join(bin, "args")
	// A debootstrap that records its arguments and writes a tree of the
	// shape the real one leaves, sources.list naming the mirror it used.
	fake := `#!/bin/sh
printf '%s\n' "$@" > ` + argsFile + `
for last; do :; done
for a; do case "$a" in /*) dir="$a";; esac; done
mkdir -p "$dir/etc/apt" "$dir/etc/skel"
echo "deb $last bookworm main" > "$dir/etc/apt/sources.list"
echo 'root:x:0:0:root:/root:/bin/bash' > "$dir/etc/passwd"
echo 'root:x:0:' > "$dir/etc/group"
`
	if err := os.WriteFile(filepath.Join(bin, "debootstrap"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))

	const mirror = "http://mirror.example/debian"
	def, err := disk.FindTemplate("base", disk.TemplateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := disk.FindTemplate("base", disk.TemplateOptions{DebianMirror: mirror})
	if err != nil {
		t.Fatal(err)
	}
	// base-4e8ff98926d0 is the key of every base built before mirrors
	// could be chosen: they stay valid.
	if tpl.Key() != def.Key() || tpl.Key() != "base-4e8ff98926d0" {
		t.Errorf("keys %s (mirror) and %s (default), want both base-4e8ff98926d0", tpl.Key(), def.Key())
	}
	dir := t.TempDir()
	if err := tpl.Build(t.Context(), dir); err != nil {
		t.Fatal(err)
	}
	args, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatal(err)
	}
	if a := strings.Fields(string(args)); !slices.Contains(a, mirror) || slices.Contains(a, disk.DefaultDebianMirror) {
		t.Errorf("debootstrap ran with %q, want the mirror %s", a, mirror)
	}
	sources, err := os.ReadFile(filepath.Join(dir, "etc/apt/sources.list"))
	if err != nil || string(sources) != "deb http://deb.debian.org/debian bookworm main\n" {
		t.Errorf("the tree's sources.list %q, %v: want Debian's archive, whatever mirror built it", sources, err)
	}
}
