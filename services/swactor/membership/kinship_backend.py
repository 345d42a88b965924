"""SwimBackend on PyPI `kinship`: SWIM + Lifeguard + XChaCha20-Poly1305 on its own Rust thread.

The protocol never runs on our event loop, so a blocked loop or a long GIL hold in this process
cannot make this node miss probes. Chosen by measurement over writing our own: see
docs/membership.md.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import fields

import kinship

from swactor.common.events import get_logger
from swactor.membership.swim import (
    JoinFailed,
    Liveness,
    MessageFailed,
    SwimCounters,
    SwimEvent,
    SwimEventKind,
    SwimMember,
    SwimSettings,
    SwimStartError,
)

_LIVENESS = {
    kinship.State.ALIVE: Liveness.ALIVE,
    kinship.State.SUSPECT: Liveness.SUSPECT,
    kinship.State.DEAD: Liveness.DEAD,
    kinship.State.LEFT: Liveness.LEFT,
}
_KINDS: dict[type, SwimEventKind] = {
    kinship.MemberJoined: SwimEventKind.JOINED,
    kinship.MemberSuspect: SwimEventKind.SUSPECT,
    kinship.MemberRecovered: SwimEventKind.RECOVERED,
    kinship.MemberDead: SwimEventKind.DEAD,
    kinship.MemberLeft: SwimEventKind.LEFT,
    kinship.MemberUpdated: SwimEventKind.UPDATED,
}


def _member(m: kinship.Member) -> SwimMember:
    return SwimMember(m.name, m.addr, _LIVENESS[m.state], m.incarnation, dict(m.meta), m.epoch)


def kinship_config(s: SwimSettings) -> kinship.Config:
    return kinship.Config.lan(
        name=s.name,
        bind=s.bind,
        advertise=s.advertise,
        seeds=list(s.seeds),
        cluster=s.cluster,
        keys=[base64.b64encode(s.key).decode()],
        meta=dict(s.meta),
        probe_interval=s.probe_interval_s,
        probe_timeout=s.probe_timeout_s,
        indirect_checks=s.indirect_checks,
        suspicion_mult=s.suspicion_mult,
        suspicion_max_mult=s.suspicion_max_mult,
        expected_confirmations=s.expected_confirmations,
        awareness_max=s.awareness_max,
        gossip_interval=s.gossip_interval_s,
        gossip_nodes=s.gossip_nodes,
        retransmit_mult=s.retransmit_mult,
        push_pull_interval=s.push_pull_interval_s,
    )


async def _translate(stream: kinship.EventStream) -> AsyncIterator[SwimEvent]:
    async for ev in stream:
        if isinstance(ev, kinship.EventsLost):
            yield SwimEvent(SwimEventKind.RESYNC)
            continue
        if isinstance(ev, kinship.UserMessage):
            yield SwimEvent(SwimEventKind.MESSAGE, _member(ev.sender), bytes(ev.data))
            continue
        kind = _KINDS.get(type(ev))
        member = getattr(ev, "member", None)
        if kind is not None and member is not None:
            yield SwimEvent(kind, _member(member))


class KinshipBackend:
    def __init__(self, settings: SwimSettings) -> None:
        self._cfg = kinship_config(settings)
        self._cluster = kinship.Cluster(self._cfg)

    async def start(self) -> None:
        try:
            await self._cluster.start()
        except OSError as e:
            raise SwimStartError(f"cannot bind the gossip socket {self._cfg.bind}: {e.strerror or e}") from None
        except kinship.KinshipError as e:  # e.g. no seed name resolved within resolve_timeout
            raise SwimStartError(f"gossip engine did not start: {e}") from None

    async def join(self, seeds: list[str]) -> int:
        try:
            return await self._cluster.join(seeds)
        except kinship.JoinError as e:
            raise JoinFailed(str(e)) from None

    def local(self) -> SwimMember:
        return _member(self._cluster.local)

    def members(self) -> list[SwimMember]:
        return [_member(m) for m in self._cluster.members()]

    def member(self, name: str) -> SwimMember | None:
        m = self._cluster.member(name)
        return None if m is None else _member(m)

    def events(self) -> AsyncIterator[SwimEvent]:
        return _translate(self._cluster.events())  # the subscription starts here, not at first read

    async def set_meta(self, meta: Mapping[str, str]) -> None:
        await self._cluster.set_meta(dict(meta))

    async def send(self, name: str, data: bytes) -> None:
        try:
            await self._cluster.send(name, data)
        except kinship.KinshipError as e:  # NotAMember, MessageTooLarge, KinshipClosed
            raise MessageFailed(f"message to {name}: {e!r}") from None

    async def broadcast(self, data: bytes) -> None:
        try:
            await self._cluster.broadcast(data)
        except kinship.KinshipError as e:
            raise MessageFailed(f"broadcast: {e!r}") from None

    def counters(self) -> SwimCounters:
        st = self._cluster.stats()  # kinship names each of its counters as SwimCounters does
        return SwimCounters(**{f.name: getattr(st, f.name) for f in fields(SwimCounters)})

    async def leave(self, timeout_s: float) -> None:
        await self._cluster.leave(timeout_s)

    async def close(self) -> None:
        await self._cluster.close()


class _ToEvents(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        get_logger(component="membership").log(
            record.levelno, "swim_engine_log", engine="kinship", message=record.getMessage()
        )


def route_engine_logs(level: int = logging.WARNING) -> None:
    """Send the engine's own (Rust) log lines into our JSON events instead of raw stderr text."""
    logger = logging.getLogger("kinship")
    logger.setLevel(level)
    logger.propagate = False
    if not any(isinstance(h, _ToEvents) for h in logger.handlers):
        logger.addHandler(_ToEvents())
    kinship.log_to_python(level)
