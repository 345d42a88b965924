"""Whether the orchestrator's host reaches the endpoints each node advertises: the decisions, no I/O.

A host behind NAT advertises a public address and port for each service (its port map); a wrong map
used to show up only as a timeout deep inside a run. So when the orchestrator first sees a node
Available (and again when its advertised endpoints or its epoch change), it probes them from its own
host (reach_probe.py: the edge endpoint with a QUIC version probe over UDP, the control endpoint with
a TCP connect and the mutual-TLS handshake). Until that probe has answered, and while it names an
endpoint unreachable, the node is not provisionable and its reason says which endpoint, at which
address, failed how: the planner does not place stages there. An unreachable node is probed again
every `retry_s`, a reachable one every `recheck_s` (0: only on a change), so a fixed port map makes
it provisionable again and a broken one is noticed.

`ReachTracker` takes the membership view and the probe results with the current time and returns
the probes to start and the changes to log; `apply` masks the view the planner sees.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from swactor.orchestrator.fleet.nodes import NodeInfo, NodeState

# A probe waits this many measured round trips to the node, if that is longer than the configured timeout.
RTT_FACTOR = 4.0
PENDING = "its advertised endpoints are being checked from the orchestrator's host"


class Endpoint(enum.Enum):
    """An advertised endpoint: its value is the name a reason and the port map use."""

    EDGE = "edge"
    CONTROL = "control"

    @property
    def transport(self) -> str:
        return "UDP, QUIC" if self is Endpoint.EDGE else "TCP, mutual TLS"


class Failure(enum.Enum):
    """How a probe failed; the name is the stable reason logged with `node_endpoint_unreachable`."""

    BAD_ADDRESS = "is not a host:port this host can resolve"
    EDGE_PORT_CLOSED = "got ICMP port unreachable for a version probe (nothing listens there)"
    EDGE_NO_ANSWER = "did not answer a version probe"
    CONTROL_REFUSED = "refused the TCP connection"
    CONTROL_NO_ANSWER = "did not accept a TCP connection"
    CONTROL_TLS = "accepted TCP but did not complete the mutual-TLS handshake as the node"


@dataclass(frozen=True)
class Unreachable:
    endpoint: Endpoint
    address: str
    failure: Failure
    timeout_s: float
    detail: str = ""  # what the socket said, when it said anything

    def text(self) -> str:
        within = f" in {self.timeout_s:g} s" if self.failure in (Failure.EDGE_NO_ANSWER, Failure.CONTROL_NO_ANSWER,
                                                                 Failure.CONTROL_TLS) else ""
        said = f" ({self.detail})" if self.detail else ""
        return (f"{self.endpoint.value} endpoint {self.address} ({self.endpoint.transport}) {self.failure.value} "
                f"from the orchestrator's host{within}{said}: check the port map "
                f"(--advertise-port {self.endpoint.value}=...)")


@dataclass(frozen=True)
class Probe:
    """Probe these endpoints of the node (the shell answers with `ReachTracker.report`)."""

    node_id: int
    edge: str
    control: str
    epoch: int
    timeout_s: float

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.edge, self.control, self.epoch)


@dataclass(frozen=True)
class Changed:
    """A node's reachability changed: `problems` empty = every endpoint answers (again)."""

    node_id: int
    problems: tuple[Unreachable, ...]
    was_unreachable: bool


@dataclass
class _Node:
    key: tuple[str, str, int]
    problems: tuple[Unreachable, ...] | None = None  # None: not probed yet
    in_flight: bool = False
    next_at: float | None = None  # when to probe again (None: not scheduled)


@dataclass(frozen=True)
class ReachConfig:
    timeout_s: float = 3.0
    retry_s: float = 10.0
    recheck_s: float = 60.0
    tries: int = 3  # edge probe datagrams per probe (against loss)

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.retry_s <= 0 or self.recheck_s < 0 or self.tries < 1:
            raise ValueError("reach_timeout_s and reach_retry_s must be > 0, reach_recheck_s >= 0, reach_tries >= 1, "
                             f"got {self.timeout_s}, {self.retry_s}, {self.recheck_s}, {self.tries}")


