//go:build portwise_demo

package main

import (
	"fmt"
	"os"
)

// The demo's build (tests/control-plane/build --demo): the apiserver and
// kube-proxy, which is all ./demo starts. Leaving out the controller
// manager and kubectl cuts a cold build by about a third.

func notInThisBuild(what string) int {
	fmt.Fprintf(os.Stderr, "portwise-cp: %s is not in the demo build; tests/control-plane/build (no --demo) builds it\n", what)
	return 2
}

func runControllerManager([]string) int { return notInThisBuild("kube-controller-manager") }

func runKubectl([]string) int { return notInThisBuild("kubectl") }
