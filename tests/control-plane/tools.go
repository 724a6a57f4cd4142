package main

// Small helpers for the start script, so that a fresh machine needs no
// openssl, curl or python to run the control plane.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/component-base/version"
)

func printVersion() {
	fmt.Println(version.Get().GitVersion)
}

// runFreePorts prints n distinct free loopback TCP ports, one a line. With
// --prefer P, P comes first when it is free.
func runFreePorts(args []string) int {
	fs := flag.NewFlagSet("free-ports", flag.ContinueOnError)
	prefer := fs.Int("prefer", 0, "port to use first if it is free")
	host := fs.String("host", "127.0.0.1", "address to probe")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	n := 1
	if fs.NArg() > 0 {
		v, err := strconv.Atoi(fs.Arg(0))
		if err != nil || v < 1 {
			fmt.Fprintln(os.Stderr, "free-ports: N must be a positive integer")
			return 2
		}
		n = v
	}
	// Hold every listener until all are chosen so the ports are distinct.
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	var ports []int
	if *prefer > 0 {
		if l, err := net.Listen("tcp", net.JoinHostPort(*host, strconv.Itoa(*prefer))); err == nil {
			held = append(held, l)
			ports = append(ports, *prefer)
		}
	}
	for len(ports) < n {
		l, err := net.Listen("tcp", net.JoinHostPort(*host, "0"))
		if err != nil {
			fmt.Fprintf(os.Stderr, "free-ports: %v\n", err)
			return 1
		}
		held = append(held, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, p := range ports {
		fmt.Println(p)
	}
	return 0
}

// runProbe GETs an HTTPS URL once and exits 0 on 200, printing the body.
func runProbe(args []string) int {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	ca := fs.String("ca", "", "CA bundle (default: do not verify)")
	cert := fs.String("cert", "", "client certificate")
	key := fs.String("key", "", "client key")
	timeout := fs.Duration("timeout", 5*time.Second, "request timeout")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: probe [--ca F] [--cert F --key F] URL")
		return 2
	}
	tlsCfg := &tls.Config{}
	if *ca != "" {
		pemBytes, err := os.ReadFile(*ca)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pemBytes)
		tlsCfg.RootCAs = pool
	} else {
		tlsCfg.InsecureSkipVerify = true
	}
	if *cert != "" {
		kp, err := tls.LoadX509KeyPair(*cert, *key)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		tlsCfg.Certificates = []tls.Certificate{kp}
	}
	client := &http.Client{Timeout: *timeout, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	resp, err := client.Get(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	os.Stdout.Write(body)
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(os.Stderr, "\nprobe: HTTP %d\n", resp.StatusCode)
		return 1
	}
	return 0
}

// runPKI writes everything the control plane needs to trust itself:
//
//	ca.crt ca.key                    cluster CA (client and serving)
//	apiserver.crt apiserver.key      serving cert for 127.0.0.1, ::1, localhost, 10.96.0.1, kubernetes.default...
//	admin.crt admin.key              CN=portwise-admin, O=system:masters
//	controller-manager.crt/.key      CN=system:kube-controller-manager, O=system:masters
//	sa.key sa.pub                    service-account signing key pair (RSA)
//
// Existing files are kept, so restarting on the same DIR keeps its identity.
func runPKI(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: pki DIR")
		return 2
	}
	if err := writePKI(args[0]); err != nil {
		fmt.Fprintf(os.Stderr, "pki: %v\n", err)
		return 1
	}
	return 0
}

func writePKI(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	if _, err := os.Stat(p("sa.pub")); err == nil {
		return nil
	}
	now := time.Now().Add(-time.Hour)
	notAfter := now.Add(10 * 365 * 24 * time.Hour)

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "portwise-test-ca"},
		NotBefore:             now,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := writeCert(p("ca.crt"), caDER); err != nil {
		return err
	}
	if err := writeKey(p("ca.key"), caKey); err != nil {
		return err
	}

	leaf := func(name string, tmpl *x509.Certificate) error {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl.SerialNumber = serial()
		tmpl.NotBefore = now
		tmpl.NotAfter = notAfter
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.BasicConstraintsValid = true
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			return err
		}
		if err := writeCert(p(name+".crt"), der); err != nil {
			return err
		}
		return writeKey(p(name+".key"), k)
	}
	if err := leaf("apiserver", &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default",
			"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"),
			net.ParseIP("10.96.0.1"), net.ParseIP("fd00:10:96::1")},
	}); err != nil {
		return err
	}
	if err := leaf("admin", &x509.Certificate{
		Subject:     pkix.Name{CommonName: "portwise-admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return err
	}
	if err := leaf("controller-manager", &x509.Certificate{
		Subject:     pkix.Name{CommonName: "system:kube-controller-manager", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return err
	}

	// Service-account tokens: RSA, the algorithm every verifier accepts.
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	if err := writeKey(p("sa.key"), saKey); err != nil {
		return err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	// sa.pub last: its presence marks a complete PKI directory.
	return os.WriteFile(p("sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(err)
	}
	return n
}

func writeCert(path string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// writeKey writes PKCS#8, which client-go, openssl and rustls all read.
func writeKey(path string, key any) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if der == nil {
		return errors.New("empty key")
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}

// runClientCert signs a client certificate with the PKI directory's CA:
//
//	client-cert PKI_DIR NAME CN [ORG...]   writes PKI_DIR/NAME.crt and NAME.key
//
// tests/node/start uses it for the kubelet (CN=system:node:NODE,
// O=system:nodes: the Node authorizer and NodeRestriction know it by that).
// An existing pair is kept, like pki's.
func runClientCert(args []string) int {
	if len(args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: client-cert PKI_DIR NAME CN [ORG...]")
		return 2
	}
	dir, name, cn, orgs := args[0], args[1], args[2], args[3:]
	p := func(f string) string { return filepath.Join(dir, f) }
	if _, err := os.Stat(p(name + ".key")); err == nil {
		return 0
	}
	if err := signClientCert(p, name, cn, orgs); err != nil {
		fmt.Fprintf(os.Stderr, "client-cert: %v\n", err)
		return 1
	}
	return 0
}

func signClientCert(p func(string) string, name, cn string, orgs []string) error {
	caPair, err := tls.LoadX509KeyPair(p("ca.crt"), p("ca.key"))
	if err != nil {
		return fmt.Errorf("reading the CA (run pki first): %w", err)
	}
	caCert, err := x509.ParseCertificate(caPair.Certificate[0])
	if err != nil {
		return err
	}
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now().Add(-time.Hour)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:             now,
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caPair.PrivateKey)
	if err != nil {
		return err
	}
	if err := writeCert(p(name+".crt"), der); err != nil {
		return err
	}
	return writeKey(p(name+".key"), k)
}
