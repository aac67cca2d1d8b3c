// Package pgtest runs a real PostgreSQL for tests: Debian's server
// binaries, initdb in a temporary directory, a server listening on a Unix
// socket of its own (no TCP port to collide with another run), one empty
// database per test, and everything stopped and removed when the test
// binary's tests end (Main). PostgreSQL refuses to run as root, so the
// server runs as the postgres user the Debian package makes. The server is
// the test binary's child, which the kernel stops when the binary dies (a
// panic, a timeout's kill) before Main could; the next run removes what
// such a death left in the temporary directory.
//
// A machine without the server binaries skips the tests that need one, or
// fails them under CI=true (testenv.Missing); scripts/setup installs them.
package pgtest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"loam.dev/loam/internal/testenv"
)

// Server is a PostgreSQL server of the test binary's.
type Server struct {
	bin  string              // the server's bin directory
	dir  string              // its temporary directory: data/ and the socket
	cred *syscall.Credential // the postgres user's
	// proc is the running server, nil while stopped.
	mu   sync.Mutex
	proc *exec.Cmd
	// ready is closed when Start ended; err says how.
	ready chan struct{}
	err   error
	dbs   atomic.Int64
	// tcp, when set, is the address (host:port) it also listens on, for
	// clients in other network namespaces (a Unix socket is reachable
	// from any of them, so a dropped link would not cut it).
	tcp string
}

var (
	shared     *Server
	sharedOnce sync.Once
)

// Main runs m's tests and then stops the server any of them started. Call
// it from TestMain: os.Exit(pgtest.Main(m)).
func Main(m *testing.M) int { return Around(m.Run) }

// Around runs run (a package's tests) and then stops the server any of them
// started, for a TestMain that runs its tests through something else too.
func Around(run func() int) int {
	code := run()
	if shared != nil {
		if err := shared.stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// NewDatabase makes an empty database on the test binary's server (started
// on first use) and returns its URL; the database is dropped when tb ends.
// tb ends (testenv.Missing) when this machine has no PostgreSQL server.
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	bin := binDir()
	if bin == "" {
		testenv.Missing(tb, "needs PostgreSQL's server (Debian's postgresql-15; scripts/setup installs it)")
	}
	testenv.Root(tb) // to run the server as the postgres user
	sharedOnce.Do(func() {
		shared = &Server{bin: bin, ready: make(chan struct{})}
		shared.err = shared.start()
		close(shared.ready)
	})
	<-shared.ready
	if shared.err != nil {
		tb.Fatalf("starting PostgreSQL: %v", shared.err)
	}
	return shared.URL(shared.NewDatabase(tb))
}

// NewServer starts a server of tb's own, stopped and removed when tb ends:
// for a test that stops or crashes its server while others run on the
// shared one. With tcp set (host:port) it also listens there, trusting
// every client (no password, as on the socket): for nodes in network
// namespaces of their own, which TCPURL names it to.
func NewServer(tb testing.TB, tcp string) *Server {
	tb.Helper()
	bin := binDir()
	if bin == "" {
		testenv.Missing(tb, "needs PostgreSQL's server (Debian's postgresql-15; scripts/setup installs it)")
	}
	testenv.Root(tb)
	s := &Server{bin: bin, tcp: tcp}
	tb.Cleanup(func() {
		if err := s.stop(); err != nil {
			tb.Errorf("stopping PostgreSQL: %v", err)
		}
	})
	if err := s.start(); err != nil {
		tb.Fatalf("starting PostgreSQL: %v", err)
	}
	return s
}

// NewDatabase makes an empty database on s and returns its name; it is
// dropped when tb ends.
func (s *Server) NewDatabase(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), s.dbs.Add(1))
	ctx := context.Background()
	if err := s.admin(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("making database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		// WITH (FORCE) ends a connection a failed test left open.
		if err := s.admin(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			tb.Errorf("dropping database %s: %v", name, err)
		}
	})
	return name
}

// TCPURL is the connection URL of database name on s over TCP (NewServer's
// tcp address).
func (s *Server) TCPURL(name string) string {
	return "postgres://postgres@" + s.tcp + "/" + name + "?sslmode=disable"
}

