// portwise-node: the node half of a real single-node cluster for portwise's
// end-to-end tests (tests/node), built from the same k8s.io/kubernetes
// module as the control plane (tests/control-plane), so that both halves
// are one Kubernetes release and share the Go build cache.
//
//	portwise-node kubelet <kubelet flags>
//	portwise-node scheduler <kube-scheduler flags>
//
// It runs only inside a network namespace a test run made (tests/netns):
// the kubelet sets sysctls, iptables and cgroups of wherever it runs.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubeletapp "k8s.io/kubernetes/cmd/kubelet/app"

	// The registrations upstream's own main packages make.
	_ "time/tzdata"

	_ "k8s.io/client-go/plugin/pkg/client/auth"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
)

// runCobra runs an upstream command as if it were the whole program.
func runCobra(name string, args []string, command *cobra.Command) int {
	os.Args = append([]string{name}, args...)
	command.SetArgs(args)
	return cli.Run(command)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: portwise-node kubelet|scheduler [FLAGS...]")
		os.Exit(2)
	}
	sub, rest := os.Args[1], os.Args[2:]
	switch sub {
	case "kubelet":
		os.Exit(runCobra("kubelet", rest, kubeletapp.NewKubeletCommand(context.Background())))
	case "scheduler":
		os.Exit(runCobra("kube-scheduler", rest, schedulerapp.NewSchedulerCommand()))
	default:
		fmt.Fprintf(os.Stderr, "portwise-node: unknown subcommand %q (kubelet, scheduler)\n", sub)
		os.Exit(2)
	}
}
