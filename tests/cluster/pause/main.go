// Command pause is the sandbox ("pause") container of the local cluster's real nodes: it holds
// a pod's namespaces and reaps orphans until it is told to stop. Kubernetes' own pause is C code
// published as an image, and no registry can be reached here, so this is its Go equivalent,
// built statically and packed into a one-file image by `cluster build`.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
