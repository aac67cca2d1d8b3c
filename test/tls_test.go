package test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"loam.dev/loam/api"
	"loam.dev/loam/test/harness"
)

// selfSigned writes a self-signed certificate for 127.0.0.1 and localhost,
// and its key, as PEM files in a temporary dir, and gives the pool that
// trusts it.
func selfSigned(t *testing.T) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "loam test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:    []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots = x509.NewCertPool()
	roots.AddCert(cert)
	return certFile, keyFile, roots
}

// TestTLS: a daemon given --tls-cert and --tls-key serves its API (calls,
// exec WebSockets, the CLI) over HTTPS only, and loam mcp --listen with
// them serves MCP over HTTPS, reaching that daemon over HTTPS too.
func TestTLS(t *testing.T) {
	t.Parallel()
	certFile, keyFile, roots := selfSigned(t)
	dataDir, err := os.MkdirTemp("", "loam-e2e-tls-")
	if err != nil {
		t.Fatal(err)
	}
	d := &harness.Daemon{T: t, DataDir: dataDir, Subnet: harness.NextSubnet(), Roots: roots}
	d.Start("--tls-cert", certFile, "--tls-key", keyFile)
	t.Cleanup(func() { d.Destroy() })
	ctx := harness.Ctx(t)
	if !strings.HasPrefix(d.URL, "https://") {
		t.Fatalf("the daemon with a certificate serves at %s, want https://", d.URL)
	}
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "secure"}); err != nil {
		t.Fatal(err)
	}
	if got := d.Run("secure", "echo", "over tls"); got != "over tls\n" {
		t.Errorf("exec over TLS: %q", got)
	}
	u, _ := url.Parse(d.URL)
	if resp, err := http.Get("http://" + u.Host + "/v1/sandboxes"); err == nil {
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Errorf("plain HTTP to the TLS listener: %d, want a refusal", resp.StatusCode)
		}
	}
	if _, err := http.Get(d.URL + "/healthz"); err == nil {
		t.Error("a client that does not trust the certificate reached the daemon")
	}

	// The CLI trusts the certificate through SSL_CERT_FILE, as Go's TLS
	// stack reads it on Linux.
	env := append(os.Environ(), "LOAM_API_URL="+d.URL, "LOAM_TOKEN="+d.Token, "SSL_CERT_FILE="+certFile)
	ls := exec.Command(harness.LoamBin, "ls")
	ls.Env = env
	if out, err := ls.CombinedOutput(); err != nil || !strings.Contains(string(out), "secure") {
		t.Errorf("loam ls over TLS: %v %s", err, out)
	}

	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	mcp := exec.CommandContext(mctx, harness.LoamBin, "mcp", "--listen", "127.0.0.1:0", "--tls-cert", certFile, "--tls-key", keyFile)
	mcp.Env = env
	log := &harness.SyncBuffer{}
	mcp.Stdout, mcp.Stderr = io.Discard, log
	if err := mcp.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = mcp.Wait()
	})
	endpoint := mcpEndpoint(t, log, "https")
	if strings.Contains(log.String(), "plain HTTP") {
		t.Errorf("loam mcp with a certificate warns of plain HTTP:\n%s", log)
	}
	tr := d.HTTPClient().Transport.(*http.Transport)
	hc := &http.Client{Transport: tlsBearer{token: d.Token, base: tr}}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "loam-test", Version: "0"}, nil).
		Connect(mctx, &sdk.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("connecting to MCP over TLS: %v\n%s", err, log)
	}
	defer cs.Close()
	res, err := cs.CallTool(mctx, &sdk.CallToolParams{Name: "run_command", Arguments: map[string]any{"sandbox": "secure", "command": "echo through mcp"}})
	if err != nil || res.IsError || !strings.Contains(resultText(res), "through mcp") {
		t.Errorf("run_command over MCP over TLS: %v %s", err, resultText(res))
	}
	plain := strings.Replace(endpoint, "https://", "http://", 1)
	if resp, err := http.Post(plain, "application/json", strings.NewReader("{}")); err == nil {
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Errorf("plain HTTP to loam mcp's TLS listener: %d, want a refusal", resp.StatusCode)
		}
	}

	// The flags go together, and with --listen only.
	for _, args := range [][]string{
		{"mcp", "--listen", "127.0.0.1:0", "--tls-cert", certFile},
		{"mcp", "--tls-cert", certFile, "--tls-key", keyFile},
	} {
		bad := exec.Command(harness.LoamBin, args...)
		bad.Env = env
		out, err := bad.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "--tls-cert") {
			t.Errorf("loam %v: %v %s; want an error naming --tls-cert", args, err, out)
		}
	}
}

// tlsBearer adds the API token to every request, over base.
type tlsBearer struct {
	token string
	base  *http.Transport
}

func (b tlsBearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}
