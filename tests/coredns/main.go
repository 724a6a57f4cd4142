// portwise-coredns: upstream CoreDNS with only the plugins the tests use,
// the way CoreDNS documents custom builds (plugin.cfg): each plugin
// registers itself on import, and the server orders them by its own fixed
// directive list, so the kubernetes plugin behaves exactly as in a stock
// build. Leaving out the cloud-provider plugins (route53, azure, clouddns,
// ...) keeps the cold build to a fraction of the full binary's.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// Plugins, as a Corefile for the tests names them.
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	// Referenced so the directive list (and with it the plugin order) is
	// the one this CoreDNS release ships.
	_ = dnsserver.Directives
	coremain.Run()
}
