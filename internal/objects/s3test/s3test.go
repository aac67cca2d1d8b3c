// Package s3test runs a real S3 server for tests: versitygw
// (github.com/versity/versitygw, Apache-2.0, an S3 gateway over a
// directory), built by scripts/setup from the version tools/versitygw pins
// and cached like runsc, on a loopback port of its own with credentials of
// its own, one bucket per test, stopped and removed when the test binary's
// tests end (Around). No mock of S3: what the object store does against it
// is what it does against AWS.
//
// A machine without the binary skips the tests that need it, or fails them
// under CI=true (testenv.Missing).
package s3test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"loam.dev/loam/internal/testenv"
)

// Region is the servers' region.
const Region = "us-east-1"

// Server is a running versitygw.
type Server struct {
	// Endpoint is its URL (http://127.0.0.1:PORT); AccessKey and
	// SecretKey its root credentials.
	Endpoint             string
	AccessKey, SecretKey string

	bin, addr string
	dir       string
	buckets   atomic.Int64

	mu  sync.Mutex
	cmd *exec.Cmd // nil while stopped
}

var (
	shared     *Server
	sharedErr  error
	sharedOnce sync.Once
)

// Binary is the versitygw binary: $LOAM_VERSITYGW, else the one
// scripts/setup links; "" when neither is there.
func Binary() string {
	for _, p := range []string{os.Getenv("LOAM_VERSITYGW"), "/usr/local/bin/versitygw"} {
		if p == "" {
			continue
		}
		if info, err := os.Stat(p); err == nil && info.Mode().IsRegular() {
			return p
		}
	}
	return ""
}

// Around runs run (a package's tests) and then stops the server any of
// them started.
func Around(run func() int) int {
	code := run()
	if shared != nil {
		shared.stop()
	}
	return code
}

// Shared is the test binary's server, started on first use; tb ends
// (testenv.Missing) when the machine has no versitygw.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	bin := Binary()
	if bin == "" {
		testenv.Missing(tb, "needs versitygw, an S3 server (scripts/setup builds it)")
	}
	sharedOnce.Do(func() { shared, sharedErr = start(bin, "127.0.0.1:0") })
	if sharedErr != nil {
		tb.Fatalf("starting versitygw: %v", sharedErr)
	}
	return shared
}

// NewServer starts a server of tb's own listening on addr (host:port;
// port 0 picks a free one, kept across a Stop and Start): one that the
// nodes of a test reach from their own network namespaces (on the host's
// end of their links), and that the test may stop (Stop, Start). It has
// the shared server's credentials (one pair per test binary, in its AWS
// environment), and is stopped and removed when tb ends.
func NewServer(tb testing.TB, addr string) *Server {
	tb.Helper()
	bin := Binary()
	if bin == "" {
		testenv.Missing(tb, "needs versitygw, an S3 server (scripts/setup builds it)")
	}
	s, err := start(bin, addr)
	if err != nil {
		tb.Fatalf("starting versitygw on %s: %v", addr, err)
	}
	tb.Cleanup(s.stop)
	return s
}

// NewBucket makes an empty bucket on the shared server and returns the
// URL loam takes (--objects) for it, with prefix under it when prefix is
// not "". The server's credentials are in the process's AWS environment
// (Env) once it runs.
func NewBucket(tb testing.TB, prefix string) string {
	tb.Helper()
	return Shared(tb).NewBucket(tb, prefix)
}

// NewBucket makes an empty bucket on s, as the function NewBucket does on
// the shared server.
func (s *Server) NewBucket(tb testing.TB, prefix string) string {
	tb.Helper()
	name := fmt.Sprintf("t%d-%d", os.Getpid(), s.buckets.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		tb.Fatalf("making bucket %s: %v", name, err)
	}
	return s.URL(name, prefix)
}

// URL is the --objects URL of bucket on s.
func (s *Server) URL(bucket, prefix string) string {
	q := url.Values{"endpoint": {s.Endpoint}, "region": {Region}, "use_path_style": {"true"}}
	if prefix != "" {
		q.Set("prefix", prefix)
	}
	return "s3://" + bucket + "?" + q.Encode()
}

// Env is the environment a client of s needs (the AWS SDK's variables),
// for a daemon a test starts.
func (s *Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + s.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s.SecretKey, "AWS_REGION=" + Region}
}

// Client is an S3 client of s as its root user: for a test that reads or
// changes a bucket's objects behind loam's back.
func (s *Server) Client() *s3.Client {
	return s3.New(s3.Options{
		Region:       Region,
		BaseEndpoint: aws.String(s.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
	})
}

// creds are the servers' root credentials, one pair per test binary: the
// AWS environment the daemons inherit holds one.
var (
	credsOnce            sync.Once
	accessKey, secretKey string
)

// start runs versitygw over a new directory, on addr (port 0: a free one).
func start(bin, listen string) (*Server, error) {
	credsOnce.Do(func() { accessKey, secretKey = "loamtest"+randomHex(6), randomHex(20) })
	dir, err := os.MkdirTemp("", "loam-s3test-")
	if err != nil {
		return nil, err
	}
	for _, sub := range []string{"data", "meta"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	s := &Server{Endpoint: "http://" + addr, AccessKey: accessKey, SecretKey: secretKey, bin: bin, addr: addr, dir: dir}
	if err := s.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// Stop ends the server as an outage would (SIGKILL: its connections cut,
// nothing answers on its address), keeping its directory: what it
// stored is there again after Start. Stopping a stopped server does
// nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait() // its exit status after a kill says nothing more
	s.cmd = nil
}

// Start runs the server (again, after Stop) on its address, directory and
// credentials, and waits until it answers. Starting a running server does
// nothing.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	logPath := filepath.Join(s.dir, "log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	// Metadata in a sidecar directory: the test's directory need not
	// take extended attributes.
	cmd := exec.Command(s.bin, "--port", s.addr, "--region", Region, "posix", "--sidecar", filepath.Join(s.dir, "meta"), filepath.Join(s.dir, "data"))
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY_ID="+s.AccessKey, "ROOT_SECRET_ACCESS_KEY="+s.SecretKey)
	cmd.Stdout, cmd.Stderr = log, log
	// Killed with the test binary, if it dies first (see testenv.StartParked).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := testenv.StartParked(cmd); err != nil {
		return fmt.Errorf("starting %s: %w", s.bin, err)
	}
	s.cmd = cmd
	for _, kv := range s.Env() {
		k, v, _ := strings.Cut(kv, "=")
		os.Setenv(k, v)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := http.Get(s.Endpoint + "/")
		if err == nil {
			res.Body.Close()
			return nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			s.cmd = nil
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("versitygw does not answer on %s: %w\n%s", s.addr, err, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends the server and removes its directory.
func (s *Server) stop() {
	s.Stop()
	os.RemoveAll(s.dir)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
