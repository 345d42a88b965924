"""swactor-membership: SWIM gossip membership and failure detection for one host (spec §8-9).

Files, one concern each:
  config.py    MembershipConfig, the [membership] table of the host config
  metadata.py  LocalMetadata and its encoding into gossiped tags
  gpus.py      GPU inventory from flags or nvidia-smi
  swim.py      the SWIM engine interface (SwimBackend) and its values
  kinship_backend.py  the engine: PyPI `kinship` (SWIM + Lifeguard on its own Rust thread)
  view.py      MemberView, the I/O-free member table that turns engine events into watch events
  service.py   the gRPC servicer (GetSelf, ListMembers, WatchMembers, SetLocalState)
  node.py      MembershipNode: engine + view + join retries + watchers, the asyncio glue
  main.py      CLI entry point `swactor-membership`
  client.py    MembershipClient, the asyncio client other local services use

The cluster secret and the gossip key derived from it: swactor.common.secret.
"""
