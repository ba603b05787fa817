"""The control plane: Gateway API and Inference Extension resources in (files; Kubernetes next),
validated and translated into Envoy's configuration, served over xDS (ADS); the pool table handed to
the picker; ``/v1/models`` answered from the configuration and what the replicas report."""