def probe_timeout(base_s: float, rtt_ms: float | None) -> float:
    """The configured timeout, or RTT_FACTOR measured round trips when that is longer."""
    return base_s if rtt_ms is None else max(base_s, RTT_FACTOR * rtt_ms / 1000)


def _sig(problems: tuple[Unreachable, ...] | None) -> frozenset | None:
    """What a verdict says, without the socket's words (which may differ from one probe to the next)."""
    return None if problems is None else frozenset((p.endpoint, p.address, p.failure) for p in problems)


def _key(m: NodeInfo) -> tuple[str, str, int]:
    return (m.edge_endpoint, m.control_endpoint, m.epoch)


@dataclass
class ReachTracker:
    config: ReachConfig = field(default_factory=ReachConfig)
    # Round trips from the orchestrator's host to each node (node id -> ms), when membership measured them.
    rtt_ms: Mapping[int, float] = field(default_factory=dict)
    _nodes: dict[int, _Node] = field(default_factory=dict)

    def observe(self, view: tuple[NodeInfo, ...], now: float) -> list[Probe]:
        """A new membership view: the probes to start (nodes newly Available, or advertising other endpoints)."""
        out = []
        seen = set()
        for m in view:
            if m.state is NodeState.LEFT:
                continue
            seen.add(m.node_id)
            if m.state is not NodeState.AVAILABLE or not m.edge_endpoint or not m.control_endpoint:
                continue  # judged once it is Available with its endpoints; an earlier verdict stands meanwhile
            n = self._nodes.get(m.node_id)
            if n is not None and n.key == _key(m):
                continue
            self._nodes[m.node_id] = n = _Node(_key(m))
            out.append(self._start(m.node_id, n))
        for node_id in set(self._nodes) - seen:
            del self._nodes[node_id]  # gone or left: judged afresh if it comes back
        return out

    def report(self, probe: Probe, problems: tuple[Unreachable, ...], now: float) -> Changed | None:
        """A probe's result; the change to log, if its reachability changed. A result for endpoints the node
        no longer advertises is ignored (the probe of the new ones is under way)."""
        n = self._nodes.get(probe.node_id)
        if n is None or n.key != probe.key:
            return None
        before = n.problems
        n.problems, n.in_flight = problems, False
        if problems:
            n.next_at = now + self.config.retry_s
        else:
            n.next_at = now + self.config.recheck_s if self.config.recheck_s else None
        if _sig(before) == _sig(problems) or (before is None and not problems):
            return None  # unchanged, or reachable at first sight (nothing to tell)
        return Changed(probe.node_id, problems, was_unreachable=bool(before))

    def due(self, now: float) -> list[Probe]:
        """The re-probes whose time has come."""
        return [self._start(node_id, n) for node_id, n in sorted(self._nodes.items())
                if not n.in_flight and n.next_at is not None and n.next_at <= now]

    def deadline(self) -> float | None:
        """When `due` next has something (None: nothing scheduled)."""
        times = [n.next_at for n in self._nodes.values() if not n.in_flight and n.next_at is not None]
        return min(times, default=None)

    def verdict(self, node_id: int) -> str:
        """Why the node is not provisionable for want of reachability ("" when every endpoint answered)."""
        n = self._nodes.get(node_id)
        if n is None:
            return ""
        if n.problems is None:
            return PENDING
        return "; ".join(p.text() for p in n.problems)

    def apply(self, view: tuple[NodeInfo, ...]) -> tuple[NodeInfo, ...]:
        """The view with every node the orchestrator cannot (yet) reach marked unreachable, and why."""
        out = []
        for m in view:
            why = self.verdict(m.node_id) if m.state is NodeState.AVAILABLE and _key(m) == self._key_of(m) else ""
            out.append(dataclasses.replace(m, unreachable=why, reason=why or m.reason) if why else m)
        return tuple(out)

    def _key_of(self, m: NodeInfo) -> tuple[str, str, int] | None:
        n = self._nodes.get(m.node_id)
        return n.key if n is not None else None

    def _start(self, node_id: int, n: _Node) -> Probe:
        n.in_flight, n.next_at = True, None
        edge, control, epoch = n.key
        return Probe(node_id, edge, control, epoch, probe_timeout(self.config.timeout_s, self.rtt_ms.get(node_id)))
