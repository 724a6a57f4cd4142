// portwise-cp: one binary holding the parts of a Kubernetes control plane that
// portwise's tests need, built from upstream's own packages so that the API
// server the tests talk to is the real one (same validation, same storage,
// same endpointslice controller), with nothing downloaded at run time.
//
//	portwise-cp apiserver [--embedded-etcd-*] <kube-apiserver flags>
//	portwise-cp controller-manager <kube-controller-manager flags>
//	portwise-cp kube-proxy <kube-proxy flags>   (only inside a test network namespace)
//	portwise-cp kubectl <kubectl args>   (also when invoked as "kubectl")
package main

import (
	"fmt"
	"os"
	"path/filepath"
)

func usage() {
	fmt.Fprintf(os.Stderr, `usage: %s SUBCOMMAND [ARGS...]

subcommands:
  apiserver           embedded etcd + kube-apiserver (see --embedded-etcd-* below)
  controller-manager  kube-controller-manager
  kube-proxy          kube-proxy (only inside a test network namespace)
  kubectl             kubectl
  version             print the Kubernetes version this binary was built from
  pki DIR             write CA, serving/client certs and service-account key into DIR
  client-cert PKI_DIR NAME CN [ORG...]   sign a client cert with DIR's CA
  free-ports [--prefer P] N   print N free loopback TCP ports
  probe [--ca F] [--cert F --key F] URL   GET URL, exit 0 on HTTP 200

apiserver's own flags (all other flags go to kube-apiserver):
  --embedded-etcd-data-dir=DIR     etcd data directory (required)
  --embedded-etcd-client-url=URL   e.g. http://127.0.0.1:2379 (required)
  --embedded-etcd-peer-url=URL     e.g. http://127.0.0.1:2380 (required)
  --embedded-etcd-log=FILE         etcd's own log (default: stderr)
`, filepath.Base(os.Args[0]))
}

func main() {
	// Busybox style: a symlink named kubectl behaves as kubectl.
	if filepath.Base(os.Args[0]) == "kubectl" {
		os.Exit(runKubectl(os.Args[1:]))
	}
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	sub, rest := os.Args[1], os.Args[2:]
	switch sub {
	case "apiserver":
		os.Exit(runAPIServer(rest))
	case "controller-manager":
		os.Exit(runControllerManager(rest))
	case "kube-proxy":
		os.Exit(runKubeProxy(rest))
	case "kubectl":
		os.Exit(runKubectl(rest))
	case "version":
		printVersion()
	case "pki":
		os.Exit(runPKI(rest))
	case "client-cert":
		os.Exit(runClientCert(rest))
	case "free-ports":
		os.Exit(runFreePorts(rest))
	case "probe":
		os.Exit(runProbe(rest))
	case "-h", "--help", "help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "unknown subcommand %q\n", sub)
		usage()
		os.Exit(2)
	}
}
