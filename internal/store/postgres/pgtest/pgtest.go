// Package pgtest runs a real PostgreSQL for tests: Debian's server
// binaries, initdb in a temporary directory, a server listening on a Unix
// socket of its own (no TCP port to collide with another run), one empty
// database per test, and everything stopped and removed when the test
// binary's tests end (Main). PostgreSQL refuses to run as root, so the
// server runs as the postgres user the Debian package makes.
//
// A machine without the server binaries skips the tests that need one, or
// fails them under CI=true (testenv.Missing); scripts/setup installs them.
package pgtest

import (
	"context"
	"fmt"
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
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"loam.dev/loam/internal/testenv"
)

// Server is a PostgreSQL server of the test binary's.
type Server struct {
	bin  string // the server's bin directory
	dir  string // its temporary directory: data/ and the socket
	user *user.User
	// ready is closed when Start ended; err says how.
	ready chan struct{}
	err   error
	dbs   atomic.Int64
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
	name := fmt.Sprintf("t%d_%d", os.Getpid(), shared.dbs.Add(1))
	ctx := context.Background()
	if err := shared.admin(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("making database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		// WITH (FORCE) ends a connection a failed test left open.
		if err := shared.admin(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			tb.Errorf("dropping database %s: %v", name, err)
		}
	})
	return shared.URL(name)
}

// URL is the connection URL of database name on s.
func (s *Server) URL(name string) string {
	q := url.Values{"host": {s.dir}, "user": {"postgres"}, "sslmode": {"disable"}}
	return "postgres:///" + name + "?" + q.Encode()
}

// Stop stops the server, as a crash of its host would not: for a test of
// what the store says while its database is away. Start brings it back
// on the same data.
func (s *Server) Stop() error { return s.ctl("stop", "-m", "fast") }

// Start starts a server Stop stopped.
func (s *Server) Start() error { return s.ctl("start", "-w", "-l", filepath.Join(s.dir, "log")) }

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
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("finding the postgres user: %w", err)
	}
	s.user = u
	dir, err := os.MkdirTemp("", "loam-pgtest-")
	if err != nil {
		return err
	}
	s.dir = dir
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	if out, err := s.run("initdb", "-D", s.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, out)
	}
	// The socket only (no TCP), in dir; fsync stays on, as a real server's.
	conf := fmt.Sprintf("listen_addresses = ''\nunix_socket_directories = '%s'\nmax_connections = 200\nshared_buffers = 32MB\n", dir)
	if err := appendFile(filepath.Join(s.data(), "postgresql.conf"), conf); err != nil {
		return err
	}
	if err := s.Start(); err != nil {
		return err
	}
	// The server answers once pg_ctl -w returns; wait for a connection
	// all the same, as pg_ctl's check is its own.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		err := s.admin(ctx, "SELECT 1")
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("the server started but does not answer: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

// stop stops the server and removes its directory.
func (s *Server) stop() error {
	if s.dir == "" {
		return nil
	}
	err := s.ctl("stop", "-m", "immediate")
	if rerr := os.RemoveAll(s.dir); err == nil {
		err = rerr
	}
	return err
}

// ctl runs pg_ctl on the cluster.
func (s *Server) ctl(args ...string) error {
	out, err := s.run("pg_ctl", append([]string{"-D", s.data()}, args...)...)
	if err != nil {
		return fmt.Errorf("pg_ctl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// run runs one of the server's programs as the postgres user.
func (s *Server) run(prog string, args ...string) ([]byte, error) {
	cmd := exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(s.bin, prog)}, args...)...)
	cmd.Dir = s.dir
	return cmd.CombinedOutput()
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

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
