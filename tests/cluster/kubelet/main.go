// Command kubelet is the kubelet of the real nodes (`cluster up --real-nodes N`), built from the
// same k8s.io/kubernetes module graph as the control plane (../go.mod). It is a binary of its
// own, built only when real nodes are asked for: its packages would add many minutes to every
// cold build of the control plane, which most tests use without it.
package main

import (
	"context"
	"os"

	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(kubelet.NewKubeletCommand(context.Background())))
}
