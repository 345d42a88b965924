"""QUIC traffic counted per peer since the driver started (GetStatus `traffic`, the hosts' /metrics series).

Each connection counts its own datagrams and bytes as it sends and receives them (an integer add on the hot path,
nothing else) and its QUIC recovery counts the packets it declared lost (quic_conn.py). A connection that goes
away leaves its counts to the ledger under its peer, so each peer's totals only grow while the driver runs,
however often its connections are replaced.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields

from swactor.v1 import edge_pb2


@dataclass
class Traffic:
    sent_bytes: int = 0
    sent_datagrams: int = 0
    received_bytes: int = 0
    received_datagrams: int = 0
    lost_packets: int = 0

    def add(self, other: Traffic) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class TrafficLedger:
    """The counts of the connections that are gone, by peer node id (0: the handshake never named one)."""

    retired: dict[int, Traffic] = field(default_factory=dict)

    def retire(self, peer_node_id: int | None, counts: Traffic) -> None:
        self.retired.setdefault(peer_node_id or 0, Traffic()).add(counts)

    def totals(self, live: Iterable[tuple[int | None, Traffic]]) -> dict[int, Traffic]:
        """Per peer: the gone connections' counts plus those of the `live` ones (peer node id, counts)."""
        out: dict[int, Traffic] = {}
        for peer, counts in [*self.retired.items(), *live]:
            out.setdefault(peer or 0, Traffic()).add(counts)
        return out


def traffic_protos(totals: dict[int, Traffic]) -> list[edge_pb2.PeerTraffic]:
    return [edge_pb2.PeerTraffic(peer_node_id=peer, **vars(t)) for peer, t in sorted(totals.items())]
