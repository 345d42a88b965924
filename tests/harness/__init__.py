"""Shared multi-host test harness: each host in its own Linux network namespace on one bridge.

Used by the membership, edge-driver and system tests. See `netns.py` for the API.
"""

from .netns import Host, NetnsCluster, NetnsError, cleanup_stale, netns_unavailable_reason

__all__ = ["Host", "NetnsCluster", "NetnsError", "cleanup_stale", "netns_unavailable_reason"]
