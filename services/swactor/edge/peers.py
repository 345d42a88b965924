"""PeerDirectory: per peer node_id, its edge endpoint and certificate fingerprint.

Two implementations:
* StaticPeerDirectory reads a TOML file (tests, local demo) and re-reads it when it changes:

      [[peer]]
      node_id = 17
      endpoint = "10.77.3.2:7400"
      fingerprint = "<lowercase hex sha-256 of the certificate DER>"

* MembershipPeerDirectory follows the local membership service (WatchMembers on its Unix
  socket) and publishes this driver's own endpoint and fingerprint with SetLocalState.
"""

from __future__ import annotations

import asyncio
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc

from swactor.common.aio import cancel_and_wait
from swactor.common.events import get_logger
from swactor.common.grpcio import unix_target

log = get_logger(component="COMPONENT_EDGE_DRIVER")


@dataclass(frozen=True)
class PeerInfo:
    node_id: int
    endpoint: str  # host:port of the peer's QUIC edge endpoint
    fingerprint: str  # lowercase hex SHA-256 of its certificate DER


class PeerDirectory(Protocol):
    def lookup(self, node_id: int) -> PeerInfo | None: ...

    def by_fingerprint(self, fingerprint: str) -> PeerInfo | None: ...

    def is_member_host(self, host: str) -> bool:
        """Whether `host` (an IP literal) is the address of a member's edge endpoint (admission.py:
        members skip Retry). Called per new-connection datagram: a set lookup, never I/O."""
        ...

    def member_hosts(self) -> frozenset[str]:
        """Every member's edge endpoint host (the kernel flood filter lets them through)."""
        ...

    async def start(self, *, self_endpoint: str, self_fingerprint: str) -> None: ...

    async def close(self) -> None: ...


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """host:port (IPv6 as [addr]:port) -> (host, port); ValueError naming the bad endpoint."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"endpoint {endpoint!r} is not host:port")
    return host.strip("[]"), int(port)


def _host(endpoint: str) -> str:
    try:
        return parse_endpoint(endpoint)[0]
    except ValueError:
        return ""


class _Table:
    def __init__(self) -> None:
        self.by_id: dict[int, PeerInfo] = {}
        self.by_fp: dict[str, PeerInfo] = {}
        self.hosts: dict[str, int] = {}  # endpoint host -> members there (several share one in tests)

    def replace(self, peers: list[PeerInfo]) -> None:
        self.by_id, self.by_fp, self.hosts = {}, {}, {}
        for p in peers:
            self.put(p)

    def put(self, peer: PeerInfo) -> None:
        self.remove(peer.node_id)
        self.by_id[peer.node_id] = peer
        if peer.fingerprint:
            self.by_fp[peer.fingerprint] = peer
        host = _host(peer.endpoint)
        self.hosts[host] = self.hosts.get(host, 0) + 1

    def remove(self, node_id: int) -> None:
        old = self.by_id.pop(node_id, None)
        if old is not None:
            self.by_fp.pop(old.fingerprint, None)
            host = _host(old.endpoint)
            if self.hosts.get(host, 0) <= 1:
                self.hosts.pop(host, None)
            else:
                self.hosts[host] -= 1


def load_peers_file(path: Path) -> list[PeerInfo]:
    try:
        with path.open("rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"peers file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"peers file {path}: {e}") from None
    peers: list[PeerInfo] = []
    for i, entry in enumerate(doc.get("peer", [])):
        try:
            node_id = int(entry["node_id"])
            endpoint = str(entry["endpoint"])
            fp = str(entry["fingerprint"]).lower()
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"peers file {path}: [[peer]] #{i} needs node_id, endpoint, fingerprint ({e})") from None
        parse_endpoint(endpoint)
        if len(fp) != 64 or any(c not in "0123456789abcdef" for c in fp):
            raise ValueError(f"peers file {path}: [[peer]] #{i} fingerprint is not 64 hex digits")
        peers.append(PeerInfo(node_id, endpoint, fp))
    return peers


class StaticPeerDirectory:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._table = _Table()
        self._mtime: float | None = None
        self._hosts_checked = float("-inf")
        self._refresh()

    def _refresh(self) -> None:
        try:
            mtime = self._path.stat().st_mtime
        except FileNotFoundError:
            return
        if mtime != self._mtime:
            self._table.replace(load_peers_file(self._path))
            self._mtime = mtime

    def lookup(self, node_id: int) -> PeerInfo | None:
        return self._find("by_id", node_id)

    def by_fingerprint(self, fingerprint: str) -> PeerInfo | None:
        return self._find("by_fp", fingerprint)

    def member_hosts(self) -> frozenset[str]:
        return frozenset(self._table.hosts)

    def is_member_host(self, host: str) -> bool:
        if host in self._table.hosts:
            return True
        # This runs per unknown datagram: a changed file is looked for at most once a second.
        now = time.monotonic()
        if now - self._hosts_checked >= 1.0:
            self._hosts_checked = now
            self._refresh()
        return host in self._table.hosts

    def _find(self, index: str, key: object) -> PeerInfo | None:
        """From the table, or after re-reading a changed file (a peer added since)."""
        peer = getattr(self._table, index).get(key)
        if peer is None:
            self._refresh()
            peer = getattr(self._table, index).get(key)
        return peer  # type: ignore[no-any-return]

    async def start(self, *, self_endpoint: str, self_fingerprint: str) -> None:
        return None

    async def close(self) -> None:
        return None


class MembershipPeerDirectory:
    """Follows WatchMembers; dead or departed members are dropped (their connections refused)."""

    def __init__(self, socket_path: Path) -> None:
        self._socket = socket_path
        self._table = _Table()
        self._channel: grpc.aio.Channel | None = None
        self._task: asyncio.Task[None] | None = None

    def lookup(self, node_id: int) -> PeerInfo | None:
        return self._table.by_id.get(node_id)

    def by_fingerprint(self, fingerprint: str) -> PeerInfo | None:
        return self._table.by_fp.get(fingerprint)

    def is_member_host(self, host: str) -> bool:
        return host in self._table.hosts

    def member_hosts(self) -> frozenset[str]:
        return frozenset(self._table.hosts)

    async def start(self, *, self_endpoint: str, self_fingerprint: str) -> None:
        from swactor.v1 import membership_pb2, membership_pb2_grpc

        self._channel = grpc.aio.insecure_channel(unix_target(self._socket))
        stub = membership_pb2_grpc.MembershipStub(self._channel)
        # SetLocalState needs a state: keep the one membership has (the edge only adds its material).
        me = (await stub.GetSelf(membership_pb2.GetSelfRequest(), timeout=10)).self.metadata
        state = me.state or membership_pb2.NODE_STATE_BOOTING
        await stub.SetLocalState(
            membership_pb2.SetLocalStateRequest(
                state=state,
                reason=me.state_reason if state == membership_pb2.NODE_STATE_FAULTED else "",
                edge_endpoint=self_endpoint,
                edge_cert_fingerprint=self_fingerprint,
            ),
            timeout=10,
        )
        self._task = asyncio.create_task(self._follow(stub))

    async def _follow(self, stub: object) -> None:
        from swactor.v1 import membership_pb2

        dead = {membership_pb2.MEMBER_STATUS_DEAD, membership_pb2.MEMBER_STATUS_LEFT}
        while True:
            try:
                call = stub.WatchMembers(membership_pb2.WatchMembersRequest(include_snapshot=True))  # type: ignore[attr-defined]
                async for ev in call:
                    md = ev.member.metadata
                    if ev.member.status in dead or not md.edge_endpoint:
                        self._table.remove(md.node_id)
                    else:
                        self._table.put(PeerInfo(md.node_id, md.edge_endpoint, md.edge_cert_fingerprint.lower()))
            except grpc.aio.AioRpcError as e:
                log.warning("edge.membership_watch_failed", code=e.code().name)
            await asyncio.sleep(1.0)

    async def close(self) -> None:
        await cancel_and_wait([self._task])
        if self._channel is not None:
            await self._channel.close()
