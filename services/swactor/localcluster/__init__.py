"""A local swactor pool on one machine: N simulated hosts, each with its own services (membership,
arena-manager, edge-driver, worker) and state/run dirs, plus the orchestrator on host 0.

    with LocalCluster(ClusterSpec(hosts=3)) as cluster:
        stub = cluster.orchestrator_stub()
"""

from swactor.localcluster.cluster import ClusterError, ClusterSpec, LocalCluster

__all__ = ["ClusterError", "ClusterSpec", "LocalCluster"]
