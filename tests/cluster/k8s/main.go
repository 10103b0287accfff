// Command k8s is a hyperkube-style multi-call binary for the local test cluster:
// kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, etcd and the real nodes'
// kubelet, all built from the k8s.io/kubernetes module graph pinned in ../go.mod in one
// `go build` (the kubelet shares most of its packages with the others), plus two helpers of our own:
// gen-pki (certificates) and netns-forward (TCP forwarders listening inside network namespaces).
//
// The component is chosen by the name the binary is invoked as (a symlink such as
// "kubectl"), or else by the first argument: `k8s kube-apiserver --flags...`.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	_ "time/tzdata"

	"github.com/spf13/cobra"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func runCobra(newCommand func() *cobra.Command) int {
	return cli.Run(newCommand())
}

var commands = map[string]func() int{
	"kube-apiserver": func() int { return runCobra(apiserver.NewAPIServerCommand) },
	"kube-scheduler": func() int {
		return runCobra(func() *cobra.Command { return scheduler.NewSchedulerCommand() })
	},
	"kube-controller-manager": func() int { return runCobra(controllermanager.NewControllerManagerCommand) },
	"kubectl": func() int {
		command := kubectlcmd.NewDefaultKubectlCommand()
		if err := cli.RunNoErrOutput(command); err != nil {
			kubectlutil.CheckErr(err)
		}
		return 0
	},
	"kubelet": func() int {
		return runCobra(func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) })
	},
	"gen-pki":       genPKICommand,
	"netns-forward": netnsForwardCommand,
	"etcd": func() int {
		etcdmain.Main(os.Args)
		return 0
	},
}

func usage() {
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: k8s COMPONENT [flags]\ncomponents: %v\n", names)
}

func main() {
	name := filepath.Base(os.Args[0])
	run, ok := commands[name]
	if !ok {
		if len(os.Args) < 2 {
			usage()
			os.Exit(2)
		}
		name = os.Args[1]
		run, ok = commands[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "k8s: unknown component %q\n", name)
			usage()
			os.Exit(2)
		}
		// Make the component see itself as argv[0], with its own flags after it.
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	os.Exit(run())
}
