package tlsconfig

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// pair writes a self-signed certificate and its key as PEM files.
func pair(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "loam test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func TestLoad(t *testing.T) {
	if c, err := Load("", ""); c != nil || err != nil {
		t.Errorf("Load with neither file: %v, %v; want nil, nil", c, err)
	}
	cert, key := pair(t)
	if _, err := Load(cert, ""); err == nil {
		t.Error("Load with a certificate and no key: no error")
	}
	if _, err := Load("", key); err == nil {
		t.Error("Load with a key and no certificate: no error")
	}
	c, err := Load(cert, key)
	if err != nil || c == nil || len(c.Certificates) != 1 {
		t.Fatalf("Load of a good pair: %v, %v; want one certificate", c, err)
	}
	if _, err := Load(key, cert); err == nil {
		t.Error("Load with the files swapped: no error")
	}
}
