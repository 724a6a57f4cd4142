package main

import (
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	apiapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
)

// etcdFlags are the apiserver subcommand's own flags; everything else is
// passed to kube-apiserver untouched.
type etcdFlags struct {
	dataDir, clientURL, peerURL, logFile string
}

func splitEtcdFlags(args []string) (etcdFlags, []string, error) {
	var f etcdFlags
	targets := map[string]*string{
		"--embedded-etcd-data-dir":   &f.dataDir,
		"--embedded-etcd-client-url": &f.clientURL,
		"--embedded-etcd-peer-url":   &f.peerURL,
		"--embedded-etcd-log":        &f.logFile,
	}
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, value, hasValue := strings.Cut(a, "=")
		dst, ok := targets[name]
		if !ok {
			rest = append(rest, a)
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				return f, nil, fmt.Errorf("%s needs a value", name)
			}
			i++
			value = args[i]
		}
		*dst = value
	}
	if f.dataDir == "" || f.clientURL == "" || f.peerURL == "" {
		return f, nil, fmt.Errorf("--embedded-etcd-data-dir, --embedded-etcd-client-url and --embedded-etcd-peer-url are required")
	}
	return f, rest, nil
}

// startEtcd runs a single-member etcd inside this process. It is the version
// k8s.io/kubernetes pins, so the apiserver gets the etcd features it expects
// (watch progress requests, which streaming lists depend on).
func startEtcd(f etcdFlags) (*embed.Etcd, error) {
	cu, err := url.Parse(f.clientURL)
	if err != nil {
		return nil, fmt.Errorf("client url: %w", err)
	}
	pu, err := url.Parse(f.peerURL)
	if err != nil {
		return nil, fmt.Errorf("peer url: %w", err)
	}
	cfg := embed.NewConfig()
	cfg.Name = "portwise"
	cfg.Dir = f.dataDir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// Test data is disposable: losing it on a crash is fine, fsync latency
	// on a shared disk is not.
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "warn"
	if f.logFile != "" {
		cfg.LogOutputs = []string{f.logFile}
	} else {
		cfg.LogOutputs = []string{"stderr"}
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd failed: %w", err)
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("etcd not ready after 60s")
	}
}

func runAPIServer(args []string) int {
	f, rest, err := splitEtcdFlags(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "portwise-cp apiserver: %v\n", err)
		return 2
	}
	e, err := startEtcd(f)
	if err != nil {
		fmt.Fprintf(os.Stderr, "portwise-cp apiserver: embedded etcd: %v\n", err)
		return 1
	}
	// If etcd dies under a running apiserver there is nothing to recover:
	// exit so that the failure is visible instead of a hung apiserver.
	go func() {
		if err, ok := <-e.Err(); ok && err != nil {
			fmt.Fprintf(os.Stderr, "portwise-cp apiserver: embedded etcd stopped: %v\n", err)
			os.Exit(1)
		}
	}()
	hasEtcdServers := false
	for _, a := range rest {
		if a == "--etcd-servers" || strings.HasPrefix(a, "--etcd-servers=") {
			hasEtcdServers = true
		}
	}
	if !hasEtcdServers {
		rest = append([]string{"--etcd-servers=" + f.clientURL}, rest...)
	}
	code := runCobra("kube-apiserver", rest, apiapp.NewAPIServerCommand())
	e.Close()
	return code
}
