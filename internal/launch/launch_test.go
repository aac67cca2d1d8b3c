package launch

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The test binary stands in for `loam serve` when LOAM_LAUNCH_FAKE is
// set: "serve" writes api_url and token as the daemon does and answers
// /healthz until it is signalled; "exit" exits at once; "hang" never
// answers.
func TestMain(m *testing.M) {
	switch os.Getenv("LOAM_LAUNCH_FAKE") {
	case "serve":
		fakeServe()
	case "exit":
		os.Exit(3)
	case "hang":
		time.Sleep(time.Hour)
	}
	os.Exit(m.Run())
}

// fakeServe is a daemon's start-up as the launcher sees it: listen, then
// write the token and api_url into --data-dir.
func fakeServe() {
	var dir string
	for i, a := range os.Args {
		if a == "--data-dir" && i+1 < len(os.Args) {
			dir = os.Args[i+1]
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.Exit(2)
	}
	if os.WriteFile(filepath.Join(dir, "token"), []byte("tok\n"), 0o600) != nil ||
		os.WriteFile(filepath.Join(dir, "api_url"), []byte("http://"+ln.Addr().String()+"\n"), 0o600) != nil {
		os.Exit(2)
	}
	_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	os.Exit(0)
}

func fake(t *testing.T, mode string) Options {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Options{Bin: self, DataDir: t.TempDir(), Subnet: "10.254.0.0/24",
		Env: []string{"LOAM_LAUNCH_FAKE=" + mode}, Timeout: 20 * time.Second}
}

func TestStartReadsURLAndToken(t *testing.T) {
	o := fake(t, "serve")
	// A stale api_url from an earlier run must not be taken for this one.
	if err := os.WriteFile(filepath.Join(o.DataDir, "api_url"), []byte("http://127.0.0.1:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if p.Token != "tok" || p.URL == "http://127.0.0.1:1" || p.Client == nil {
		t.Errorf("URL %q, token %q, client %v", p.URL, p.Token, p.Client)
	}
	p.Stop()
	select {
	case <-p.Exited():
	default:
		t.Error("Stop returned before the process exited")
	}
}

func TestStartSeesExit(t *testing.T) {
	_, err := Start(context.Background(), fake(t, "exit"))
	if !errors.Is(err, ErrExited) {
		t.Fatalf("err = %v, want ErrExited", err)
	}
}

func TestStartTimesOut(t *testing.T) {
	o := fake(t, "hang")
	o.Timeout = 200 * time.Millisecond
	start := time.Now()
	_, err := Start(context.Background(), o)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	// Start killed the process it gave up on, and waited for it.
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Start took %v to give up after 200ms", d)
	}
}

func TestStartRefusesBadSubnet(t *testing.T) {
	o := fake(t, "serve")
	o.Subnet = "not a subnet"
	if _, err := Start(context.Background(), o); err == nil {
		t.Fatal("Start accepted a bad subnet")
	}
}

// TestNodePrefix: the part a node's namespace names carry, from its flags.
func TestNodePrefix(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, ""},
		{[]string{"--database", "x"}, ""},
		{[]string{"--node", "b", "--listen", "x"}, "b-"},
		{[]string{"--node=a", "--node", "c"}, "c-"},
		{[]string{"--node"}, ""},
	} {
		if got := nodePrefix(c.args); got != c.want {
			t.Errorf("nodePrefix(%q) = %q, want %q", c.args, got, c.want)
		}
	}
}
