"""Following a Kubernetes cluster: Gateway API and Inference Extension resources, Services and Pods,
listed and watched (``client``: transport; ``informer``: the list/watch protocol; ``provider``: the
configuration snapshots the control plane applies)."""
