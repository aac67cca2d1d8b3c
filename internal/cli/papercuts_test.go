package cli

import (
	"net"
	"net/http/httptest"
	"strings"
	"testing"

	"loam.dev/loam/client"
	"loam.dev/loam/internal/version"
)

// TestVersion: loam --version and loam version print the same version.
func TestVersion(t *testing.T) {
	_, srv := newFakeAPI(t)
	want := "loam " + version.String() + "\n"
	for _, args := range [][]string{{"--version"}, {"version"}} {
		r := runCLI(t, srv, "", false, nil, args...)
		if r.code != 0 || r.stdout != want {
			t.Errorf("loam %s: exit %d, stdout %q, stderr %q; want %q", strings.Join(args, " "), r.code, r.stdout, r.stderr, want)
		}
	}
}

// TestWrongTokenMessage: a refused token tells a CLI user to set LOAM_TOKEN,
// not to send a header.
func TestWrongTokenMessage(t *testing.T) {
	_, srv := newFakeAPI(t)
	a := &app{getenv: func(string) string { return "" }}
	var stdout, stderr strings.Builder
	a.stdin, a.stdout, a.stderr = strings.NewReader(""), &stdout, &stderr
	a.connect = func() (*client.Client, error) { return client.New(srv.URL, "wrong"), nil }
	a.interactive = func() bool { return false }
	root := newRoot(a)
	root.SetArgs([]string{"ls"})
	if code := Execute(t.Context(), root); code != 1 || !strings.Contains(stderr.String(), "set LOAM_TOKEN") || strings.Contains(stderr.String(), "Authorization") {
		t.Errorf("ls with a wrong token: exit %d, stderr %q; want a hint to set LOAM_TOKEN", code, stderr.String())
	}
}

// TestMissingCheckpointArg: restore with only a sandbox says the checkpoint
// is missing, not the sandbox.
func TestMissingCheckpointArg(t *testing.T) {
	_, srv := newFakeAPI(t)
	for _, args := range [][]string{
		{"checkpoint", "restore", "-y", "scratch"},
		{"checkpoint", "get", "scratch"},
		{"checkpoint", "rm", "-y", "scratch"},
	} {
		r := runCLI(t, srv, "", false, nil, args...)
		if r.code != 1 || !strings.HasPrefix(r.stderr, "loam: no checkpoint given: give SANDBOX CHECKPOINT") {
			t.Errorf("loam %s: exit %d, stderr %q; want it to say the checkpoint is missing", strings.Join(args, " "), r.code, r.stderr)
		}
	}
}

// TestConnectionRefused: with no daemon at the address, the error says that
// no loam serve is running there.
func TestConnectionRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	srv := &httptest.Server{URL: "http://" + addr}
	r := runCLI(t, srv, "", false, nil, "ls")
	if r.code != 1 || !strings.Contains(r.stderr, "no loam serve is running at that address") || !strings.Contains(r.stderr, addr) {
		t.Errorf("ls with no daemon: exit %d, stderr %q", r.code, r.stderr)
	}
}
