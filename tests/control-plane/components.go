package main

import (
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	proxyapp "k8s.io/kubernetes/cmd/kube-proxy/app"

	// Registrations upstream's own main packages make; without them the
	// binaries would differ from upstream's (log formats, client-go and
	// version metrics, client auth plugins, time zones for CronJob).
	_ "time/tzdata"

	_ "k8s.io/client-go/plugin/pkg/client/auth"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
)

// runCobra runs an upstream command as if it were the whole program: cobra
// reads os.Args[1:], so os.Args is rewritten to the command's own view.
func runCobra(name string, args []string, command *cobra.Command) int {
	os.Args = append([]string{name}, args...)
	command.SetArgs(args)
	return cli.Run(command)
}

// runKubeProxy runs upstream kube-proxy, so that the suite can prove what a
// real data path does with portwise's slices. It must only ever run inside a
// network namespace the test run made: it rewrites nftables/iptables rules
// and conntrack sysctls of whatever namespace it is in.
func runKubeProxy(args []string) int {
	return runCobra("kube-proxy", args, proxyapp.NewProxyCommand())
}
