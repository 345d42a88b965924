"""A local swactor pool on one machine: N simulated hosts, each with its own services (membership,
arena-manager, edge-driver, worker) and state/run dirs, plus the orchestrator on host 0.

    with LocalCluster(ClusterSpec(hosts=3)) as cluster:
        stub = cluster.orchestrator_stub()

  cluster   LocalCluster: bring up the hosts, wait for the pool, tear it all down
  layout    each host's dirs, sockets, ports and swactor.toml (pure)
  procs     service processes, each in its own session      ready    readiness evidence, polled
  netns     hosts in network namespaces (root only)          signals  SIGTERM/SIGHUP for the foreground programs
  reaper    removes the pool when its owner dies             owned    what the reaper removes (pure)
  lifeline  the owner's pipe to its reaper
  linkconditions  delay, jitter, loss and rate between hosts (pure)
  linkshaping     applies them in the hosts' namespaces: an iptables chain and a delayer per host
  linkdelay       the delayer process                     linkschedule  when each held packet goes (pure)
  nfqueue         one NFQUEUE queue over raw netlink
  run       submit one run and follow it, timing what the client sees
  __main__  `python -m swactor.localcluster`: bring up a pool and print how to reach it
"""

from swactor.localcluster.cluster import ClusterError, ClusterSpec, LocalCluster

__all__ = ["ClusterError", "ClusterSpec", "LocalCluster"]
