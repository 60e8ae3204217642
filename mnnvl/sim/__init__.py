"""Simulated Kubernetes cluster (API server, ComputeDomain driver, Jobs, kubelet)."""

from mnnvl.sim.cluster import SimCluster, serve

__all__ = ["SimCluster", "serve"]
