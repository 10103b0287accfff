package main

// gen-pki: the certificates and keys of a local test cluster, so the driver needs no openssl.
//
//	k8s gen-pki DIR
//
// writes into DIR (mode 0600 for keys):
//
//	ca.crt, ca.key            the cluster CA (client CA of the apiserver, CA of the kubeconfig)
//	serving.crt, serving.key  a serving certificate for 127.0.0.1/localhost/kubernetes.default...
//	admin.crt, admin.key      a client certificate CN=admin, O=system:masters
//	sa.key, sa.pub            the service-account signing key pair (RSA)
//
// Existing files are left alone, so the command is idempotent.

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

const validity = 10 * 365 * 24 * time.Hour

func writePEM(path, kind string, der []byte, mode os.FileMode) error {
	data := pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
	return os.WriteFile(path, data, mode)
}

func newKey() (*rsa.PrivateKey, error) { return rsa.GenerateKey(rand.Reader, 2048) }

func writeKey(path string, key *rsa.PrivateKey) error {
	return writePEM(path, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key), 0o600)
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
}

func sign(tmpl, parent *x509.Certificate, pub crypto.PublicKey, signer crypto.Signer) ([]byte, error) {
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = sn
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(validity)
	if parent == nil {
		parent = tmpl
	}
	return x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
}

func genPKI(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	if _, err := os.Stat(p("sa.pub")); err == nil {
		return nil // already generated
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}

	caKey, err := newKey()
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "megatron-operator-test-ca"},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := sign(caTmpl, nil, caKey.Public(), caKey)
	if err != nil {
		return err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}

	leaf := func(name string, tmpl *x509.Certificate) error {
		key, err := newKey()
		if err != nil {
			return err
		}
		der, err := sign(tmpl, caCert, key.Public(), caKey)
		if err != nil {
			return err
		}
		if err := writeKey(p(name+".key"), key); err != nil {
			return err
		}
		return writePEM(p(name+".crt"), "CERTIFICATE", der, 0o644)
	}

	if err := leaf("serving", &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{
			"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local",
		},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")},
	}); err != nil {
		return err
	}
	if err := leaf("admin", &x509.Certificate{
		Subject:     pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return err
	}

	saKey, err := newKey()
	if err != nil {
		return err
	}
	saPub, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return err
	}
	if err := writeKey(p("sa.key"), saKey); err != nil {
		return err
	}
	if err := writeKey(p("ca.key"), caKey); err != nil {
		return err
	}
	if err := writePEM(p("ca.crt"), "CERTIFICATE", caDER, 0o644); err != nil {
		return err
	}
	// sa.pub last: its presence marks a complete set.
	return writePEM(p("sa.pub"), "PUBLIC KEY", saPub, 0o644)
}

func genPKICommand() int {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: k8s gen-pki DIR")
		return 2
	}
	if err := genPKI(os.Args[1]); err != nil {
		fmt.Fprintf(os.Stderr, "gen-pki: %v\n", err)
		return 1
	}
	return 0
}
