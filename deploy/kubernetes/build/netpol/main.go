// Command netpol enforces NetworkPolicy on the trial cluster of
// cluster.sh: the plain bridge plugin there does not. It runs
// sigs.k8s.io/kube-network-policies (the reference implementation kept
// by SIG Network) on the node, against the API through a kubeconfig
// rather than a DaemonSet's service account. It decides the packets
// that reach its nfqueue: cluster.sh sends there every new IPv4
// connection a Pod opens (the library's own nftables rules, which would
// send those of Pods a policy selects, do not load on kernels without
// nftables' queue expression).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the node's kubeconfig")
	node := flag.String("node", "", "the node's name")
	queue := flag.Int("nfqueue-id", 100, "the nfqueue that new connections go through")
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(*kubeconfig, *node, *queue); err != nil {
		fmt.Fprintln(os.Stderr, "netpol:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, node string, queue int) error {
	if kubeconfig == "" || node == "" {
		return fmt.Errorf("-kubeconfig and -node are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	ctl, err := networkpolicy.NewController(client,
		factory.Networking().V1().NetworkPolicies(),
		factory.Core().V1().Namespaces(),
		factory.Core().V1().Pods(),
		nil, nil, nil, nil,
		networkpolicy.Config{
			// Closed when the controller is not there to decide.
			FailOpen: false,
			QueueID:  queue,
			NodeName: node,
			// NRI stays on although containerd 1.6 has none (Pod
			// addresses come from the API): v0.8.0 asks the NRI plugin
			// about every address that is no Pod's, and with NRI disabled
			// that plugin is nil and the controller panics (measured).
			// Without a runtime to talk to, the plugin just knows nothing.
		})
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- ctl.Run(ctx) }()
	factory.Start(ctx.Done())
	select {
	case <-ctx.Done():
		<-errc
		return nil
	case err := <-errc:
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("controller: %w", err)
	}
}
