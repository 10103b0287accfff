// Command coredns is CoreDNS with only the plugins the local cluster needs: the kubernetes
// plugin serving cluster.local (Services, headless-Service pod names) from the API server,
// plus errors, log, health, ready and cache. No forwarding: nothing outside the cluster is
// resolved, because pods here must not reach anything outside the namespaces we create.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order in which the plugins handle a query (a subset of CoreDNS's own order in
// core/dnsserver/zdirectives.go).
var directives = []string{"ready", "health", "errors", "log", "cache", "kubernetes"}

func main() {
	dnsserver.Directives = directives
	coremain.Run()
}
