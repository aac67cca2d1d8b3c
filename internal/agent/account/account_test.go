package account

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"loam.dev/loam/internal/testenv"
)

const testPasswd = `# a comment
root:x:0:0:root:/root:/bin/bash
loam:x:1000:1000:Loam,,,:/home/loam:/bin/sh
svc:x:1001:1001::/srv:
a broken line
bad:x:notanumber:1::/:/bin/sh
`

const testGroup = `root:x:0:
loam:x:1000:
wheel:x:10:root,loam
docker:x:999:svc,loam
other:x:5:svc
`

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLookupAccount(t *testing.T) {
	dir := t.TempDir()
	passwd := writeFile(t, dir, "passwd", testPasswd)
	group := writeFile(t, dir, "group", testGroup)

	tests := []struct {
		name string
		want Account
	}{
		{"loam", Account{Name: "loam", UID: 1000, GID: 1000, Groups: []uint32{1000, 10, 999}, Home: "/home/loam", Shell: "/bin/sh"}},
		{"1000", Account{Name: "loam", UID: 1000, GID: 1000, Groups: []uint32{1000, 10, 999}, Home: "/home/loam", Shell: "/bin/sh"}},
		{"root", Account{Name: "root", UID: 0, GID: 0, Groups: []uint32{0, 10}, Home: "/root", Shell: "/bin/bash"}},
		{"svc", Account{Name: "svc", UID: 1001, GID: 1001, Groups: []uint32{1001, 999, 5}, Home: "/srv"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Lookup(passwd, group, tt.name)
			if err != nil {
				t.Fatal(err)
			}
			if got.Name != tt.want.Name || got.UID != tt.want.UID || got.GID != tt.want.GID ||
				got.Home != tt.want.Home || got.Shell != tt.want.Shell || !slices.Equal(got.Groups, tt.want.Groups) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	for _, name := range []string{"nobody", "bad", "a broken line", "", "4242"} {
		if _, err := Lookup(passwd, group, name); !errors.Is(err, ErrNoAccount) {
			t.Errorf("Lookup(%q): %v, want ErrNoAccount", name, err)
		}
	}
	t.Run("no group file", func(t *testing.T) {
		got, err := Lookup(passwd, filepath.Join(dir, "missing"), "loam")
		if err != nil || !slices.Equal(got.Groups, []uint32{1000}) {
			t.Errorf("got %+v, %v; want the primary group only", got, err)
		}
	})
}

func TestExecutableBy(t *testing.T) {
	testenv.Root(t)
	dir := t.TempDir()
	loam := Account{Name: "loam", UID: 1000, GID: 1000, Groups: []uint32{1000, 10}}
	other := Account{Name: "other", UID: 1001, GID: 1001, Groups: []uint32{1001}}
	root := Account{Name: "root", UID: 0, GID: 0, Groups: []uint32{0}}

	tests := []struct {
		name            string
		mode            os.FileMode
		uid, gid        int
		loam, other, rt bool
	}{
		{"owner only", 0o700, 1000, 1000, true, false, true},
		{"group", 0o750, 0, 10, true, false, true},
		{"everyone", 0o755, 0, 0, true, true, true},
		{"nobody may", 0o644, 1000, 1000, false, false, false},
		{"others but not the owner", 0o601, 1000, 1000, false, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, dir, tt.name, "#!/bin/sh\n")
			if err := os.Chmod(p, tt.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(p, tt.uid, tt.gid); err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				a    Account
				want bool
			}{{loam, tt.loam}, {other, tt.other}, {root, tt.rt}} {
				if got := executableBy(p, c.a); got != c.want {
					t.Errorf("executableBy(%s) = %v, want %v", c.a.Name, got, c.want)
				}
			}
		})
	}
	if executableBy(dir, root) {
		t.Error("a directory is executable")
	}
}

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"a", "b", "rel/bin"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, dir, "a/tool", "")              // not executable
	writeFile(t, dir, "b/tool", "")              // executable, below
	writeFile(t, dir, "rel/bin/reltool", "#!\n") // found through a relative entry
	for _, p := range []string{"b/tool", "rel/bin/reltool"} {
		if err := os.Chmod(filepath.Join(dir, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	root := Account{Name: "root"}
	path := filepath.Join(dir, "a") + ":" + filepath.Join(dir, "b") + ":rel/bin"
	tests := []struct {
		file, want string
		ok         bool
	}{
		{"tool", filepath.Join(dir, "b/tool"), true},
		{"reltool", filepath.Join(dir, "rel/bin/reltool"), true},
		{"missing", "", false},
	}
	for _, tt := range tests {
		got, ok := LookPath(tt.file, path, dir, root)
		if got != tt.want || ok != tt.ok {
			t.Errorf("LookPath(%q) = %q, %v; want %q, %v", tt.file, got, ok, tt.want, tt.ok)
		}
	}
}

func TestBuildEnv(t *testing.T) {
	a := Account{Name: "loam", Home: "/home/loam"}
	sandbox := []string{"PATH=/sandbox/bin", "HOME=/wrong", "USER=wrong", "LOAM_AGENT_TOKEN=x", "A=1", "B=2", "junk"}
	got := BuildEnv(sandbox, a, true, map[string]string{"B": "3", "C": "4"})
	want := []string{
		"A=1", "B=3", "C=4", "HOME=/home/loam", "LANG=C.UTF-8", "LOGNAME=loam",
		"PATH=/sandbox/bin", "SHELL=/bin/sh", "TERM=xterm-256color", "USER=loam",
	}
	if !slices.Equal(got, want) {
		t.Errorf("BuildEnv:\n got %q\nwant %q", got, want)
	}
	if got := BuildEnv(nil, a, false, nil); EnvValue(got, "TERM") != "" || EnvValue(got, "PATH") != DefaultPath {
		t.Errorf("without a terminal or sandbox env: %q", got)
	}
}
