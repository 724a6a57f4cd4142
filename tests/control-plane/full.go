//go:build !portwise_demo

package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
	cmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

// The full build, for the test suite: the native controllers (the
// reference portwise is compared with) and kubectl. The demo's build
// (tag portwise_demo, demo.go) leaves both out.

func runControllerManager(args []string) int {
	return runCobra("kube-controller-manager", args, cmapp.NewControllerManagerCommand())
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
