package main

import (
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
	cmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
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

func runControllerManager(args []string) int {
	return runCobra("kube-controller-manager", args, cmapp.NewControllerManagerCommand())
}

// runKubeProxy runs upstream kube-proxy, so that the suite can prove what a
// real data path does with portwise's slices. It must only ever run inside a
// network namespace the test run made: it rewrites nftables/iptables rules
// and conntrack sysctls of whatever namespace it is in.
func runKubeProxy(args []string) int {
	return runCobra("kube-proxy", args, proxyapp.NewProxyCommand())
}

func runKubectl(args []string) int {
	// kubectl looks for plugins and its verbosity in os.Args before cobra
	// parses anything, so os.Args must already look like kubectl's.
	os.Args = append([]string{"kubectl"}, args...)
	logs.GlogSetter(cmd.GetLogVerbosity(os.Args)) // nolint:errcheck
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
		return 1
	}
	return 0
}