// URL is the connection URL of database name on s.
func (s *Server) URL(name string) string {
	q := url.Values{"host": {s.dir}, "user": {"postgres"}, "sslmode": {"disable"}}
	if s.tcp != "" {
		_, port, _ := net.SplitHostPort(s.tcp)
		q.Set("port", port) // the socket's name has the port in it
	}
	return "postgres:///" + name + "?" + q.Encode()
}

// Stop stops the server (a fast shutdown: its sessions end, nothing
// acknowledged is lost), for a test of what the store says while its
// database is away. Start brings it back on the same data.
func (s *Server) Stop() error { return s.signal(syscall.SIGINT) }

// Crash stops the server as a crash would (an immediate shutdown: no
// checkpoint, its sessions cut; the next Start replays its WAL), for a
// test that what the store acknowledged survives one.
func (s *Server) Crash() error { return s.signal(syscall.SIGQUIT) }

// signal ends the server with sig and waits for it.
func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return nil
	}
	p := s.proc
	s.proc = nil
	if err := p.Process.Signal(sig); err != nil {
		return err
	}
	_ = p.Wait() // its exit status after a signal says nothing more
	return nil
}

// Start starts the server, and waits until it answers.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return nil
	}
	logf, err := os.OpenFile(filepath.Join(s.dir, "log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	// The socket, in dir, and no TCP unless asked; fsync stays on, as a
	// real server's.
	listen, port := "", "5432"
	if s.tcp != "" {
		host, p, err := net.SplitHostPort(s.tcp)
		if err != nil {
			return fmt.Errorf("listening on %q: %w", s.tcp, err)
		}
		listen, port = host, p
	}
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), "-D", s.data(),
		"-c", "listen_addresses="+listen, "-c", "port="+port, "-c", "unix_socket_directories="+s.dir,
		"-c", "max_connections=200", "-c", "shared_buffers=32MB")
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// SIGQUIT, an immediate shutdown, when the test binary dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGQUIT}
	if err := testenv.StartParked(cmd); err != nil {
		return fmt.Errorf("starting postgres: %w", err)
	}
	s.proc = cmd
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		err := s.admin(ctx, "SELECT 1")
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			b, _ := os.ReadFile(filepath.Join(s.dir, "log"))
			return fmt.Errorf("the server does not answer: %w\n%s", err, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Shared is the test binary's server, once NewDatabase started it.
func Shared() *Server { return shared }

// binDir is the newest PostgreSQL 15+ server's bin directory, "" if none.
func binDir() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if version(d) >= 15 {
			return filepath.Dir(d)
		}
	}
	return ""
}

func version(path string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
	return v
}

// start makes the cluster in a new directory the postgres user owns, and
// starts its server on a socket there.
func (s *Server) start() error {
	sweep()
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("finding the postgres user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return err
	}
	s.dir = dir
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	initdb := exec.Command(filepath.Join(s.bin, "initdb"), "-D", s.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, out)
	}
	if s.tcp != "" {
		hba, err := os.OpenFile(filepath.Join(s.data(), "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		_, err = hba.WriteString("host all all 0.0.0.0/0 trust\n")
		if cerr := hba.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("trusting TCP clients: %w", err)
		}
	}
	return s.Start()
}

// dirPrefix names the servers' temporary directories.
const dirPrefix = "loam-pgtest-"

// sweep removes the directories of servers whose test binary died before
// it could (its server died with it): those whose owner file names no live
// process.
func sweep() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // being made (or not ours): left alone
		}
		if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 && syscall.Kill(pid, 0) == nil {
			continue // a live test binary's
		}
		os.RemoveAll(dir)
	}
}

// ownerFile, in a server's directory, holds the pid of the test binary
// whose server it is.
const ownerFile = "owner"

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

// stop stops the server and removes its directory.
func (s *Server) stop() error {
	if s.dir == "" {
		return nil
	}
	err := s.Stop()
	if rerr := os.RemoveAll(s.dir); err == nil {
		err = rerr
	}
	return err
}

// admin runs one statement in the postgres database.
func (s *Server) admin(ctx context.Context, stmt string) error {
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	_, err = c.Exec(ctx, stmt)
	return err
}
